"""Tree attention as FlashAttention-varlen passes merged by log-sum-exp, without copying any key, value or query.

Over the flat ``[T]`` token stream of a depth-first forest:

* pass 0: document-causal attention over every node (and every row's padding tail), ``cu_seqlens`` = the nodes;
* pass ``a + 1`` for each tree level ``a``: every node ``A`` at depth ``a`` pairs its own tokens (keys) with its
  descendants (queries), non-causal. In depth-first order A's descendants are one contiguous range right after
  A, and the nodes of one level are disjoint, so the pairs are monotone on both axes: they fit varlen's
  ``cu_seqlens_q`` / ``cu_seqlens_k`` directly. Between two pairs, "filler" sequences cover the gaps, each with
  one side empty (``q`` range with no keys, or keys with no queries), so they do no work; the queries they hold
  are masked out of the merge (``query_mask``).

Each token's ancestors sit at distinct levels, so the passes partition its keys exactly: merging
``out = sum_i exp(lse_i - lse) * out_i`` with ``lse = logsumexp_i lse_i`` is exact attention. The backward is the
ring-attention method: each pass's flash backward is called with the *merged* output and LSE (so its softmax is
the full one restricted to its keys, and ``D = rowsum(dout * out)`` is the full one), with ``dout`` zeroed and
``lse = +inf`` for the queries it masks; the gradients add up. No gradient flows through an LSE.

Backends: CUDA fp16/bf16 call torch's own flash ops (``aten::_flash_attention_forward/_backward``); the CPU calls
torch's fused CPU flash kernels per sequence (``aten::_scaled_dot_product_flash_attention_for_cpu`` and its
backward, which take the merged output and LSE; fp32 and fp64); CUDA fp32/fp64 runs the same math per sequence
with matmuls. Memory is per sequence, never ``T x T``.

Soft-capping (Gemma 2, ``softcap``) changes the scores before every pass's LSE; no fused kernel here takes it, so a
soft-capped call runs the per-sequence math on every device (its backward multiplies ``dS`` by ``1 - (s / c)^2``).
An attention sink (GPT-OSS ``s_aux``, one logit per head) is folded into the merged LSE, ``lse' = logaddexp(lse,
sink)``, ``out' = out * exp(lse - lse')``; the passes' backward then runs with ``out'`` / ``lse'``, and
``d sink = -sum over rows of exp(sink - lse') * rowsum(dout * out')``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from ...packing.tensors import host_tensor, to_device
from ..layout import TreeLayout


class VarlenPass(NamedTuple):
    cu_q: torch.Tensor  # int32 [n + 1], device
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    causal: bool
    query_mask: Optional[torch.Tensor]  # bool [T] on the device (None: every query)
    host_cu_q: np.ndarray  # the same boundaries on the host (the CPU path loops over them, no device read)
    host_cu_k: np.ndarray


def _level_pairs(start, length, sub_end, total):
    """cu_q, cu_k (int64 numpy) and the real query ranges of one level's (node keys, descendant queries) pairs."""
    qs, qe = start + length, sub_end
    ks, ke = start, start + length
    n = len(qs)
    cu_q = np.empty(3 * n + 3, np.int64)
    cu_k = np.empty(3 * n + 3, np.int64)
    cu_q[0] = cu_k[0] = 0
    prev_ke = np.concatenate([[0], ke[:-1]]) if n else np.zeros(0, np.int64)
    cu_q[1:3 * n + 1:3], cu_q[2:3 * n + 1:3], cu_q[3:3 * n + 1:3] = qs, qs, qe  # filler q, filler k, real
    cu_k[1:3 * n + 1:3], cu_k[2:3 * n + 1:3], cu_k[3:3 * n + 1:3] = prev_ke, ks, ke
    cu_q[-2:] = total
    cu_k[-2] = ke[-1] if n else 0
    cu_k[-1] = total
    return cu_q, cu_k


def varlen_passes(layout: TreeLayout, device: torch.device) -> list:
    """Pass 0 and one pass per tree level, for a packed layout (host numpy -> one device copy)."""
    total = layout.num_rows * layout.row_len
    start = layout.dst
    length = layout.length
    counts = np.diff(layout.row_offsets)
    row = np.repeat(np.arange(layout.num_rows, dtype=np.int64), counts)  # not dst // row_len: an empty node may
    sub_end = row * layout.row_len + layout.end                            # sit at its row's very end
    # Pass 0: every node, then each row's padding tail (as packkit::tree_pack's cu_seqlens).
    last = layout.row_offsets[1:] - 1
    used = np.where(counts > 0, start[np.maximum(last, 0)] + length[np.maximum(last, 0)] if len(start) else 0,
                    np.arange(layout.num_rows) * layout.row_len)
    tails = (np.arange(1, layout.num_rows + 1) * layout.row_len) - used
    cu0 = np.empty(len(start) + layout.num_rows + 1, np.int64)
    pos = np.arange(len(start)) + np.repeat(np.arange(layout.num_rows), counts)
    cu0[pos] = start
    cu0[layout.row_offsets[1:] + np.arange(layout.num_rows)] = used
    cu0[-1] = total
    max0 = int(max(length.max() if len(length) else 0, tails.max() if len(tails) else 0))
    specs = [(cu0, cu0, max0, max0, True, None)]
    max_depth = int(layout.depth.max()) if len(layout.depth) else 0
    for a in range(max_depth):
        real = np.flatnonzero((layout.depth == a) & (length > 0) & (sub_end > start + length))
        cu_q, cu_k = _level_pairs(start[real], length[real], sub_end[real], total)
        diff = np.zeros(total + 1, np.int64)
        np.add.at(diff, start[real] + length[real], 1)
        np.add.at(diff, sub_end[real], -1)
        mask = np.cumsum(diff[:-1]) > 0
        specs.append((cu_q, cu_k, int(np.diff(cu_q).max()), int(np.diff(cu_k).max()), False, mask))
    # One copy for every boundary, one for every query mask.
    cus = np.concatenate([np.concatenate([q, k]) for q, k, *_ in specs]).astype(np.int32)
    cus_dev = to_device(host_tensor(cus), device)
    masks = [m for *_, m in specs if m is not None]
    masks_dev = to_device(host_tensor(np.concatenate(masks)), device) if masks else None
    passes, at, m_at = [], 0, 0
    for cu_q, cu_k, max_q, max_k, causal, mask in specs:
        n = len(cu_q)
        qm = None
        if mask is not None:
            qm = masks_dev[m_at:m_at + total]
            m_at += total
        passes.append(VarlenPass(cus_dev[at:at + n], cus_dev[at + n:at + 2 * n], max_q, max_k, causal, qm, cu_q, cu_k))
        at += 2 * n
    return passes


# --- one pass: CUDA flash ops, or the same math per sequence --------------------------------------------------
def _use_flash(q: torch.Tensor, softcap: Optional[float] = None) -> bool:
    # torch's aten flash ops take no soft-cap: a soft-capped call runs the per-sequence math instead.
    return q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16) and softcap is None


def _bhld(x: torch.Tensor) -> torch.Tensor:  # [L, H, D] -> [1, H, L, D]
    return x.transpose(0, 1).unsqueeze(0)


def _lhd(x: torch.Tensor) -> torch.Tensor:  # [1, H, L, D] -> [L, H, D]
    return x[0].transpose(0, 1)


def _sequences(p: VarlenPass):
    """(q range, k range) of every sequence of a pass with work in it (host boundaries: no device read)."""
    for i in range(len(p.host_cu_q) - 1):
        qs, qe, ks, ke = int(p.host_cu_q[i]), int(p.host_cu_q[i + 1]), int(p.host_cu_k[i]), int(p.host_cu_k[i + 1])
        if qe > qs and ke > ks:
            yield qs, qe, ks, ke


def _scores(qi, ki, scale, softcap, causal):
    """``[H, Lq, Lk]`` scores of one sequence in the accumulation dtype: scaled, soft-capped, causally masked."""
    s = torch.einsum("qhd,khd->hqk", qi, ki) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        s = s.masked_fill(_causal_block(qi.shape[0], ki.shape[0], qi.device), float("-inf"))
    return s


def varlen_forward(q, k, v, p: VarlenPass, scale: float, softcap: Optional[float] = None):
    """``(out [T, H, D], lse [H, T])`` of one pass; lse is fp32 (fp64 for fp64 inputs); a query with no key
    gets out 0 and lse -inf. CPU: torch's fused CPU flash kernel per sequence; CUDA fp32/fp64, and any soft-capped
    call (no fused kernel here soft-caps): the same per-sequence math through matmuls."""
    if _use_flash(q, softcap):
        out, lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, p.cu_q, p.cu_k, p.max_q, p.max_k, 0.0,
                                                              p.causal, False, scale=scale)
        return out, lse
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    t, h, _ = q.shape
    out = torch.zeros(t, h, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((h, t), float("-inf"), dtype=acc, device=q.device)
    for qs, qe, ks, ke in _sequences(p):
        if q.device.type == "cpu" and softcap is None:
            o, l_i = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                _bhld(q[qs:qe]), _bhld(k[ks:ke]), _bhld(v[ks:ke]), 0.0, p.causal, scale=scale)
            out[qs:qe] = _lhd(o)
            lse[:, qs:qe] = l_i[0].to(acc)
            continue
        s = _scores(q[qs:qe].to(acc), k[ks:ke].to(acc), scale, softcap, p.causal)
        l_i = torch.logsumexp(s, dim=-1)
        out[qs:qe] = torch.einsum("hqk,khd->qhd", torch.exp(s - l_i[..., None]), v[ks:ke].to(acc)).to(q.dtype)
        lse[:, qs:qe] = l_i
    return out, lse


def _causal_block(lq: int, lk: int, device) -> torch.Tensor:
    """True where masked: flash-attn's bottom-right alignment (query i sees keys j <= i + lk - lq)."""
    i = torch.arange(lq, device=device)[:, None]
    j = torch.arange(lk, device=device)[None, :]
    return j > i + (lk - lq)


def varlen_backward(dout, q, k, v, out, lse, p: VarlenPass, scale: float, softcap: Optional[float] = None):
    """``(dq, dk, dv)`` of one pass given the (merged) ``out`` and ``lse``."""
    if _use_flash(q, softcap):
        empty = torch.empty(0, device=q.device)
        rng = torch.zeros(2, dtype=torch.int64, device=q.device)
        return torch.ops.aten._flash_attention_backward(dout, q, k, v, out, lse.float(), p.cu_q, p.cu_k, p.max_q,
                                                        p.max_k, 0.0, p.causal, rng, empty, scale=scale)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    cpu = q.device.type == "cpu" and softcap is None
    delta = None if cpu else (dout.to(acc) * out.to(acc)).sum(-1).transpose(0, 1)  # [H, T]
    for qs, qe, ks, ke in _sequences(p):
        if cpu:  # the fused CPU flash backward, given the merged out and lse (+inf: a query this pass masks)
            gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                _bhld(dout[qs:qe]), _bhld(q[qs:qe]), _bhld(k[ks:ke]), _bhld(v[ks:ke]), _bhld(out[qs:qe]),
                lse[:, qs:qe].unsqueeze(0).to(q.dtype if q.dtype == torch.float64 else torch.float32), 0.0, p.causal,
                scale=scale)
            dq[qs:qe] += _lhd(gq)
            dk[ks:ke] += _lhd(gk)
            dv[ks:ke] += _lhd(gv)
            continue
        qi, ki, vi, doi = q[qs:qe].to(acc), k[ks:ke].to(acc), v[ks:ke].to(acc), dout[qs:qe].to(acc)
        s = _scores(qi, ki, scale, softcap, p.causal)
        prob = torch.exp(s - lse[:, qs:qe, None].to(acc))  # lse = +inf for masked queries: prob 0
        dv[ks:ke] += torch.einsum("hqk,qhd->khd", prob, doi)
        dp = torch.einsum("qhd,khd->hqk", doi, vi)
        ds = prob * (dp - delta[:, qs:qe, None])
        if softcap is not None:  # d/dx c * tanh(x / c) = 1 - tanh^2 = 1 - (s / c)^2
            ds = ds * (1 - (s / softcap).masked_fill(prob == 0, 0) ** 2)
        dq[qs:qe] += torch.einsum("hqk,khd->qhd", ds, ki) * scale
        dk[ks:ke] += torch.einsum("hqk,qhd->khd", ds, qi) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# --- the merged attention -------------------------------------------------------------------------------------
def _merge(q, k, v, passes, scale, softcap):
    outs, lses = [], []
    for p in passes:
        o, l = varlen_forward(q, k, v, p, scale, softcap)
        if p.query_mask is not None:
            l = l.masked_fill(~p.query_mask[None, :], float("-inf"))
        outs.append(o)
        lses.append(l)
    lse = torch.logsumexp(torch.stack(lses), dim=0)  # [H, T]
    acc = lses[0].dtype
    out = torch.zeros(outs[0].shape, dtype=acc, device=q.device)
    for o, l in zip(outs, lses):
        w = torch.exp(l - lse).transpose(0, 1)[..., None]  # [T, H, 1]; 0 where the pass does not hold the query
        out = out + torch.where(w > 0, w * o.to(acc), torch.zeros((), dtype=acc, device=q.device))
    return out, lse


def _with_sink(out, lse, sink):
    """Fold a per-head sink logit into every row's softmax: it takes mass and adds no value, so with
    ``lse' = logaddexp(lse, sink)`` the output is ``out * exp(lse - lse')`` and ``lse'`` is the full row's LSE."""
    merged = torch.logaddexp(lse, sink.to(lse.dtype)[:, None])
    return out * torch.exp(lse - merged).transpose(0, 1)[..., None], merged


class _TwoPass(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, passes, scale, softcap):
        out, lse = _merge(q, k, v, passes, scale, softcap)
        if sink is not None:
            out, lse = _with_sink(out, lse, sink)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.passes, ctx.scale, ctx.softcap = passes, scale, softcap
        return out

    @staticmethod
    def backward(ctx, dout):
        # Each pass's backward with the merged (sink-folded) out and LSE: its softmax is the full row's restricted
        # to its keys, and D = rowsum(dout * out) is the full row's, so the gradients add up (ring attention).
        q, k, v, out, lse, sink = ctx.saved_tensors
        dout = dout.contiguous()
        dq = dk = dv = None
        for p in ctx.passes:
            d, l = dout, lse
            if p.query_mask is not None:
                d = dout.masked_fill(~p.query_mask[:, None, None], 0)
                l = lse.masked_fill(~p.query_mask[None, :], float("inf"))
            gq, gk, gv = varlen_backward(d, q, k, v, out, l, p, ctx.scale, ctx.softcap)
            dq, dk, dv = (gq, gk, gv) if dq is None else (dq + gq, dk + gk, dv + gv)
        dsink = None
        if sink is not None and ctx.needs_input_grad[3]:  # d sink = -sum_rows P(sink) * D
            delta = (dout.to(lse.dtype) * out.to(lse.dtype)).sum(-1).transpose(0, 1)  # [H, T]
            dsink = -(torch.exp(sink.to(lse.dtype)[:, None] - lse) * delta).sum(-1).to(sink.dtype)
        return dq, dk, dv, dsink, None, None, None


def two_pass_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, passes: list, scale: float,
                       softcap: Optional[float] = None, sink: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Tree attention of ``q, k, v`` ``[T, H, D]`` (key/value heads already matched to the query heads) over
    :func:`varlen_passes`; differentiable, exact in every dtype the backend computes in. ``softcap``: scores become
    ``softcap * tanh(scores / softcap)`` (Gemma 2); ``sink`` ``[H]``: a per-head sink logit in every row's softmax
    (GPT-OSS ``s_aux``), differentiable too."""
    return _TwoPass.apply(q.contiguous(), k.contiguous(), v.contiguous(), sink, passes, scale, softcap)
