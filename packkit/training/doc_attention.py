"""Per-document attention over packed tokens: ``q, k, v`` ``[T, H, D]`` cut into sequences by ``cu_seqlens``, each
sequence attending only within itself, so the cost is ``sum(l_q * l_k)`` of the sequences, never ``T x T``.

One implementation for both packkit attentions: ``packkit_varlen`` on the CPU (:func:`doc_attention`, one pass) and
the shared-prefix two-pass tree attention (``packkit.shared_prefix.attention.two_pass``, which merges several
passes of :func:`varlen_forward` / :func:`varlen_backward` by log-sum-exp).

Backends, per call:

* CUDA fp16/bf16 without soft-cap or window: torch's own flash ops (``aten::_flash_attention_forward/_backward``),
  one call for every sequence;
* CPU: torch's fused CPU flash kernel per sequence, documents of similar length padded into one call
  (``doc_attention_cpu``; fp32, fp64, bf16, fp16); a sliding window or chunked layer passes the kernel an additive
  mask of the sequence (still ``l_q x l_k``);
* anything else (soft-capping: no fused kernel here takes it; CUDA fp32/fp64; a window on CUDA): the same math per
  sequence through matmuls in fp32 (fp64 for fp64), its backward included.

The backward is given the output and LSE to differentiate through (the *merged* ones for the two-pass path, the
sink-folded ones for a sink), so ``D = rowsum(dout * out)`` and the softmax are those of the whole row. An
attention sink (GPT-OSS ``s_aux``, one logit per head) is folded in as ``lse' = logaddexp(lse, sink)``,
``out' = out * exp(lse - lse')``; ``d sink = -sum over rows of exp(sink - lse') * rowsum(dout * out')``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from .doc_attention_cpu import acc_dtype, cpu_backward, cpu_forward, sequences, visible


class Spans(NamedTuple):
    """The sequences of one pass: query range ``cu_q[i]:cu_q[i+1]`` attends to key range ``cu_k[i]:cu_k[i+1]``."""
    cu_q: torch.Tensor  # int32 [n + 1], on the tensors' device (the CUDA flash ops read it)
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    causal: bool
    host_cu_q: np.ndarray  # the same boundaries on the host (the per-sequence loops read these, no device read)
    host_cu_k: np.ndarray


def spans(cu_q: torch.Tensor, cu_k: Optional[torch.Tensor] = None, max_q: Optional[int] = None,
          max_k: Optional[int] = None, causal: bool = True) -> Spans:
    """:class:`Spans` of a ``cu_seqlens`` tensor (one host copy; free on the CPU)."""
    cu_k = cu_q if cu_k is None else cu_k
    host_q = cu_q.detach().to("cpu", torch.int64).numpy()
    host_k = host_q if cu_k is cu_q else cu_k.detach().to("cpu", torch.int64).numpy()
    max_q = int(np.diff(host_q).max(initial=0)) if max_q is None else int(max_q)
    max_k = int(np.diff(host_k).max(initial=0)) if max_k is None else int(max_k)
    return Spans(cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, bool(causal), host_q, host_k)


def _use_flash(q: torch.Tensor, softcap, limits) -> bool:
    # torch's aten flash ops take no soft-cap (and are called here without a window): those run the matmul math.
    return q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16) and softcap is None and not limits


def _use_cpu_kernel(q: torch.Tensor, softcap) -> bool:
    return q.device.type == "cpu" and softcap is None


def _check_limits(causal: bool, window: Optional[int], chunk: Optional[int]) -> tuple:
    for name, x in (("window", window), ("chunk", chunk)):
        if x is not None and (type(x) is not int or x < 1):
            raise ValueError(f"{name} must be a positive int or None; got {x!r}")
    if (window is not None or chunk is not None) and not causal:
        raise ValueError("a window or chunk is defined here for causal attention only (query i sees keys j <= i)")
    return (window, chunk) if (window is not None or chunk is not None) else ()


def _scores(qi, ki, scale, softcap, causal, limits):
    """``[H, Lq, Lk]`` scores of one sequence in the accumulation dtype: scaled, soft-capped, masked."""
    s = torch.einsum("qhd,khd->hqk", qi, ki) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    seen = visible(qi.shape[0], ki.shape[0], causal, limits, qi.device)
    return s if seen is None else s.masked_fill(~seen, float("-inf"))


def _padded(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x if x.shape[-1] == dim else torch.nn.functional.pad(x, (0, dim - x.shape[-1]))


def varlen_forward(q, k, v, p, scale: float, softcap: Optional[float] = None, window: Optional[int] = None,
                   chunk: Optional[int] = None):
    """``(out [T, H, Dv], lse [H, T])`` of one pass ``p`` (a :class:`Spans`, or anything with its fields); lse is
    fp32 (fp64 for fp64 inputs); a query with no key gets out 0 and lse -inf. ``Dv`` may differ from the query /
    key head size (MLA: DeepSeek-V3, Kimi-K2)."""
    limits = _check_limits(p.causal, window, chunk)
    if _use_flash(q, softcap, limits) or _use_cpu_kernel(q, softcap):
        dv = v.shape[-1]
        if dv != q.shape[-1]:
            # The fused kernels take one head size: zero columns add nothing to Q K^T (the scale is passed, not
            # derived from the padded size) and give zero output columns, which are cut off.
            d = max(q.shape[-1], dv)
            q, k, v = _padded(q, d), _padded(k, d), _padded(v, d)
        if _use_flash(q, softcap, limits):
            out, lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, p.cu_q, p.cu_k, p.max_q, p.max_k, 0.0,
                                                                  p.causal, False, scale=scale)
        else:
            out, lse = cpu_forward(q, k, v, p, scale, limits)
        return out[..., :dv], lse
    acc = acc_dtype(q)
    t, h, _ = q.shape
    out = torch.zeros(t, h, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((h, t), float("-inf"), dtype=acc, device=q.device)
    for qs, qe, ks, ke in sequences(p):
        s = _scores(q[qs:qe].to(acc), k[ks:ke].to(acc), scale, softcap, p.causal, limits)
        l_i = torch.logsumexp(s, dim=-1)
        out[qs:qe] = torch.einsum("hqk,khd->qhd", torch.exp(s - l_i[..., None]), v[ks:ke].to(acc)).to(q.dtype)
        lse[:, qs:qe] = l_i
    return out, lse


def varlen_backward(dout, q, k, v, out, lse, p, scale: float, softcap: Optional[float] = None,
                    window: Optional[int] = None, chunk: Optional[int] = None):
    """``(dq, dk, dv)`` of one pass given the (merged / sink-folded) ``out`` and ``lse``; ``lse = +inf`` for a
    query whose gradient this pass must not take (its probabilities become 0)."""
    limits = _check_limits(p.causal, window, chunk)
    if _use_flash(q, softcap, limits) or _use_cpu_kernel(q, softcap):
        d_qk, d_v = q.shape[-1], v.shape[-1]
        if d_v != d_qk:  # MLA, as in varlen_forward: zero columns of dout and out add nothing to rowsum(dout * out)
            d = max(d_qk, d_v)
            dout, q, k, v, out = (_padded(x, d) for x in (dout, q, k, v, out))
        if _use_flash(q, softcap, limits):
            empty = torch.empty(0, device=q.device)
            rng = torch.zeros(2, dtype=torch.int64, device=q.device)
            dq, dk, dv = torch.ops.aten._flash_attention_backward(dout, q, k, v, out, lse.float(), p.cu_q, p.cu_k,
                                                                  p.max_q, p.max_k, 0.0, p.causal, rng, empty,
                                                                  scale=scale)
        else:  # the fused CPU flash backward, given out and lse
            dq, dk, dv = cpu_backward(dout, q, k, v, out, lse, p, scale, limits)
        return dq[..., :d_qk], dk[..., :d_qk], dv[..., :d_v]
    acc = acc_dtype(q)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    delta = (dout.to(acc) * out.to(acc)).sum(-1).transpose(0, 1)  # [H, T]
    for qs, qe, ks, ke in sequences(p):
        qi, ki, vi, doi = q[qs:qe].to(acc), k[ks:ke].to(acc), v[ks:ke].to(acc), dout[qs:qe].to(acc)
        s = _scores(qi, ki, scale, softcap, p.causal, limits)
        prob = torch.exp(s - lse[:, qs:qe, None].to(acc))  # lse = +inf for masked queries: prob 0
        dv[ks:ke] += torch.einsum("hqk,qhd->khd", prob, doi)
        dp = torch.einsum("qhd,khd->hqk", doi, vi)
        ds = prob * (dp - delta[:, qs:qe, None])
        if softcap is not None:  # d/dx c * tanh(x / c) = 1 - tanh^2 = 1 - (s / c)^2
            ds = ds * (1 - (s / softcap).masked_fill(prob == 0, 0) ** 2)
        dq[qs:qe] += torch.einsum("hqk,khd->qhd", ds, ki) * scale
        dk[ks:ke] += torch.einsum("hqk,qhd->khd", ds, qi) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def with_sink(out, lse, sink):
    """Fold a per-head sink logit into every row's softmax: it takes mass and adds no value, so with
    ``lse' = logaddexp(lse, sink)`` the output is ``out * exp(lse - lse')`` and ``lse'`` is the full row's LSE.
    A query with no key (FlashAttention writes its lse as +inf, the others -inf) gets out 0 and ``lse' = sink``."""
    lse = lse.masked_fill(lse == float("inf"), float("-inf"))
    merged = torch.logaddexp(lse, sink.to(lse.dtype)[:, None])
    return out * torch.exp(lse - merged).transpose(0, 1)[..., None], merged


def sink_grad(dout, out, lse, sink):
    """``d sink = -sum_rows P(sink) * D`` with ``P(sink) = exp(sink - lse')`` and ``D = rowsum(dout * out')``."""
    delta = (dout.to(lse.dtype) * out.to(lse.dtype)).sum(-1).transpose(0, 1)  # [H, T]
    return -(torch.exp(sink.to(lse.dtype)[:, None] - lse) * delta).sum(-1).to(sink.dtype)


class _DocAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, p, scale, softcap, window, chunk):
        out, lse = varlen_forward(q, k, v, p, scale, softcap, window, chunk)
        if sink is not None:
            out, lse = with_sink(out.to(lse.dtype), lse, sink)
            out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.args = (p, scale, softcap, window, chunk)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, sink = ctx.saved_tensors
        p, scale, softcap, window, chunk = ctx.args
        dout = dout.contiguous()
        dq, dk, dv = varlen_backward(dout, q, k, v, out, lse, p, scale, softcap, window, chunk)
        dsink = sink_grad(dout, out, lse, sink) if sink is not None and ctx.needs_input_grad[3] else None
        return dq, dk, dv, dsink, None, None, None, None, None


def doc_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Spans, scale: float,
                  softcap: Optional[float] = None, sink: Optional[torch.Tensor] = None, window: Optional[int] = None,
                  chunk: Optional[int] = None) -> torch.Tensor:
    """Attention of ``q, k, v`` ``[T, H, D]`` (key/value heads already matched to the query heads) within each
    sequence of ``p``; differentiable (``sink`` too), exact in the dtype the backend computes in. ``softcap``:
    scores become ``softcap * tanh(scores / softcap)``; ``sink`` ``[H]``: a per-head sink logit in every row's
    softmax; ``window`` ``w``: a query sees keys less than ``w`` positions back; ``chunk`` ``c``: only keys of its
    own chunk of ``c`` tokens (counted from the sequence start). Window and chunk need a causal ``p``."""
    if sink is not None and tuple(sink.shape) != (q.shape[1],):
        raise ValueError(f"sink must have shape ({q.shape[1]},) (one logit per query head); got {tuple(sink.shape)}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0 or None; got {softcap!r}")
    # Any strides with a unit last one: the kernels read [1, H, L, D] views of each document, so a transposed
    # [B=1, H, S, D] query is taken as it is (no copy).
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    return _DocAttention.apply(q, k, v, sink, p, scale, softcap, window, chunk)
