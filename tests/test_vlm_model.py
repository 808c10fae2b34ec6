"""Proof on real HF vision-language models: a packed multimodal batch gives the loss and every parameter
gradient of running each sample alone (averaged per token).

Tiny random-init Qwen2.5-VL and Qwen3-VL (fp64, no download), SDPA and eager attention, called with
``use_cache=False``. The control test shows the gradient check catches wrong positions: with the mRoPE
rows replaced by text positions the gradients differ.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packkit

pytest.importorskip("transformers")
from vlm_helpers import tiny_model, make_sample  # noqa: E402

pytestmark = [pytest.mark.core, pytest.mark.exactness]

CAPACITY = 64
VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def samples(family, seed=0):
    """8 samples: text-only, one image, two images, a video, text around them, one of exactly CAPACITY."""
    rng = np.random.default_rng(seed)
    specs = [
        [("text", 9)],
        [("text", 4), ("image", (4, 4)), ("text", 6)],
        [("text", 3), ("image", (2, 4)), ("text", 2), ("image", (4, 2)), ("text", 5)],
        [("text", 2), ("video", (2, 4, 4)), ("text", 7)],
        [("text", 2)],
        [("image", (2, 2)), ("text", 12)],
        [("text", 5), ("video", (2, 2, 4)), ("image", (2, 2)), ("text", 3)],
    ]
    out = [make_sample(rng, s, family) for s in specs]
    full = make_sample(rng, [("text", 3), ("image", (4, 4)), ("text", 3)], family)
    fill = CAPACITY - len(full["input_ids"])
    full["input_ids"] += rng.integers(1, 80, fill).tolist()
    full["mm_token_type_ids"] += [0] * fill
    out.append(full)
    assert len(out[-1]["input_ids"]) == CAPACITY
    return out


def model_inputs(sample):
    return {k: v for k, v in sample.items() if k in ("input_ids", "mm_token_type_ids") + VISION_KEYS}


def loss_and_grads(model, run):
    model.zero_grad(set_to_none=True)
    loss = run()
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def per_sample_reference(model, feats):
    def run():
        total, count = 0.0, 0
        for f in feats:
            inputs = {k: (torch.tensor([v]) if k in ("input_ids", "mm_token_type_ids") else v)
                      for k, v in model_inputs(f).items()}
            out = model(**inputs, labels=inputs["input_ids"], use_cache=False)
            n = len(f["input_ids"]) - 1
            total, count = total + out.loss * n, count + n
        return total / count
    return loss_and_grads(model, run)


def packed_run(model, batch):
    """The whole collator batch, as a Trainer passes it (cu_seq_lens, seq_idx, ... included)."""
    return loss_and_grads(model, lambda: model(**batch, use_cache=False).loss)


def max_rel(a, b):
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)


def check_equal(ref, got, rel=1e-6):
    (ref_loss, ref_grads), (loss, grads) = ref, got
    assert max_rel(loss, ref_loss) <= rel, (float(loss), float(ref_loss))
    assert ref_grads.keys() == grads.keys()
    worst = max((max_rel(grads[n], ref_grads[n]), n) for n in ref_grads)
    assert worst[0] <= rel, worst


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def family(request):
    return request.param


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_multimodal_loss_and_gradients_equal_per_sample(family, attn):
    model = tiny_model(family, attn)
    feats = samples(family)
    ref = per_sample_reference(model, feats)
    flat = packkit.PackingCollator(mrope=model.config)(feats)
    assert flat["position_ids"].shape == (4, 1, flat["input_ids"].shape[1])
    check_equal(ref, packed_run(model, flat))
    padded = packkit.PackingCollator(CAPACITY, layout="padded", mrope=model.config)(feats)
    rows = padded["input_ids"].shape[0]
    padded = packkit.PackingCollator(CAPACITY, layout="padded", num_rows=rows + 2, mrope=model.config)(feats)
    assert padded["position_ids"].shape == (4, rows + 2, CAPACITY)
    check_equal(ref, packed_run(model, padded))


def test_text_positions_instead_of_mrope_change_the_gradients(family):
    """Control: the check above can fail. With rows 1-3 = text positions the loss barely moves on a tiny
    model but the gradients differ far beyond the tolerance."""
    model = tiny_model(family, "sdpa")
    feats = samples(family)
    ref = per_sample_reference(model, feats)
    batch = packkit.PackingCollator(CAPACITY, layout="padded", mrope=model.config)(feats)
    wrong = dict(batch, position_ids=batch["position_ids"][:1].expand(4, -1, -1).contiguous())
    assert not torch.equal(wrong["position_ids"], batch["position_ids"])
    with pytest.raises(AssertionError):
        check_equal(ref, packed_run(model, wrong))
    check_equal(ref, packed_run(model, batch))
