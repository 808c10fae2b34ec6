"""Vision-language GRPO groups through ``pack_groups(..., mrope=model.config)`` are exact on real HF models: tiny
random-init Qwen2-VL, Qwen2.5-VL and Qwen3-VL (deepstack), fp64 end to end. Per-token completion log-probs equal
each prompt + completion run alone with HF's own position computation (rel <= 1e-10); GRPO token-mean and DPO
losses give the same gradients for every parameter, the vision tower's included (rel <= 1e-9:
tests/test_shared_prefix_vlm_grads.py). Controls that must fail: completion text positions restarting after the
prompt's length (instead of the walk's next position), and images dropped from a split sub-group.
"""
from __future__ import annotations

import pytest
import torch

from packkit import shared_prefix as sp

pytest.importorskip("transformers")
from shared_prefix_vlm_helpers import fp64_vlm_norms, per_sample_logprobs, shared, vlm_groups, worst_rel  # noqa: E402
from vlm_helpers import tiny_model  # noqa: E402

pytestmark = [pytest.mark.core, pytest.mark.exactness]

REL_LOGP = 1e-10


@pytest.fixture(autouse=True)
def _fp64(monkeypatch):
    fp64_vlm_norms(monkeypatch)


@pytest.mark.parametrize("family, path", [("qwen2_5_vl", "dense"), ("qwen2_5_vl", "varlen"), ("qwen3_vl", "varlen"),
                                          ("qwen2_vl", "varlen")])
def test_completion_logprobs_equal_per_sample(family, path):
    model = tiny_model(family)
    prompts, completions = vlm_groups(family)
    with torch.no_grad():
        reference = per_sample_logprobs(model, prompts, completions)
        result, batch, info = shared(model, prompts, completions, path)
    assert worst_rel(result, reference) <= REL_LOGP
    v = info.vision
    # Each prompt image / video encoded once: 4 images, 1 video (vs x G per completion).
    assert (v.images_forwarded, v.videos_forwarded, v.copied_images) == (4, 1, 0)
    assert v.image_groups.tolist() == [0, 2, 2, 3] and v.video_groups.tolist() == [2]
    assert v.images_unshared == 3 * 1 + 2 * 2 + 2 * 1 and v.videos_unshared == 2
    assert batch["image_grid_thw"].shape == (4, 3) and batch["position_ids"].shape == (4, *batch["input_ids"].shape)
    assert int((batch["mm_token_type_ids"] > 0).sum()) == v.visual_tokens_forwarded


def _split_case():
    prompts, completions = vlm_groups("qwen2_5_vl", seed=3, sizes=(4, 1, 2, 1))
    completions[0] = [[11] * 9, [12] * 8, [13] * 9, [14] * 6]  # group 0: 13-token prompt (+ 4 image tokens)
    return prompts, completions


def test_capacity_split_recarries_prompt_and_images():
    model = tiny_model("qwen2_5_vl")
    prompts, completions = _split_case()
    with torch.no_grad():
        reference = per_sample_logprobs(model, prompts, completions)
        result, batch, info = shared(model, prompts, completions, capacity=40)
    assert info.plan.report.split_groups == {0: 2}
    assert info.vision.copied_images == 1 and info.vision.image_groups.tolist().count(0) == 2
    assert batch["image_grid_thw"].shape[0] == info.vision.images_forwarded == 5
    assert worst_rel(result, reference) <= REL_LOGP


def test_control_images_dropped_from_a_split_subgroup_fail(monkeypatch):
    """The bug: a split sub-group re-carries the prompt tokens but not its image. The model then has more image
    tokens than features; transformers refuses the batch (no silent result either way)."""
    from packkit.shared_prefix import vision

    model = tiny_model("qwen2_5_vl")
    prompts, completions = _split_case()
    original = vision.vision_batch

    def drop_copies(vp, *args, **kw):
        out, report = original(vp, *args, **kw)
        grid = out["image_grid_thw"]
        first = report.image_groups.tolist().index(0)
        again = report.image_groups.tolist().index(0, first + 1)
        rows = grid.prod(-1)
        start = int(rows[:again].sum())
        keep = torch.ones(len(out["pixel_values"]), dtype=torch.bool)
        keep[start:start + int(rows[again])] = False
        out["pixel_values"] = out["pixel_values"][keep]
        out["image_grid_thw"] = torch.cat([grid[:again], grid[again + 1:]])
        return out, report

    monkeypatch.setattr(vision, "vision_batch", drop_copies)
    from packkit.shared_prefix import pack
    monkeypatch.setattr(pack, "vision_batch", drop_copies)
    with torch.no_grad(), pytest.raises(ValueError, match="[Ii]mage features and image tokens do not match"):
        shared(model, prompts, completions, capacity=40)


def test_control_completion_positions_from_prompt_length_fail():
    """The bug: a completion's mRoPE rows continue from the prompt's token count instead of the walk's next
    position (an image of 4x4 merged tokens advances the walk by 4, not 16)."""
    model = tiny_model("qwen2_5_vl")
    prompts, completions = vlm_groups("qwen2_5_vl")
    with torch.no_grad():
        reference = per_sample_logprobs(model, prompts, completions)
        model.set_attn_implementation(sp.register_attention())
        batch, info = sp.pack_groups(prompts, completions, mrope=model.config)
        pos = batch["position_ids"].clone()
        lay = info.layout
        for p in range(len(lay.order)):
            if lay.depth[p] == 1:  # completions: text positions = prompt length + j on all axes
                sl = slice(int(lay.dst[p]), int(lay.dst[p] + lay.length[p]))
                pos[1:, 0, sl] = pos[0, 0, sl]
        assert not torch.equal(pos, batch["position_ids"])
        attn = batch["shared_prefix"]
        bad = sp.SharedPrefixAttention(lay, attn.subtree_end, attn.cu_seqlens, attn.node_idx, "varlen",
                                       position_ids=pos[0])
        logits = model(**{**batch, "position_ids": pos, "shared_prefix": bad}, use_cache=False).logits
        assert worst_rel(sp.completion_logprobs(logits, info._replace(attention=bad)), reference) > 1e-6  # >> 1e-10
        logits = model(**batch, use_cache=False).logits
        assert worst_rel(sp.completion_logprobs(logits, info), reference) <= REL_LOGP


def test_vision_tower_keeps_its_attention():
    """``model.set_attn_implementation(name)`` on the whole model reaches the vision tower's sub-config too: its
    calls run SDPA (as by default), so the logits equal those of setting only the text model, and the shared-prefix
    attention is called once per text layer only."""
    model = tiny_model("qwen3_vl")
    prompts, completions = vlm_groups("qwen3_vl")
    name = sp.register_attention()
    with torch.no_grad():
        model.set_attn_implementation({"text_config": name})
        assert model.config.vision_config._attn_implementation == "sdpa"
        batch, info = sp.pack_groups(prompts, completions, mrope=model.config)
        text_only = model(**batch, use_cache=False).logits
        assert batch["shared_prefix"].calls == model.config.text_config.num_hidden_layers
        model.set_attn_implementation(name)
        assert model.config.vision_config._attn_implementation == name
        batch, info = sp.pack_groups(prompts, completions, mrope=model.config)
        whole = model(**batch, use_cache=False).logits
        assert batch["shared_prefix"].calls == model.config.text_config.num_hidden_layers
    assert torch.equal(whole, text_only)
