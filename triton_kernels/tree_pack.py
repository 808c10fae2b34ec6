"""Triton implementation of ``packkit::tree_pack``: ``torch.ops.packkit.triton_tree_pack``.

Semantics (bit for bit) are those of ``tests/tree_pack_reference.py`` and the C++ op (``csrc/ops/tree_pack_op.cpp``;
index math in ``csrc/ops/tree_pack.hpp``): a packed prefix forest. One launch: each program owns BLOCK work items,
output tokens first (a branchless binary search of each token's node among its row's nodes), then the
``cu_seqlens`` entries. Checks are metadata only; every load is masked and every index bounded, so an
inconsistent layout gives padding values, never an out-of-bounds access. Nothing is read back to the host.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
from torch.library import triton_op, wrap_triton

from .common import _INT32_MAX, _device_guard, _grid_1d, tl, triton

__all__ = ["tree_pack"]

_CONFIG = {"block": 1024, "num_warps": 4}  # tests shrink block to cover many programs


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _last_at_most(keys_ptr, lo, hi, x, ok, top, ADD_INDEX: tl.constexpr):
    """Per lane: the last k in [lo, hi) with keys[k] (+ k if ADD_INDEX) <= x, or lo - 1; keys non-decreasing."""
    base = lo - 1
    step = top
    while step > 0:
        cand = base + step
        in_range = ok & (cand < hi) & (cand >= lo)
        val = tl.load(keys_ptr + tl.where(in_range, cand, 0), mask=in_range, other=0).to(tl.int64)
        if ADD_INDEX:
            val = val + cand
        base = tl.where(in_range & (val <= x), cand, base)
        step = step // 2
    return base


@triton.jit(do_not_specialize=["num_src", "m", "num_rows", "row_len", "pad_id", "ignore_index", "top_m", "top_r"])
def _tree_pack_kernel(ids_ptr, labels_ptr, src_ptr, dst_ptr, len_ptr, pos_ptr, end_ptr, ro_ptr, out_ids_ptr,
                      out_labels_ptr, out_pos_ptr, out_node_ptr, out_end_ptr, cu_ptr, num_src, m, num_rows, row_len,
                      pad_id, ignore_index, top_m, top_r, BLOCK: tl.constexpr):
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    total = num_rows.to(tl.int64) * row_len
    work = total + m + num_rows + 1
    is_tok = j < total
    is_cu = (j >= total) & (j < work)
    # --- tokens -----------------------------------------------------------------------------------------
    r = tl.where(is_tok, j // tl.maximum(row_len, 1), 0)
    lo = tl.load(ro_ptr + r, mask=is_tok, other=0).to(tl.int64)
    hi = tl.load(ro_ptr + r + 1, mask=is_tok, other=0).to(tl.int64)
    lo = tl.minimum(tl.maximum(lo, 0), m)
    hi = tl.minimum(tl.maximum(hi, lo), m)
    i = _last_at_most(dst_ptr, lo, hi, j, is_tok, top_m, ADD_INDEX=False)
    has = is_tok & (i >= lo)
    i_safe = tl.where(has, i, 0)
    d = tl.load(dst_ptr + i_safe, mask=has, other=0)
    n = tl.load(len_ptr + i_safe, mask=has, other=0)
    o = j - d
    s = tl.load(src_ptr + i_safe, mask=has, other=0)
    q = s + o
    real = has & (o >= 0) & (o < n) & (q >= 0) & (q < num_src)
    q_safe = tl.where(real, q, 0)
    ids_dtype: tl.constexpr = out_ids_ptr.dtype.element_ty
    labels_dtype: tl.constexpr = out_labels_ptr.dtype.element_ty
    ids = tl.load(ids_ptr + q_safe, mask=real, other=0)
    lab = tl.load(labels_ptr + q_safe, mask=real, other=0)
    npos = tl.load(pos_ptr + i_safe, mask=real, other=0)
    nend = tl.load(end_ptr + i_safe, mask=real, other=0)
    last_ok = is_tok & (hi > lo)
    last = tl.where(last_ok, hi - 1, 0)
    tail = tl.where(last_ok, tl.load(dst_ptr + last, mask=last_ok, other=0) + tl.load(len_ptr + last, mask=last_ok,
                                                                                       other=0), r * row_len)
    tl.store(out_ids_ptr + j, tl.where(real, ids, pad_id.to(ids_dtype)), mask=is_tok)
    tl.store(out_labels_ptr + j, tl.where(real, lab, ignore_index.to(labels_dtype)), mask=is_tok)
    tl.store(out_pos_ptr + j, tl.where(real, npos + o, tl.where(j >= tail, j - tail, 0)), mask=is_tok)
    tl.store(out_node_ptr + j, tl.where(real, i, -1).to(tl.int32), mask=is_tok)
    tl.store(out_end_ptr + j, tl.where(real, nend, row_len).to(tl.int32), mask=is_tok)
    # --- cu_seqlens entries (see tree::cu_entry) -----------------------------------------------------------
    e = j - total
    zero = tl.zeros_like(e)
    rows_ok = is_cu & (e < m + num_rows) & ((zero + num_rows) > 0)
    rr = _last_at_most(ro_ptr, zero, zero + num_rows, e, rows_ok, top_r, ADD_INDEX=True)
    rr = tl.minimum(tl.maximum(rr, 0), tl.maximum(num_rows - 1, 0))
    clo = tl.load(ro_ptr + rr, mask=rows_ok, other=0).to(tl.int64)
    chi = tl.load(ro_ptr + rr + 1, mask=rows_ok, other=0).to(tl.int64)
    clo = tl.minimum(tl.maximum(clo, 0), m)
    chi = tl.minimum(tl.maximum(chi, clo), m)
    node = e - rr
    is_node = rows_ok & (node >= clo) & (node < chi)
    node_start = tl.load(dst_ptr + tl.where(is_node, node, 0), mask=is_node, other=0)
    full = rows_ok & ~is_node & (chi > clo)
    cl = tl.where(full, chi - 1, 0)
    row_end = tl.load(dst_ptr + cl, mask=full, other=0) + tl.load(len_ptr + cl, mask=full, other=0)
    value = tl.where(is_node, node_start, tl.where(full, row_end, rr * row_len))
    value = tl.where(rows_ok, value, total)
    tl.store(cu_ptr + tl.where(is_cu, e, 0), value.to(tl.int32), mask=is_cu)


def _check(input_ids, labels, nodes, row_offsets, num_rows, row_len):
    op = "packkit::triton_tree_pack"
    if input_ids.dim() != 1 or input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{op}: input_ids must be a flat 1-D int64 or int32 tensor")
    if labels is not None and (labels.dim() != 1 or labels.numel() != input_ids.numel()
                               or labels.dtype not in (torch.int64, torch.int32)):
        raise ValueError(f"{op}: labels must be 1-D int64 or int32 with one label per source token")
    m = nodes[0].numel()
    for name, t in zip(("node_src", "node_dst", "node_len", "node_pos", "node_end"), nodes):
        if t.dim() != 1 or t.dtype != torch.int64 or t.numel() != m:
            raise ValueError(f"{op}: {name} must be 1-D int64 with one entry per node ({m})")
    if row_offsets.dim() != 1 or row_offsets.dtype != torch.int64 or row_offsets.numel() != num_rows + 1:
        raise ValueError(f"{op}: row_offsets must be 1-D int64 with num_rows + 1 = {num_rows + 1} entries")
    if num_rows < 0 or row_len < 0 or num_rows * row_len > _INT32_MAX or m + num_rows >= _INT32_MAX:
        raise ValueError(f"{op}: num_rows * row_len must be in [0, 2^31), got {num_rows} * {row_len}")
    for t in (labels, *nodes, row_offsets):
        if t is not None and t.device != input_ids.device:
            raise ValueError(f"{op}: every input must be on the same device")
    if input_ids.device.type == "cpu" and not _interpreting():
        raise ValueError(f"{op}: CPU tensors; the Triton kernels need GPU tensors (or TRITON_INTERPRET=1)")


def _pow2_at_least(n: int) -> int:
    top = 1
    while top < n:
        top *= 2
    return top


@triton_op("packkit::triton_tree_pack", mutates_args=())
def tree_pack(input_ids: torch.Tensor, labels: Optional[torch.Tensor], node_src: torch.Tensor, node_dst: torch.Tensor,
              node_len: torch.Tensor, node_pos: torch.Tensor, node_end: torch.Tensor, row_offsets: torch.Tensor,
              num_rows: int, row_len: int, pad_id: int = 0, ignore_index: int = -100
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A packed prefix forest in one launch; see ``packkit::tree_pack``."""
    nodes = (node_src, node_dst, node_len, node_pos, node_end)
    _check(input_ids, labels, nodes, row_offsets, num_rows, row_len)
    label_src = input_ids if labels is None else labels
    device, shape, m = input_ids.device, (num_rows, row_len), node_src.numel()
    outs = (torch.empty(shape, dtype=input_ids.dtype, device=device),
            torch.empty(shape, dtype=label_src.dtype, device=device),
            torch.empty(shape, dtype=torch.int64, device=device),
            torch.empty(shape, dtype=torch.int32, device=device),
            torch.empty(shape, dtype=torch.int32, device=device),
            torch.empty(m + num_rows + 1, dtype=torch.int32, device=device))
    work = num_rows * row_len + m + num_rows + 1
    block = _CONFIG["block"]
    with _device_guard(input_ids):
        wrap_triton(_tree_pack_kernel)[_grid_1d("tree_pack", work, block)](
            input_ids.contiguous(), label_src.contiguous(), *(t.contiguous() for t in nodes), row_offsets.contiguous(),
            *outs, input_ids.numel(), m, num_rows, row_len, pad_id, ignore_index, _pow2_at_least(m),
            _pow2_at_least(num_rows), BLOCK=block, num_warps=_CONFIG["num_warps"])
    return outs
