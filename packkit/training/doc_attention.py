"""Per-document attention over packed tokens: ``q, k, v`` ``[T, H, D]`` cut into sequences by ``cu_seqlens``, each
sequence attending only within itself, so the cost is ``sum(l_q * l_k)`` of the sequences, never ``T x T``.

One implementation for both packkit attentions: ``packkit_varlen`` on the CPU (:func:`doc_attention`, one pass) and
the shared-prefix two-pass tree attention (``packkit.shared_prefix.attention.two_pass``, which merges several
passes of :func:`varlen_forward` / :func:`varlen_backward` by log-sum-exp).

Backends, per call:

* CUDA fp16/bf16 without soft-cap or window: torch's own flash ops (``aten::_flash_attention_forward/_backward``),
  one call for every sequence;
* CPU: torch's fused CPU flash kernel per sequence (``aten::_scaled_dot_product_flash_attention_for_cpu`` and its
  backward, which take a given output and LSE: fp32, fp64, bf16, fp16); a sliding window or chunked layer passes
  the kernel an additive mask of the sequence (still ``l_q x l_k``);
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


def _acc(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _bhld(x: torch.Tensor) -> torch.Tensor:  # [L, H, D] -> [1, H, L, D]
    return x.transpose(0, 1).unsqueeze(0)


def _lhd(x: torch.Tensor) -> torch.Tensor:  # [1, H, L, D] -> [L, H, D]
    return x[0].transpose(0, 1)


def _sequences(p):
    """(q range, k range) of every sequence of a pass with work in it (host boundaries: no device read)."""
    for i in range(len(p.host_cu_q) - 1):
        qs, qe, ks, ke = int(p.host_cu_q[i]), int(p.host_cu_q[i + 1]), int(p.host_cu_k[i]), int(p.host_cu_k[i + 1])
        if qe > qs and ke > ks:
            yield qs, qe, ks, ke


# Documents of similar length share one CPU kernel call, right-padded to the group's longest: a kernel call has a
# fixed cost (its threads' fork / join, dear on a busy machine), and causal padding is exact for the real rows (a
# real query never sees a padded key, which sits after every real one). A group's padded work may exceed its
# documents' own by a quarter, plus one 128 x 128 block.
_SLACK, _SMALL = 0.25, 128 * 128


def group_lengths(lengths) -> list:
    """Indices of ``lengths`` in groups (each longest first) whose padded cost ``n * max ** 2`` stays within
    ``(1 + _SLACK) * sum(l ** 2) + _SMALL``: greedy, over the lengths sorted longest first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups = []
    for i in order:
        if groups:
            top, useful = lengths[groups[-1][0]] ** 2, groups[-1][1] + lengths[i] ** 2
            if (len(groups[-1][2]) + 1) * top <= (1 + _SLACK) * useful + _SMALL:
                groups[-1][1] = useful
                groups[-1][2].append(i)
                continue
        groups.append([i, lengths[i] ** 2, [i]])
    return [g[2] for g in groups]


class _Group(NamedTuple):
    """Sequences run by one CPU kernel call, ``members`` (qs, qe, ks, ke) in grid order. One member: views, no copy.
    Several (causal, each query range its key range): a padded ``[n, length]`` grid; ``take`` [n * length] gathers
    its tokens (a padding slot repeats its document's last token: finite, unseen by real rows), ``pad`` marks the
    padding slots."""
    length: int
    members: list
    take: Optional[torch.Tensor] = None
    pad: Optional[torch.Tensor] = None


def _cpu_groups(p) -> list:
    seqs = list(_sequences(p))
    if not p.causal or any(qs != ks or qe != ke for qs, qe, ks, ke in seqs):
        return [_Group(qe - qs, [(qs, qe, ks, ke)]) for qs, qe, ks, ke in seqs]
    groups = []
    for members in group_lengths([qe - qs for qs, qe, _, _ in seqs]):
        chosen = [seqs[i] for i in members]
        if len(chosen) == 1:
            groups.append(_Group(chosen[0][1] - chosen[0][0], chosen))
            continue
        starts = np.array([m[0] for m in chosen], np.int64)
        lens = np.array([m[1] - m[0] for m in chosen], np.int64)
        length = int(lens.max())
        j = np.arange(length)
        take = starts[:, None] + np.minimum(j[None, :], lens[:, None] - 1)
        groups.append(_Group(length, chosen, torch.from_numpy(take.reshape(-1)),
                             torch.from_numpy((j[None, :] >= lens[:, None]).reshape(-1))))
    return groups


def _grid(x: torch.Tensor, g: _Group, keys: bool) -> torch.Tensor:
    """``[T, H, D]`` -> the group's ``[n, H, length, D]`` (a view for one sequence, else one gather)."""
    if g.take is None:
        start, end = g.members[0][2:] if keys else g.members[0][:2]
        return _bhld(x[start:end])
    return x.index_select(0, g.take).view(-1, g.length, *x.shape[1:]).transpose(1, 2)


def _tiling(ranges: list, total: int) -> Optional[list]:
    """The order in which the ranges' (qs, qe) tile ``[0, total)`` exactly, or None."""
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    bounds = [ranges[i][:2] for i in order]
    if bounds and bounds[0][0] == 0 and bounds[-1][1] == total and all(
            a[1] == b[0] for a, b in zip(bounds, bounds[1:])):
        return order
    return None


def _place(ranges: list, pieces: list, total: int, dim: int, fill: float, dtype) -> torch.Tensor:
    """The pieces (each its query range's rows along ``dim``) as one tensor of ``total`` rows: a concatenation when
    the ranges tile ``[0, total)`` (one copy, or none for one piece), else written into a ``fill``-ed one."""
    order = _tiling(ranges, total)
    if order is not None:
        out = pieces[order[0]] if len(order) == 1 else torch.cat([pieces[i] for i in order], dim)
        return out.to(dtype)
    shape = list(pieces[0].shape) if pieces else [total]
    shape[dim] = total
    out = torch.full(shape, fill, dtype=dtype, device=pieces[0].device) if pieces else None
    for (qs, qe, *_), piece in zip(ranges, pieces):
        out.narrow(dim, qs, qe - qs).copy_(piece)
    return out


def _cpu_forward(q, k, v, p, scale, limits):
    """``(out [T, H, D], lse [H, T])`` through torch's CPU flash kernel, one call per group."""
    ranges, outs, lses = [], [], []
    for g in _cpu_groups(p):
        (qs, qe, ks, ke), single = g.members[0], g.take is None
        mode = _cpu_mode(qe - qs, ke - ks, p.causal, limits, q.dtype, q.device) if single else \
            _cpu_mode(g.length, g.length, True, limits, q.dtype, q.device)
        o, l_i = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _grid(q, g, False), _grid(k, g, True), _grid(v, g, True), 0.0, scale=scale, **mode)
        for i, (qs, qe, ks, ke) in enumerate(g.members):  # [n, H, L, D] -> each document's [l, H, D] (views)
            ranges.append((qs, qe))
            outs.append(o[i, :, :qe - qs].transpose(0, 1))
            lses.append(l_i[i, :, :qe - qs])
    if not ranges:
        return (torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device),
                torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=_acc(q), device=q.device))
    return _place(ranges, outs, q.shape[0], 0, 0.0, q.dtype), _place(ranges, lses, q.shape[0], 1, float("-inf"),
                                                                      _acc(q))


def _cpu_backward(dout, q, k, v, out, lse, p, scale, limits):
    acc = _acc(q)
    ranges, grads = [], ([], [], [])
    for g in _cpu_groups(p):
        (qs, qe, ks, ke), single = g.members[0], g.take is None
        if single:
            l_g = lse[:, qs:qe].unsqueeze(0).to(acc)
            mode = _cpu_mode(qe - qs, ke - ks, p.causal, limits, q.dtype, q.device)
        else:  # padding rows get lse = +inf: probabilities 0, so they add nothing to a real key's gradient
            l_g = lse.index_select(1, g.take).to(acc).masked_fill_(g.pad[None, :], float("inf"))
            l_g = l_g.view(lse.shape[0], -1, g.length).transpose(0, 1).contiguous()
            mode = _cpu_mode(g.length, g.length, True, limits, q.dtype, q.device)
        gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _grid(dout, g, False), _grid(q, g, False), _grid(k, g, True), _grid(v, g, True), _grid(out, g, False),
            l_g, 0.0, scale=scale, **mode)
        for i, (qs, qe, ks, ke) in enumerate(g.members):
            ranges.append((qs, qe, ks, ke))
            grads[0].append(gq[i, :, :qe - qs].transpose(0, 1))
            grads[1].append(gk[i, :, :ke - ks].transpose(0, 1))
            grads[2].append(gv[i, :, :ke - ks].transpose(0, 1))
    if all(r[:2] == r[2:] for r in ranges) and _tiling(ranges, q.shape[0]) is not None:  # one write per token
        return tuple(_place(ranges, gs, x.shape[0], 0, 0.0, x.dtype) for gs, x in zip(grads, (q, k, v)))
    totals = [torch.zeros(x.shape, dtype=acc, device=x.device) for x in (q, k, v)]
    for (qs, qe, ks, ke), gq, gk, gv in zip(ranges, *grads):
        totals[0][qs:qe] += gq
        totals[1][ks:ke] += gk
        totals[2][ks:ke] += gv
    return tuple(t.to(x.dtype) for t, x in zip(totals, (q, k, v)))


def _check_limits(causal: bool, window: Optional[int], chunk: Optional[int]) -> tuple:
    for name, x in (("window", window), ("chunk", chunk)):
        if x is not None and (type(x) is not int or x < 1):
            raise ValueError(f"{name} must be a positive int or None; got {x!r}")
    if (window is not None or chunk is not None) and not causal:
        raise ValueError("a window or chunk is defined here for causal attention only (query i sees keys j <= i)")
    return (window, chunk) if (window is not None or chunk is not None) else ()


def _visible(lq: int, lk: int, causal: bool, limits: tuple, device) -> Optional[torch.Tensor]:
    """Bool ``[lq, lk]``, True where a query sees a key (None: all, non-causal). Flash-attn's bottom-right alignment:
    query ``i`` sits at key position ``i + lk - lq``; a window ``w`` keeps keys ``pos - j < w`` (transformers'
    rule), a chunk ``c`` keeps keys in the query's chunk ``j // c == pos // c`` (positions within the sequence)."""
    if not causal:
        return None
    pos = torch.arange(lq, device=device)[:, None] + (lk - lq)
    j = torch.arange(lk, device=device)[None, :]
    seen = j <= pos
    if limits:
        window, chunk = limits
        if window is not None:
            seen = seen & (pos - j < window)
        if chunk is not None:
            seen = seen & (torch.div(j, chunk, rounding_mode="floor") == torch.div(pos, chunk, rounding_mode="floor"))
    return seen


def _cpu_mode(lq: int, lk: int, causal: bool, limits: tuple, dtype, device) -> dict:
    """The CPU kernel's masking keywords: ``is_causal`` alone (square, no window/chunk), else an additive mask."""
    if not limits and (not causal or lq == lk):
        return {"is_causal": causal}
    seen = _visible(lq, lk, causal, limits, device)
    mask = torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))
    return {"is_causal": False, "attn_mask": mask[None, None]}


def _scores(qi, ki, scale, softcap, causal, limits):
    """``[H, Lq, Lk]`` scores of one sequence in the accumulation dtype: scaled, soft-capped, masked."""
    s = torch.einsum("qhd,khd->hqk", qi, ki) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    seen = _visible(qi.shape[0], ki.shape[0], causal, limits, qi.device)
    return s if seen is None else s.masked_fill(~seen, float("-inf"))


def varlen_forward(q, k, v, p, scale: float, softcap: Optional[float] = None, window: Optional[int] = None,
                   chunk: Optional[int] = None):
    """``(out [T, H, D], lse [H, T])`` of one pass ``p`` (a :class:`Spans`, or anything with its fields); lse is
    fp32 (fp64 for fp64 inputs); a query with no key gets out 0 and lse -inf."""
    limits = _check_limits(p.causal, window, chunk)
    if _use_flash(q, softcap, limits):
        out, lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, p.cu_q, p.cu_k, p.max_q, p.max_k, 0.0,
                                                              p.causal, False, scale=scale)
        return out, lse
    if _use_cpu_kernel(q, softcap):
        return _cpu_forward(q, k, v, p, scale, limits)
    acc = _acc(q)
    t, h, _ = q.shape
    out = torch.zeros(t, h, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((h, t), float("-inf"), dtype=acc, device=q.device)
    for qs, qe, ks, ke in _sequences(p):
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
    if _use_flash(q, softcap, limits):
        empty = torch.empty(0, device=q.device)
        rng = torch.zeros(2, dtype=torch.int64, device=q.device)
        return torch.ops.aten._flash_attention_backward(dout, q, k, v, out, lse.float(), p.cu_q, p.cu_k, p.max_q,
                                                        p.max_k, 0.0, p.causal, rng, empty, scale=scale)
    if _use_cpu_kernel(q, softcap):  # the fused CPU flash backward, given out and lse
        return _cpu_backward(dout, q, k, v, out, lse, p, scale, limits)
    acc = _acc(q)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    delta = (dout.to(acc) * out.to(acc)).sum(-1).transpose(0, 1)  # [H, T]
    for qs, qe, ks, ke in _sequences(p):
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
    ``lse' = logaddexp(lse, sink)`` the output is ``out * exp(lse - lse')`` and ``lse'`` is the full row's LSE."""
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
