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

Each pass runs through ``packkit.training.doc_attention`` (:func:`varlen_forward` / :func:`varlen_backward`, the
per-document attention ``packkit_varlen`` runs on the CPU too): CUDA fp16/bf16 call torch's own flash ops, the CPU
torch's fused CPU flash kernels per sequence (given the merged output and LSE in the backward), anything else (and
any soft-capped call, Gemma 2 ``softcap``) the same math per sequence with matmuls. Memory is per sequence, never
``T x T``. An attention sink (GPT-OSS ``s_aux``, one logit per head) is folded into the merged LSE (``with_sink``);
the passes' backward then runs with the folded output / LSE, and the sink's gradient is ``sink_grad``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from ...packing.tensors import host_tensor, to_device
from ...training.doc_attention import sink_grad, varlen_backward, varlen_forward, with_sink
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


class _TwoPass(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, passes, scale, softcap):
        out, lse = _merge(q, k, v, passes, scale, softcap)
        if sink is not None:
            out, lse = with_sink(out, lse, sink)
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
        dsink = sink_grad(dout, out, lse, sink) if sink is not None and ctx.needs_input_grad[3] else None
        return dq, dk, dv, dsink, None, None, None


def two_pass_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, passes: list, scale: float,
                       softcap: Optional[float] = None, sink: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Tree attention of ``q, k, v`` ``[T, H, D]`` (key/value heads already matched to the query heads) over
    :func:`varlen_passes`; differentiable, exact in every dtype the backend computes in. ``softcap``: scores become
    ``softcap * tanh(scores / softcap)`` (Gemma 2); ``sink`` ``[H]``: a per-head sink logit in every row's softmax
    (GPT-OSS ``s_aux``), differentiable too."""
    return _TwoPass.apply(q.contiguous(), k.contiguous(), v.contiguous(), sink, passes, scale, softcap)
