"""Tiny random-init Gemma 2 (attention logit soft-capping) and GPT-OSS (attention sinks) models in fp64, and an
exact fp64 per-sample reference attention, for tests/test_shared_prefix_model.py and tests/test_attention_args.py.

transformers' SDPA implements neither soft-capping nor sinks (Gemma 2 and GPT-OSS declare ``_supports_sdpa =
False``), and Gemma 2's eager softmax runs in fp32 (~1e-8), so the per-sample reference is :func:`reference_attention`:
transformers' eager definition written out in the input dtype (causal, sliding window ``q - k < w``, soft-cap,
sinks). ``test_reference_attention_is_transformers_eager`` checks it against transformers' own eager.
"""
from __future__ import annotations

import torch

from shared_prefix_models import VOCAB, _rmsnorm_in_input_dtype

REFERENCE = "packkit_test_fp64_reference"


def reference_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                        softcap=None, s_aux=None, **kwargs):
    """One unpacked sequence per row, no padding: [B, H, S, D] -> ([B, S, H, D], None), exact in the input dtype."""
    assert attention_mask is None and not dropout
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    s = query.shape[-2]
    q, k = torch.arange(s)[:, None], torch.arange(s)[None, :]
    visible = k <= q
    if sliding_window is not None:
        visible &= q - k < sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    if s_aux is not None:  # the sink joins the softmax as one more column and is dropped after it
        sinks = s_aux.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


def register_reference() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(REFERENCE, reference_attention)
    return REFERENCE


def _gemma2_norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def fp64_norms(monkeypatch):
    """Gemma 2's and GPT-OSS's RMSNorm compute in fp32 even in an fp64 model: make them compute in the input dtype."""
    from transformers.models.gemma2 import modeling_gemma2
    from transformers.models.gpt_oss import modeling_gpt_oss

    monkeypatch.setattr(modeling_gemma2.Gemma2RMSNorm, "forward", _gemma2_norm)
    monkeypatch.setattr(modeling_gpt_oss.GptOssRMSNorm, "forward", _rmsnorm_in_input_dtype)


def tiny(kind: str, attn: str = REFERENCE, **overrides):
    """``kind``: "gemma2" (attn_logit_softcapping 1.0 over scores of several units, query_pre_attn_scalar 16,
    sliding and full layers) or
    "gpt_oss" (sinks drawn N(0, 1), sliding and full layers, 4 experts). Windows default to 64 (longer than any
    test's tree path, so they have no effect)."""
    import transformers

    register_reference()
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=128, use_cache=False, sliding_window=64)
    if kind == "gemma2":
        config = transformers.Gemma2Config(**{**common, "attn_logit_softcapping": 1.0, "query_pre_attn_scalar": 16,
                                              "final_logit_softcapping": None, **overrides})
        model = transformers.Gemma2ForCausalLM(config)
        with torch.no_grad():  # scores of several units, so that the soft-cap of 1.0 bends them
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(12)
                layer.self_attn.k_proj.weight.mul_(12)
    elif kind == "gpt_oss":
        config = transformers.GptOssConfig(**{**common, "max_position_embeddings": 131072, "num_local_experts": 4,
                                              "num_experts_per_tok": 2, "experts_implementation": "eager", **overrides})
        model = transformers.GptOssForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    else:
        raise ValueError(kind)
    model.set_attn_implementation(attn)
    return model.to(torch.float64)
