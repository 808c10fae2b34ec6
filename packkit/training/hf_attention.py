"""Varlen attention for HF models, fed the ``cu_seq_lens_*`` / ``max_length_*`` of a packkit batch.

torch (>= 2.10) ships ``torch.nn.attention.varlen.varlen_attn``: FlashAttention over packed tokens,
one document per ``cu_seqlens`` segment, with no mask tensor and no flash-attn package. transformers
has no attention implementation that calls it; this module adds one::

    name = packkit.register_varlen_attention()            # "packkit_varlen"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)
    batch = packkit.PackingCollator(4096)(features)       # flat or padded, on the GPU
    model(**batch, use_cache=False).loss

The model passes the batch's ``cu_seq_lens_q`` / ``max_length_q`` (which the collator returns) through
to every attention layer. A call with only per-document ``position_ids`` (ms-swift's and TRL's padding-free
collators) gets its boundaries from them, by the rule transformers' flash path applies (a document starts where
the positions do not go up by one). On CUDA it calls ``varlen_attn`` (fp16 / bf16). On the CPU it runs packkit's
per-document attention (``doc_attention``: torch's CPU flash kernel per document, fp32 / fp64 / bf16 / fp16, forward and
backward), so a packed row costs ``sum(l ** 2)`` of its documents rather than the row's square (SDPA with a block
mask), with sliding windows, chunked layers, soft-capping and attention sinks implemented exactly. Every keyword
argument the model passes is implemented or refused by name (``attention_args.ARGUMENTS``); so is a user's
``attention_mask``.
"""
from __future__ import annotations

import inspect
from typing import Optional

import numpy as np
import torch

from .attention_args import check_numbers, layer_limits, model_type, refusal, refuse_unknown, register
from .doc_attention import doc_attention, spans

NAME = "packkit_varlen"
CPU_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
CUDA_DTYPES = (torch.bfloat16, torch.float16)  # FlashAttention's (varlen_attn)


def _varlen_api():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise RuntimeError(f"varlen attention needs torch >= 2.10 (torch.nn.attention.varlen); this is torch "
                           f"{torch.__version__}") from exc
    return varlen_attn, inspect.signature(varlen_attn).parameters


def _has_window() -> bool:
    """Whether this torch's varlen_attn takes ``window_size`` (torch 2.10 has only ``is_causal``)."""
    return "window_size" in _varlen_api()[1]


def _kernel_mode(params, causal: bool, window: Optional[int]) -> dict:
    """varlen_attn's masking keywords. torch 2.10 takes is_causal; later versions a flash-attn (left, right) window,
    a query i seeing keys j with i - left <= j <= i + right (-1: unbounded; (-1, 0) is causal). transformers' sliding
    window w lets a query see keys i - j < w, i.e. left = w - 1 (as transformers' own flash path passes)."""
    if window is not None and not causal:
        raise ValueError("a sliding window is only passed to varlen_attn on causal layers")
    if "window_size" not in params:
        if window is not None:
            raise ValueError(f"torch {torch.__version__}'s varlen_attn has no window_size")
        return {"is_causal": causal}
    if not causal:
        return {"window_size": (-1, -1)}
    return {"window_size": (-1 if window is None else window - 1, 0)}


def _varlen_kernel():
    """torch's varlen_attn as f(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal[, window=w])."""
    varlen_attn, params = _varlen_api()

    def run(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window=None):
        mode = _kernel_mode(params, causal, window)
        if q.device.type != "cuda":
            raise ValueError(f"torch's varlen_attn runs on CUDA tensors only (FlashAttention); got {q.device}")
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, **mode)
    return run


def _cpu_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window=None, chunk=None, softcap=None, sink=None):
    """The CPU kernel: packkit's per-document attention (``doc_attention``: torch's CPU flash kernel per document,
    the same helper the shared-prefix two-pass path runs), with windows, chunks, soft-capping and sinks."""
    p = spans(cu_q, cu_k, max_q, max_k, causal)
    return doc_attention(q, k, v, p, scale, softcap, sink, window, chunk)


def _check_cpu_boundaries(module, cu_q, cu_k, max_q, max_k, tokens: int) -> None:
    """A CPU batch's boundaries are host data: check them (free) so that no token is left out of every document."""
    for name, cu, longest in (("cu_seq_lens_q", cu_q, max_q), ("cu_seq_lens_k", cu_k, max_k)):
        if cu.is_meta:  # metadata only: nothing to check, nothing to attend over
            raise refusal(NAME, module, f"{name} is a meta tensor", "meta tensors carry no data; pass the batch's own")
        if cu.dim() != 1 or cu.numel() < 2 or cu.is_floating_point():
            raise refusal(NAME, module, f"{name} of shape {tuple(cu.shape)} and dtype {cu.dtype}",
                          "it must be a 1-D integer tensor [0, ..., tokens] of at least 2 entries")
        host = cu.detach().to(torch.int64).numpy()  # numpy: no torch op (and no thread pool) per layer
        lengths = np.diff(host)
        if host[0] != 0 or host[-1] != tokens or (lengths < 0).any():
            raise refusal(NAME, module, f"{name} = {host.tolist()[:8]}{'...' if len(host) > 8 else ''}",
                          f"it must rise from 0 to the batch's {tokens} tokens (batch * sequence length)")
        if int(lengths.max()) > int(longest):
            raise refusal(NAME, module, f"max_length {int(longest)} below the longest document of {name} "
                          f"({int(lengths.max())})", "pass the batch's own max_length_q / max_length_k")


def check_dtype(module, device: str, dtype: torch.dtype) -> None:
    """Refuse, by name, a dtype the device's kernel does not run: on CUDA before torch's own FlashAttention error
    ("only support fp16 and bf16") surfaces from inside the first layer."""
    if device == "cpu" and dtype not in CPU_DTYPES:
        raise refusal(NAME, module, f"{dtype} on the CPU", "the CPU per-document attention runs float64, "
                      "float32, bfloat16 and float16")
    if device == "cuda" and dtype not in CUDA_DTYPES:
        raise refusal(NAME, module, f"{dtype} on CUDA", "torch's varlen_attn (FlashAttention) runs bfloat16 and "
                      "float16 only: load the model in bf16 (torch_dtype=torch.bfloat16), or use "
                      "attn_implementation='sdpa' for fp32 / fp64")


_BOUNDS: dict = {}  # one cached conversion: every layer of a forward passes the same position_ids tensor


def boundaries_from_position_ids(module, position_ids: torch.Tensor, query: torch.Tensor):
    """``(cu_seq_lens_q, max_length_q)`` of a call that carries only ``position_ids`` (ms-swift's and TRL's
    padding-free collators, transformers' ``DataCollatorWithFlattening`` without flash kwargs): a document starts at
    each row's first token and wherever a position is not one above its predecessor, the rule transformers' own
    flash and SDPA paths apply to packed ``position_ids``. A row that never restarts is one document (a plain
    batch). One host copy of the positions per forward (cached for the other layers), as transformers' flash path
    makes one per layer."""
    from ..models.documents import spans_from_position_ids

    batch, length = query.shape[0], query.shape[-2]
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() == 3:
        raise refusal(NAME, module, f"position_ids of shape {tuple(getattr(position_ids, 'shape', ()))} without "
                      "cu_seq_lens_q", "documents are read from 1-D or [batch, length] text positions only (mRoPE "
                      "rows do not restart per document); pass the batch's cu_seq_lens_q / max_length_q")
    key = (id(position_ids), position_ids._version, batch, length, query.device)
    if _BOUNDS.get("key") == key and _BOUNDS.get("tensor") is position_ids:
        return _BOUNDS["value"]
    try:
        spans = spans_from_position_ids(position_ids, batch, length, f"{NAME} on model type {model_type(module)!r}")
    except ValueError as exc:
        raise ValueError(f"{exc}; pass the batch's cu_seq_lens_q / max_length_q") from None
    spans = spans if spans is not None else [(row, 0, length) for row in range(batch)]
    offsets = [row * length + a for row, a, _ in spans] + [batch * length]
    value = (torch.tensor(offsets, dtype=torch.int32, device=query.device), max(b - a for _, a, b in spans))
    _BOUNDS.update(key=key, tensor=position_ids, value=value)
    return value


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                             scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                             sliding_window: Optional[int] = None, softcap: Optional[float] = None, s_aux=None,
                             position_ids=None, cu_seq_lens_q: Optional[torch.Tensor] = None,
                             cu_seq_lens_k: Optional[torch.Tensor] = None, max_length_q: Optional[int] = None,
                             max_length_k: Optional[int] = None, seq_idx=None, shared_prefix=None, use_cache=None,
                             output_attentions=None, output_hidden_states=None, output_router_logits=None,
                             num_items_in_batch=None, **unknown):
    """An HF attention function (``AttentionInterface``): query ``[B, H, S, D]``, key/value
    ``[B, H_kv, S, D]``; returns ``([B, S, H, D], None)``. The ``B * S`` tokens are one packed stream
    cut by ``cu_seq_lens_q`` (a packkit batch, flat or padded: padding is its own segment). CUDA: torch's
    ``varlen_attn``; CPU: per-document attention (fp32 / fp64 / bf16 / fp16), whose cost is the documents' own
    ``sum(l ** 2)``. The keyword arguments are those of ``packkit.training.attention_args.ARGUMENTS``; any other is
    refused."""
    refuse_unknown(NAME, module, unknown)
    if shared_prefix is not None:
        raise refusal(NAME, module, "a shared-prefix batch", "call model.set_attn_implementation("
                      "packkit.shared_prefix.register_attention()) for pack_groups / pack_tree batches")
    if cu_seq_lens_q is None and position_ids is not None and cu_seq_lens_k is None:
        cu_seq_lens_q, max_length_q = boundaries_from_position_ids(module, position_ids, query)
    if cu_seq_lens_q is None or max_length_q is None:
        raise refusal(NAME, module, "a call without cu_seq_lens_q / max_length_q (and without position_ids)",
                      "varlen attention needs the batch's cu_seq_lens_q and max_length_q (a packkit PackingCollator / "
                      "pack_sequences batch passed to the model as **batch), or per-document position_ids")
    if attention_mask is not None:
        raise refusal(NAME, module, "an attention_mask", "varlen attention takes no attention_mask: documents are "
                      "cut by cu_seq_lens_q; drop the mask (a packkit batch has none unless return_block_mask=True)")
    check_numbers(NAME, module, scaling=scaling, softcap=softcap, sliding_window=sliding_window, dropout=dropout,
                  max_lengths=(("max_length_q", max_length_q), ("max_length_k", max_length_k)))
    if dropout:
        raise refusal(NAME, module, f"attention dropout ({dropout})", "varlen attention has no dropout; set the "
                      "model config's attention_dropout to 0 or call model.eval()")
    if output_attentions:
        raise refusal(NAME, module, "output_attentions=True", "no attention weights are formed; call without it")
    device = query.device.type
    if device not in ("cpu", "cuda"):
        raise refusal(NAME, module, f"tensors on {query.device}", "varlen attention runs on CUDA (torch's "
                      "varlen_attn) and on the CPU (per-document attention); use attn_implementation='sdpa'")
    check_dtype(module, device, query.dtype)
    if softcap is not None:
        if device == "cuda":
            raise refusal(NAME, module, f"attention logit soft-capping (softcap={softcap}) on CUDA",
                          "torch's varlen_attn has no soft-capping; use attn_implementation='flex_attention' or "
                          "'eager' (the CPU per-document attention implements it)")
    if s_aux is not None:
        if device == "cuda":
            raise refusal(NAME, module, "attention sinks (s_aux) on CUDA", "torch's varlen_attn cannot apply them "
                          "with an exact gradient; use attn_implementation='flex_attention' or 'eager' (the CPU "
                          "per-document attention implements them)")
        if not isinstance(s_aux, torch.Tensor) or tuple(s_aux.shape) != (query.shape[1],):
            raise refusal(NAME, module, f"s_aux of shape {tuple(getattr(s_aux, 'shape', ()))}",
                          f"attention sinks are one logit per query head, shape ({query.shape[1]},)")
    if key.shape[-2] != query.shape[-2]:
        raise refusal(NAME, module, f"cached keys ({key.shape[-2]} keys for {query.shape[-2]} queries)",
                      "the packed documents are the whole sequence; call the model with use_cache=False")
    cu_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    max_k = max_length_q if max_length_k is None else max_length_k
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    longest = max(int(max_length_q), int(max_k))
    sliding_window, chunk = layer_limits(module, sliding_window)
    limits = {}
    if chunk is not None and chunk < longest:
        if device == "cuda":
            raise refusal(NAME, module, f"chunked attention (attention_chunk_size={chunk}, shorter than the longest "
                          f"document, {longest}) on CUDA", "varlen_attn has no chunked mask; use "
                          "attn_implementation='sdpa' (the CPU per-document attention implements it)")
        if not causal:
            raise refusal(NAME, module, f"chunked attention (attention_chunk_size={chunk}) on a non-causal layer",
                          "chunks are implemented for causal layers only")
        limits["chunk"] = int(chunk)
    if sliding_window is not None and sliding_window < longest:
        if not causal:
            raise refusal(NAME, module, f"a sliding window of {sliding_window} on a non-causal layer",
                          "transformers' mask (|q - k| <= w) and flash (|q - k| < w) definitions differ")
        if device == "cuda" and not _has_window():
            raise refusal(NAME, module, f"a sliding window of {sliding_window} tokens (shorter than the longest "
                          f"document, {max_length_q})", f"torch {torch.__version__}'s varlen_attn has no window_size")
        limits["window"] = int(sliding_window)
    batch, heads, length, dim = query.shape
    # [B, H, S, D] -> [B*S, H, D]: the packed token order the cu_seqlens index (one row, on the CPU: a view).
    if batch == 1 and device == "cpu":
        q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)
    else:
        q = query.transpose(1, 2).reshape(batch * length, heads, dim)
        k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)
        v = value.transpose(1, 2).reshape(batch * length, value.shape[1], value.shape[-1])
    if k.shape[1] != heads:  # grouped-query attention: every query head gets its key/value head
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    if device == "cpu":
        _check_cpu_boundaries(module, cu_seq_lens_q, cu_k, max_length_q, max_k, batch * length)
        scale = dim ** -0.5 if scaling is None else float(scaling)
        out = _cpu_kernel(q, k, v, cu_seq_lens_q, cu_k, int(max_length_q), int(max_k), scale, causal,
                          softcap=softcap, sink=s_aux, **limits)
    else:
        d_v = v.shape[-1]
        if d_v != dim:  # MLA (DeepSeek-V3, Kimi-K2): FlashAttention takes one head size; zero columns add nothing
            scaling = dim ** -0.5 if scaling is None else float(scaling)  # of the real query size, not the padded
            width = max(dim, d_v)
            q, k, v = (torch.nn.functional.pad(x, (0, width - x.shape[-1])) for x in (q, k, v))
        out = _varlen_kernel()(q, k, v, cu_seq_lens_q.to(torch.int32), cu_k.to(torch.int32), int(max_length_q),
                               int(max_k), scaling, causal, **limits)[..., :d_v]
    return out.reshape(batch, length, heads, out.shape[-1]), None


def register_varlen_attention(name: str = NAME) -> str:
    """Register :func:`varlen_attention_forward` with transformers under ``name`` (with a mask guard that refuses
    a user's ``attention_mask``, which transformers would otherwise drop); returns ``name``, to pass as
    ``attn_implementation``."""
    return register(name, varlen_attention_forward)
