"""The CPU side of packkit's per-document attention (``doc_attention``): torch's fused CPU flash kernel
(``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward, which takes a given output and LSE) over
every sequence of a pass, and the per-sequence masks (causal, window, chunk) the kernel and the matmul math share.

Documents of similar length share one kernel call, right-padded to the longest of them (:func:`group_lengths`);
outputs and gradients come back as one concatenation when the documents tile the row (a single document's as views
of the kernel's own), else written into a filled tensor.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch


def acc_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _bhld(x: torch.Tensor) -> torch.Tensor:  # [L, H, D] -> [1, H, L, D]
    return x.transpose(0, 1).unsqueeze(0)


def _lhd(x: torch.Tensor) -> torch.Tensor:  # [1, H, L, D] -> [L, H, D]
    return x[0].transpose(0, 1)


def sequences(p):
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
    seqs = list(sequences(p))
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


def cpu_forward(q, k, v, p, scale, limits):
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
                torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=acc_dtype(q), device=q.device))
    return _place(ranges, outs, q.shape[0], 0, 0.0, q.dtype), _place(ranges, lses, q.shape[0], 1, float("-inf"),
                                                                      acc_dtype(q))


def cpu_backward(dout, q, k, v, out, lse, p, scale, limits):
    acc = acc_dtype(q)
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


def visible(lq: int, lk: int, causal: bool, limits: tuple, device) -> Optional[torch.Tensor]:
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
    seen = visible(lq, lk, causal, limits, device)
    mask = torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))
    return {"is_causal": False, "attn_mask": mask[None, None]}
