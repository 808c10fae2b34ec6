"""Varlen attention for HF models, fed the ``cu_seq_lens_*`` / ``max_length_*`` of a packkit batch.

torch (>= 2.10) ships ``torch.nn.attention.varlen.varlen_attn``: FlashAttention over packed tokens,
one document per ``cu_seqlens`` segment, with no mask tensor and no flash-attn package. transformers
has no attention implementation that calls it; this module adds one::

    name = packkit.register_varlen_attention()            # "packkit_varlen"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)
    batch = packkit.PackingCollator(4096)(features)       # flat or padded, on the GPU
    model(**batch, use_cache=False).loss

The model passes the batch's ``cu_seq_lens_q`` / ``max_length_q`` (which the collator returns) through
to every attention layer. ``varlen_attn`` needs CUDA tensors in fp16 or bf16.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch

NAME = "packkit_varlen"


def _varlen_kernel():
    """torch's varlen_attn as f(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise RuntimeError(f"varlen attention needs torch >= 2.10 (torch.nn.attention.varlen); this is torch "
                           f"{torch.__version__}") from exc
    params = inspect.signature(varlen_attn).parameters

    def run(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
        if q.device.type != "cuda":
            raise ValueError(f"varlen attention runs on CUDA tensors only (FlashAttention); got {q.device}. "
                             "Use attn_implementation='sdpa' on the CPU")
        # torch 2.10 takes is_causal; later versions a (left, right) window, (-1, 0) being causal.
        mode = {"is_causal": causal} if "is_causal" in params else {"window_size": (-1, 0) if causal else (-1, -1)}
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, **mode)
    return run


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                             scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                             cu_seq_lens_q: Optional[torch.Tensor] = None, cu_seq_lens_k: Optional[torch.Tensor] = None,
                             max_length_q: Optional[int] = None, max_length_k: Optional[int] = None, **kwargs):
    """An HF attention function (``AttentionInterface``): query ``[B, H, S, D]``, key/value
    ``[B, H_kv, S, D]``; returns ``([B, S, H, D], None)``. The ``B * S`` tokens are one packed stream
    cut by ``cu_seq_lens_q`` (a packkit batch, flat or padded: padding is its own segment)."""
    if cu_seq_lens_q is None or max_length_q is None:
        raise ValueError("varlen attention needs the batch's cu_seq_lens_q and max_length_q (a packkit "
                         "PackingCollator / pack_sequences batch passed to the model as **batch)")
    if attention_mask is not None:
        raise ValueError("varlen attention takes no attention_mask: documents are cut by cu_seq_lens_q; "
                         "drop the mask (a packkit batch has none unless return_block_mask=True)")
    if dropout:
        raise ValueError(f"varlen attention has no attention dropout; got dropout={dropout} (set the model "
                         "config's attention_dropout to 0)")
    cu_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    max_k = max_length_q if max_length_k is None else max_length_k
    batch, heads, length, dim = query.shape
    # [B, H, S, D] -> [B*S, H, D]: the packed token order the cu_seqlens index.
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)
    k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(batch * length, value.shape[1], value.shape[-1])
    if k.shape[1] != heads:  # grouped-query attention: every query head gets its key/value head
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    causal = module.is_causal if is_causal is None else is_causal
    out = _varlen_kernel()(q, k, v, cu_seq_lens_q.to(torch.int32), cu_k.to(torch.int32), int(max_length_q),
                           int(max_k), scaling, bool(causal))
    return out.reshape(batch, length, heads, out.shape[-1]), None


def register_varlen_attention(name: str = NAME) -> str:
    """Register :func:`varlen_attention_forward` with transformers under ``name``; returns ``name``,
    to pass as ``attn_implementation``."""
    from transformers import AttentionInterface
    AttentionInterface.register(name, varlen_attention_forward)
    return name
