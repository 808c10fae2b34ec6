"""Triton implementation of ``packkit::cp_shard``: ``torch.ops.packkit.triton_cp_shard``.

Semantics (bit for bit) are those of ``tests/cp_reference.py`` and the C++ op
(``csrc/ops/context_parallel_op.cpp``; index math in ``csrc/ops/context_parallel.hpp``): one context-parallel
rank's shard of a flat packed row. One launch: each program owns BLOCK output positions, finds each one's
segment with a branchless binary search over the padded (zigzag) or plain (contiguous) ``cu_seqlens`` and
gathers input_ids, labels, position_ids and the next label of the same segment (fused mode, ``seg_src``: straight
from the unpacked source, so pack + pad + split is this one launch). Checks are metadata only; every
load is masked and every index bounded, so inconsistent ``cu_seqlens`` give padding values, never an
out-of-bounds access. Nothing is read back to the host: ``out_len`` is a host int.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from .common import _INT32_MAX, _device_guard, _grid_1d, tl, triton  # the one guarded triton import (common.py), for every op family

from torch.library import triton_op, wrap_triton

__all__ = ["cp_shard"]

_CONFIG = {"block": 1024, "num_warps": 4}  # tests shrink block to cover many programs


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _segment_of(a_ptr, x, ok, n):
    """Last s in [0, n) with a[s] <= x (a[0] == 0 <= x), per lane; n >= 1."""
    top = tl.full([], 1, tl.int64)
    while top < n:
        top = top * 2
    s = tl.zeros_like(x)
    step = top
    while step > 0:
        cand = s + step
        in_range = ok & (cand < n)
        c = tl.load(a_ptr + cand, mask=in_range, other=0).to(tl.int64)
        s = tl.where(in_range & (c <= x), cand, s)
        step = step // 2
    return s


@triton.jit(do_not_specialize=["num_segments", "num_tokens", "cp_size", "cp_rank", "out_len", "pad_id", "ignore_index",
                               "num_src", "position_start", "first_label"])
def _cp_shard_kernel(ids_ptr, labels_ptr, pos_ptr, cu_ptr, cup_ptr, seg_src_ptr, out_ids_ptr, out_split_ptr,
                     out_labels_ptr, out_pos_ptr, out_src_ptr, out_seg_ptr, num_segments, num_tokens, cp_size, cp_rank,
                     out_len, pad_id, ignore_index, num_src, position_start, first_label, ZIGZAG: tl.constexpr,
                     FUSED: tl.constexpr, HAS_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    if FUSED:  # the packed row's length is cu[S], read on the device (no host sync)
        num_tokens = tl.load(cu_ptr + num_segments).to(tl.int64)
    j_ok = j < out_len
    has_segs = (tl.zeros_like(j) + num_segments) >= 1
    if ZIGZAG:
        ok = j_ok & has_segs
        s = _segment_of(cup_ptr, j * cp_size, ok, num_segments)
        p0 = tl.load(cup_ptr + s, mask=ok, other=0).to(tl.int64)
        p1 = tl.load(cup_ptr + s + 1, mask=ok, other=0).to(tl.int64)
        chunk = (p1 - p0) // (2 * cp_size)
        k = j - p0 // cp_size
        idx = tl.where(k < chunk, cp_rank * chunk + k, (2 * cp_size - 1 - cp_rank) * chunk + (k - chunk))
        c0 = tl.load(cu_ptr + s, mask=ok, other=0).to(tl.int64)
        c1 = tl.load(cu_ptr + s + 1, mask=ok, other=0).to(tl.int64)
        seg_len = c1 - c0
        real = ok & (idx >= 0) & (idx < seg_len) & (c0 + idx >= 0) & (c0 + idx < num_tokens)
        src = tl.where(real, c0 + idx, -1)
        pad_pos = idx - seg_len
        seg = tl.where(ok, s, num_segments)
    else:
        g = cp_rank * out_len + j
        real = j_ok & (g < num_tokens) & has_segs
        s = _segment_of(cu_ptr, g, real, num_segments)
        src = tl.where(real, g, -1)
        pad_pos = g - num_tokens
        seg = tl.where(real, s, num_segments)
        seg_ok = real
        c1 = tl.load(cu_ptr + s + 1, mask=seg_ok, other=0).to(tl.int64)
        c0 = tl.load(cu_ptr + s, mask=seg_ok, other=0).to(tl.int64)
    ids_dtype: tl.constexpr = out_ids_ptr.dtype.element_ty
    labels_dtype: tl.constexpr = out_labels_ptr.dtype.element_ty
    ignore = ignore_index.to(labels_dtype)
    safe = tl.where(real, src, 0)
    nxt = safe + 1
    last = c1 - 1
    last_ok = j_ok & (seg < num_segments) & (last >= c0) & (last >= 0) & (last < num_tokens) & (src < 0)
    if FUSED:
        # Read straight from the unpacked source: segment s starts at seg_src[s] there (-1: padding segment).
        off = safe - c0
        seg_ok = real & (seg < num_segments)
        start = tl.load(seg_src_ptr + tl.where(seg_ok, seg, 0), mask=seg_ok, other=-1)
        q = start + off
        # off < 0 when cu[s] > g (cu_seqlens not starting at 0): q would fall before the source.
        tok = seg_ok & (start >= 0) & (off >= 0) & (q >= 0) & (q < num_src)
        q_safe = tl.where(tok, q, 0)
        ids = tl.load(ids_ptr + q_safe, mask=tok, other=0)
        ids = tl.where(tok, ids, pad_id.to(ids_dtype))
        split = tl.load(labels_ptr + q_safe, mask=tok, other=0)
        if HAS_FIRST:
            split = tl.where(off == 0, first_label.to(labels_dtype), split)
        split = tl.where(tok, split, ignore)
        nxt_ok = tok & (nxt < c1) & (q + 1 < num_src)
        lab = tl.load(labels_ptr + tl.where(nxt_ok, q + 1, 0), mask=nxt_ok, other=0)
        lab = tl.where(nxt_ok, lab, ignore)
        base = tl.where(last_ok, position_start + (c1 - c0), 0)
        pos = tl.where(real, position_start + off, base + pad_pos)
    else:
        ids = tl.load(ids_ptr + safe, mask=real, other=0)
        ids = tl.where(real, ids, pad_id.to(ids_dtype))
        split = tl.load(labels_ptr + safe, mask=real, other=0)
        split = tl.where(real, split, ignore)
        nxt_ok = real & (nxt < c1) & (nxt < num_tokens)
        lab = tl.load(labels_ptr + nxt, mask=nxt_ok, other=0)
        lab = tl.where(nxt_ok, lab, ignore)
        pos_real = tl.load(pos_ptr + safe, mask=real, other=0)
        # Padding continues its segment's count past the last real token (end padding counts from 0).
        base = tl.load(pos_ptr + tl.where(last_ok, last, 0), mask=last_ok, other=-1) + 1
        pos = tl.where(real, pos_real, base + pad_pos)
    tl.store(out_ids_ptr + j, ids, mask=j_ok)
    tl.store(out_split_ptr + j, split, mask=j_ok)
    tl.store(out_labels_ptr + j, lab, mask=j_ok)
    tl.store(out_pos_ptr + j, pos, mask=j_ok)
    tl.store(out_src_ptr + j, src, mask=j_ok)
    tl.store(out_seg_ptr + j, seg.to(tl.int32), mask=j_ok)


def _check(input_ids, labels, position_ids, cu_seqlens, cu_seqlens_padded, cp_size, cp_rank, out_len, seg_src,
           first_label):
    op = "packkit::triton_cp_shard"
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"{op}: need cp_size >= 1 and 0 <= cp_rank < cp_size, got {cp_size}, {cp_rank}")
    if out_len < 0 or out_len * cp_size > _INT32_MAX:
        raise ValueError(f"{op}: out_len * cp_size must be in [0, 2^31), got out_len {out_len}")
    for t, name in ((input_ids, "input_ids"), (labels, "labels")):
        if t.dim() != 1 or t.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{op}: {name} must be a flat 1-D int64 or int32 tensor")
    if seg_src is not None:
        if position_ids is not None:
            raise ValueError(f"{op}: with seg_src (fused pack + shard) position_ids must be None")
    elif position_ids is None:
        raise ValueError(f"{op}: position_ids is required without seg_src")
    elif first_label is not None:
        raise ValueError(f"{op}: first_label applies to the fused mode (seg_src) only")
    for t, name, dtype in ((position_ids, "position_ids", torch.int64), (cu_seqlens, "cu_seqlens", torch.int32),
                           (cu_seqlens_padded, "cu_seqlens_padded", torch.int32), (seg_src, "seg_src", torch.int64)):
        if t is not None and (t.dim() != 1 or t.dtype != dtype):
            raise ValueError(f"{op}: {name} must be 1-D {dtype}")
    if labels.numel() != input_ids.numel() or (position_ids is not None and position_ids.numel() != input_ids.numel()):
        raise ValueError(f"{op}: input_ids, labels and position_ids must have the same number of tokens")
    if cu_seqlens.numel() < 1 or cu_seqlens_padded.numel() != cu_seqlens.numel():
        raise ValueError(f"{op}: cu_seqlens and cu_seqlens_padded must have the same length (>= 1)")
    if seg_src is not None and seg_src.numel() != cu_seqlens.numel() - 1:
        raise ValueError(f"{op}: seg_src needs one entry per segment of cu_seqlens ({cu_seqlens.numel() - 1}), "
                         f"got {seg_src.numel()}")
    for t in (labels, position_ids, cu_seqlens, cu_seqlens_padded, seg_src):
        if t is None:
            continue
        if t.device != input_ids.device:
            raise ValueError(f"{op}: every input must be on the same device")
    if input_ids.device.type == "cpu" and not _interpreting():
        raise ValueError(f"{op}: CPU tensors; the Triton kernels need GPU tensors (or TRITON_INTERPRET=1)")


@triton_op("packkit::triton_cp_shard", mutates_args=())
def cp_shard(input_ids: torch.Tensor, labels: torch.Tensor, position_ids: Optional[torch.Tensor],
             cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int, zigzag: bool,
             out_len: int, pad_id: int = 0, ignore_index: int = -100, seg_src: Optional[torch.Tensor] = None,
             position_start: int = 0, first_label: Optional[int] = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One CP rank's shard in one launch: (input_ids, labels, shift_labels, position_ids, src_index, seg_idx);
    see ``packkit::cp_shard`` (with ``seg_src``: fused pack + shard straight from the unpacked source)."""
    _check(input_ids, labels, position_ids, cu_seqlens, cu_seqlens_padded, cp_size, cp_rank, out_len, seg_src,
           first_label)
    fused = seg_src is not None
    device = input_ids.device
    outs = (torch.empty(out_len, dtype=input_ids.dtype, device=device),
            torch.empty(out_len, dtype=labels.dtype, device=device),
            torch.empty(out_len, dtype=labels.dtype, device=device),
            torch.empty(out_len, dtype=torch.int64, device=device),
            torch.empty(out_len, dtype=torch.int64, device=device),
            torch.empty(out_len, dtype=torch.int32, device=device))
    if out_len > 0:
        block = _CONFIG["block"]
        with _device_guard(input_ids):
            wrap_triton(_cp_shard_kernel)[_grid_1d("cp_shard", out_len, block)](
                input_ids.contiguous(), labels.contiguous(), (seg_src if fused else position_ids).contiguous(),
                cu_seqlens.contiguous(), cu_seqlens_padded.contiguous(),
                (seg_src if fused else position_ids).contiguous(), *outs, cu_seqlens.numel() - 1, input_ids.numel(),
                cp_size, cp_rank, out_len, pad_id, ignore_index, input_ids.numel(), position_start,
                0 if first_label is None else first_label, ZIGZAG=bool(zigzag), FUSED=fused,
                HAS_FIRST=first_label is not None, BLOCK=block, num_warps=_CONFIG["num_warps"])
    return outs
