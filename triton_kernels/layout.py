"""``packkit::triton_layout`` / ``triton_layout_out``: the output segments of a plan laid out in rows.

One program walks the plan once, BLOCK items at a time. The items are the segments with one
end-of-row marker after each row's segments (row b's marker is item ``g[b] = bin_offsets[b + 1] + b``),
so a block's rows are found by a short vectorised binary search (the rows of a block of BLOCK items
lie in ``[row of the previous item, that + BLOCK]``). Running carries across blocks: the token count
(``tl.cumsum``), the start of the current row (a running maximum, ``tl.associative_scan``), the output
segment count and the current row. 1 launch.
"""
from __future__ import annotations

import torch

from .common import tl, triton  # the one guarded triton import (common.py), for every op family

from torch.library import triton_op, wrap_triton

from .checks import _check_disjoint, _check_layout_args, _check_output
from .common import _CONFIG, _device_guard, _i64, _pow2_at_least

@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _row_end(bin_offsets_ptr, row, num_bins, num_segments, FLAT: tl.constexpr):
    """Index of the first segment after row ``row`` (its bin's end; num_segments when flat)."""
    if FLAT:
        return tl.zeros_like(row) + num_segments
    else:
        idx = tl.minimum(row + 1, num_bins)
        return tl.load(bin_offsets_ptr + idx)


@triton.jit
def _layout_kernel(seg_length_ptr, bin_offsets_ptr, cu_ptr, cu_seg_ptr, num_segments, num_bins, num_rows,
                   row_len, num_items, num_out, total, FLAT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK).to(tl.int64)
    top = _pow2_at_least(num_rows, BLOCK)
    carry_tokens = tl.zeros([], tl.int64)  # sum of the lengths of the segments seen so far
    carry_base = tl.zeros([], tl.int64)  # tokens before the current row's first segment
    carry_k = tl.zeros([], tl.int64)  # output segments emitted so far
    carry_row = tl.zeros([], tl.int64)  # row of the last item seen
    for i0 in range(0, _i64(num_items), BLOCK):  # int64: an i32 counter wraps near 2^31, never ending
        i = i0 + offs
        valid = i < num_items
        if FLAT:
            row = tl.zeros([BLOCK], tl.int64)
            row_first = tl.zeros([BLOCK], tl.int64)
        else:
            # row(i) = first row b with g[b] >= i, g[b] = bin_offsets[min(b+1, B)] + b. Searched as
            # 1 + the last r in [lo - 1, hi - 1] with g[r] < i (g[lo - 1] < i holds).
            lo = carry_row
            hi = tl.minimum(carry_row + BLOCK, num_rows - 1)
            r = tl.zeros([BLOCK], tl.int64) + (lo - 1)
            step = top
            while step > 0:
                cand = r + step
                in_range = cand < hi
                g = tl.load(bin_offsets_ptr + tl.minimum(cand + 1, num_bins), mask=in_range, other=0) + cand
                r = tl.where(in_range & (g < i), cand, r)
                step = step // 2
            row = r + 1
            prev_end = tl.load(bin_offsets_ptr + tl.minimum(row, num_bins), mask=row > 0, other=0)
            row_first = tl.where(row > 0, prev_end + row, 0)  # g[row - 1] + 1
        end = _row_end(bin_offsets_ptr, row, num_bins, num_segments, FLAT)
        is_marker = valid & (end + row == i)
        j = i - row
        is_seg = valid & (end + row != i) & (j >= 0) & (j < num_segments)
        length = tl.load(seg_length_ptr + j, mask=is_seg, other=0)
        incl = tl.cumsum(length, 0) + carry_tokens
        excl = incl - length
        starts = tl.where(valid & (i == row_first), excl, -1)
        base = tl.maximum(tl.associative_scan(starts, 0, _max_combine), carry_base)
        in_row = excl - base
        emit = is_seg | (is_marker & (in_row < row_len))
        emit64 = emit.to(tl.int64)
        k = tl.cumsum(emit64, 0) - emit64 + carry_k
        ok = emit & (k < num_out)
        tl.store(cu_ptr + k, (row * row_len + in_row).to(tl.int32), mask=ok)
        tl.store(cu_seg_ptr + k, tl.where(is_seg, j, -1).to(tl.int32), mask=ok)
        carry_tokens += tl.sum(length, 0)
        carry_k += tl.sum(emit64, 0)
        carry_base = tl.maximum(carry_base, tl.max(starts, 0))
        carry_row = tl.maximum(carry_row, tl.max(tl.where(valid, row, 0), 0))
    # num_out larger than the plan's segment count (an inconsistent call): empty padding segments,
    # so every output element is defined.
    for k0 in range(0, _i64(num_out), BLOCK):
        k = k0 + offs
        rest = (k >= carry_k) & (k < num_out)
        tl.store(cu_ptr + k, tl.zeros([BLOCK], tl.int32) + total, mask=rest)
        tl.store(cu_seg_ptr + k, tl.full([BLOCK], -1, tl.int32), mask=rest)
    tl.store(cu_ptr + num_out, total)


def _launch_layout(seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens, total, cu, cu_seg):
    num_segments = seg_length.numel()
    num_bins = bin_offsets.numel() - 1
    num_items = num_segments + num_rows if num_rows > 0 else 0
    with _device_guard(seg_length):
        wrap_triton(_layout_kernel)[(1,)](
            seg_length, bin_offsets, cu, cu_seg, num_segments, num_bins, num_rows, row_len, num_items,
            num_cu_seqlens - 1, total, FLAT=bool(flat), BLOCK=_CONFIG["layout_block"], num_warps=_CONFIG["num_warps"])


def _layout_into(op, seg_length, bin_offsets, num_rows, row_len, flat, cu, cu_seg):
    total = _check_layout_args(op, seg_length, bin_offsets, num_rows, row_len, flat, cu.numel())
    _launch_layout(seg_length.contiguous(), bin_offsets.contiguous(), num_rows, row_len, flat, cu.numel(), total, cu,
                   cu_seg)


@triton_op("packkit::triton_layout", mutates_args=())
def layout(seg_length: torch.Tensor, bin_offsets: torch.Tensor, num_rows: int, row_len: int, flat: bool,
           num_cu_seqlens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Output segments of a plan laid out in rows: (cu_seqlens int32 [num_cu_seqlens], cu_seg int32
    [num_cu_seqlens - 1]); see ``packkit::layout``."""
    _check_layout_args("layout", seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens)
    cu = torch.empty(num_cu_seqlens, dtype=torch.int32, device=seg_length.device)
    cu_seg = torch.empty(num_cu_seqlens - 1, dtype=torch.int32, device=seg_length.device)
    _layout_into("layout", seg_length, bin_offsets, num_rows, row_len, flat, cu, cu_seg)
    return cu, cu_seg


@triton_op("packkit::triton_layout_out", mutates_args={"cu_seqlens", "cu_seg"})
def layout_out(seg_length: torch.Tensor, bin_offsets: torch.Tensor, num_rows: int, row_len: int, flat: bool,
               cu_seqlens: torch.Tensor, cu_seg: torch.Tensor) -> None:
    """``layout`` into caller-owned outputs (num_cu_seqlens = len(cu_seqlens)); see ``packkit::layout_out``."""
    op = "layout_out"
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"packkit::triton_{op}: cu_seqlens must be 1-D int32 [num_cu_seqlens >= 1]")
    n = cu_seqlens.numel()
    _check_layout_args(op, seg_length, bin_offsets, num_rows, row_len, flat, n)
    _check_output(op, cu_seqlens, "cu_seqlens", seg_length, torch.int32, (n,))
    _check_output(op, cu_seg, "cu_seg", seg_length, torch.int32, (n - 1,))
    _check_disjoint(op, [("cu_seqlens", cu_seqlens), ("cu_seg", cu_seg)],
                    [("seg_length", seg_length), ("bin_offsets", bin_offsets)])
    _layout_into(op, seg_length, bin_offsets, num_rows, row_len, flat, cu_seqlens, cu_seg)
