"""Tiny Qwen-VL models in fp64 end to end and per-sample references for the shared-prefix VLM tests
(tests/test_shared_prefix_vlm*.py). The models and samples are ``vlm_helpers``' (built offline)."""
from __future__ import annotations

import numpy as np
import torch

from shared_prefix_models import _rmsnorm_in_input_dtype
from vlm_helpers import make_sample

PROMPT_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def fp64_vlm_norms(monkeypatch):
    """RMSNorm in the input dtype in the text and vision blocks (transformers computes it in fp32: REFERENCE §12)."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
    from transformers.models.qwen2_vl import modeling_qwen2_vl
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    for cls in (modeling_qwen2_vl.Qwen2VLRMSNorm, modeling_qwen2_5_vl.Qwen2_5_VLRMSNorm,
                modeling_qwen3_vl.Qwen3VLTextRMSNorm):
        monkeypatch.setattr(cls, "forward", _rmsnorm_in_input_dtype)


def vlm_groups(family: str, seed: int = 0, sizes=(3, 1, 2, 2)):
    """Four groups: one image; text only (a plain token list); two images and a video; an image at the prompt's
    very start. Completions of 0-7 tokens (one empty, G = 1 included)."""
    rng = np.random.default_rng(seed)
    prompts = [make_sample(rng, [("text", 3), ("image", (4, 4)), ("text", 4)], family),
               rng.integers(1, 80, 5).tolist(),
               make_sample(rng, [("text", 2), ("image", (2, 4)), ("text", 1), ("image", (4, 2)), ("video", (2, 4, 4)),
                                 ("text", 2)], family),
               make_sample(rng, [("image", (2, 2)), ("text", 3)], family)]
    completions = [[rng.integers(1, 80, int(rng.integers(0, 8))).tolist() for _ in range(g)] for g in sizes]
    completions[0][1] = []
    return prompts, completions


def per_sample_logprobs(model, prompts, completions):
    """Each prompt + completion alone, HF's own positions (``get_rope_index``): the completion's log-probs (a list in
    group order; an empty completion gives an empty tensor)."""
    out = []
    for p, group in zip(prompts, completions):
        ids = p["input_ids"] if isinstance(p, dict) else p
        for c in group:
            seq = torch.tensor([list(ids) + list(c)])
            inputs = {"input_ids": seq}
            if isinstance(p, dict):
                inputs.update({k: v for k, v in p.items() if k in PROMPT_FIELDS})
                inputs["mm_token_type_ids"] = torch.tensor([list(p["mm_token_type_ids"]) + [0] * len(c)])
            logits = model(**inputs, use_cache=False).logits[0]
            logp = torch.log_softmax(logits[:-1], -1).gather(1, seq[0, 1:, None])[:, 0]
            out.append(logp[len(ids) - 1:])
    return out


def worst_rel(result, reference) -> float:
    err = 0.0
    for s, ref in enumerate(reference):
        got = result.per_sequence[s]
        assert got.shape == ref.shape and bool(result.mask[s, :len(ref)].all())
        if len(ref):
            err = max(err, float((got - ref).detach().abs().max()) / float(ref.detach().abs().max()))
    return err


def grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def worst_grad(got: dict, ref: dict) -> tuple:
    assert got.keys() == ref.keys()
    return max((float((got[n] - g).abs().max()) / max(float(g.abs().max()), 1e-30), n) for n, g in ref.items())


def shared(model, prompts, completions, path="varlen", **kw):
    """The packed run: the whole model set to the shared-prefix attention (the vision tower keeps SDPA)."""
    from packkit import shared_prefix as sp

    model.set_attn_implementation(sp.register_attention())
    batch, info = sp.pack_groups(prompts, completions, mrope=model.config, attention=path, **kw)
    return sp.completion_logprobs(model(**batch, use_cache=False).logits, info), batch, info
