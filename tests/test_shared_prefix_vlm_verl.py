"""verl's Qwen-VL GRPO rollouts (``multi_modal_inputs`` per row, ``position_ids`` ``[B, 3, S]`` / ``[B, 4, S]`` from
the model's ``get_rope_index``) through ``pack_rollout_groups`` and ``integrations.verl_shared_prefix``: each uid's
images once, response log-probs equal per-row runs (Qwen2.5-VL and Qwen3-VL, fp64, rel <= 1e-10); rows of one uid
with different pixels are flagged on the device (``info.status`` bit 8), not synced."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from packkit import shared_prefix as sp
from packkit.integrations.verl_shared_prefix import shared_prefix_log_probs

pytest.importorskip("transformers")
from shared_prefix_vlm_helpers import PROMPT_FIELDS, fp64_vlm_norms  # noqa: E402
from vlm_helpers import make_sample, tiny_model  # noqa: E402

pytestmark = pytest.mark.full

PROMPT, RESPONSE = 16, 6


@pytest.fixture(autouse=True)
def _fp64(monkeypatch):
    fp64_vlm_norms(monkeypatch)


def rollouts(model, rows_per_uid=(3, 2, 2), four=True, seed=0, family="qwen2_5_vl"):
    """verl's layout: left-padded prompt, right-padded response; position_ids from the model's get_rope_index on each
    row's valid tokens; uids interleaved."""
    rng = np.random.default_rng(seed)
    ids, masks, pos, mm, uids = [], [], [], [], []
    specs = [[("text", 2), ("image", (4, 4)), ("text", 3)], [("text", 5)], [("image", (2, 4)), ("text", 4)]]
    for u, g in enumerate(rows_per_uid):
        sample = make_sample(rng, specs[u], family)
        p = len(sample["input_ids"])
        for _ in range(g):
            r = int(rng.integers(0, RESPONSE + 1))
            valid = sample["input_ids"] + rng.integers(1, 80, r).tolist()
            row = torch.zeros(PROMPT + RESPONSE, dtype=torch.int64)
            row[PROMPT - p:PROMPT + r] = torch.tensor(valid)
            mask = torch.zeros_like(row)
            mask[PROMPT - p:PROMPT + r] = 1
            types = torch.tensor([sample["mm_token_type_ids"] + [0] * r])
            grids = {k: sample.get(k) for k in ("image_grid_thw", "video_grid_thw")}
            rope, _ = model.model.get_rope_index(torch.tensor([valid]), types, image_grid_thw=grids["image_grid_thw"],
                                                 video_grid_thw=grids["video_grid_thw"])
            full = torch.zeros(4, PROMPT + RESPONSE, dtype=torch.int64)
            full[0, PROMPT - p:PROMPT + r] = torch.arange(p + r)
            full[1:, PROMPT - p:PROMPT + r] = rope[:, 0]
            ids.append(row)
            masks.append(mask)
            pos.append(full if four else full[1:])
            mm.append({k: v for k, v in sample.items() if k in PROMPT_FIELDS} or None)
            uids.append(f"uid-{u}")
    perm = torch.from_numpy(rng.permutation(len(ids)))
    mmi = np.empty(len(ids), dtype=object)
    mmi[:] = [mm[i] for i in perm.tolist()]
    return (torch.stack(ids)[perm], torch.stack(masks)[perm], torch.stack(pos)[perm], mmi,
            np.array(uids, dtype=object)[perm.numpy()])


def per_row(model, ids, mask, mmi):
    out = torch.zeros(ids.shape[0], RESPONSE, dtype=torch.float64)
    for b in range(ids.shape[0]):
        cols = torch.nonzero(mask[b]).flatten()
        seq = ids[b, cols].unsqueeze(0)
        extra = dict(mmi[b] or {})
        extra["mm_token_type_ids"] = ((seq == 90).to(torch.int64))
        logits = model(input_ids=seq, use_cache=False, **extra).logits[0]
        logp = torch.log_softmax(logits[:-1], -1).gather(1, seq[0, 1:, None])[:, 0]
        full = torch.zeros(PROMPT + RESPONSE, dtype=torch.float64)
        full[cols[1:]] = logp
        out[b] = full[PROMPT:]
    return out


@pytest.mark.parametrize("family, four", [("qwen2_5_vl", True), ("qwen2_5_vl", False), ("qwen3_vl", True)])
def test_verl_vlm_rollouts_equal_per_row(family, four):
    model = tiny_model(family)
    ids, mask, pos, mmi, uids = rollouts(model, four=four, family=family)
    with torch.no_grad():
        ref = per_row(model, ids, mask, mmi)
        batch, info = sp.pack_rollout_groups(ids, mask, uids, np.arange(len(ids)), prompt_length=PROMPT,
                                             position_ids=pos, multi_modal_inputs=mmi, mrope=model.config)
        assert int(info.status) == 0
        v = info.info.vision
        assert (v.images_forwarded, v.images_unshared) == (2, 5) and batch["image_grid_thw"].shape == (2, 3)
        micro = {"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:], "position_ids": pos,
                 "multi_modal_inputs": mmi}
        _, logp = shared_prefix_log_probs(model, micro, uids, check=True)
    resp = mask[:, PROMPT:].to(torch.float64)
    assert float((logp - ref * resp).abs().max()) <= 1e-10 * float(ref.abs().max())


def test_differing_pixels_in_one_uid_are_flagged_on_the_device():
    model = tiny_model("qwen2_5_vl")
    ids, mask, pos, mmi, uids = rollouts(model)
    rows = [i for i in range(len(uids)) if uids[i] == "uid-0"]
    mmi[rows[-1]] = {**mmi[rows[-1]], "pixel_values": mmi[rows[-1]]["pixel_values"] + 1e-3}
    batch, info = sp.pack_rollout_groups(ids, mask, uids, np.arange(len(ids)), prompt_length=PROMPT,
                                         position_ids=pos, multi_modal_inputs=mmi, mrope=model.config)
    assert isinstance(info.status, torch.Tensor) and int(info.status) & 8
    with pytest.raises(ValueError, match="vision inputs .* differ"):
        sp.check_rollout_groups(info)
    micro = {"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:], "position_ids": pos,
             "multi_modal_inputs": mmi}
    with torch.no_grad(), pytest.raises(ValueError, match="vision inputs .* differ"):
        shared_prefix_log_probs(model, micro, uids, check=True)
    shapes = dict(mmi[rows[-1]])
    shapes["pixel_values"] = shapes["pixel_values"][:-2]
    mmi[rows[-1]] = shapes
    with pytest.raises(ValueError, match="share a uid but their multi_modal_inputs differ"):
        sp.pack_rollout_groups(ids, mask, uids, np.arange(len(ids)), prompt_length=PROMPT, position_ids=pos,
                               multi_modal_inputs=mmi, mrope=model.config)
    with pytest.raises(ValueError, match="need position_ids, multi_modal_inputs and mrope together"):
        sp.pack_rollout_groups(ids, mask, uids, np.arange(len(ids)), prompt_length=PROMPT, multi_modal_inputs=mmi)
    with pytest.raises(ValueError, match=r"position_ids must be verl's Qwen-VL \[B, 3, S\]"):
        sp.pack_rollout_groups(ids, mask, uids, np.arange(len(ids)), prompt_length=PROMPT, position_ids=pos[:, :2],
                               multi_modal_inputs=mmi, mrope=model.config)
