"""``packkit::triton_pack_batch`` / ``triton_pack_batch_out``: the training batch (input_ids, labels,
position_ids, seq_idx, cu_seqlens) in two launches: the layout, then one fused gather pass over the
packed positions (the same segment search as ``pack``)."""
from __future__ import annotations

from typing import Optional
import torch

from .common import tl, triton  # the one guarded triton import (common.py), for every op family

from torch.library import triton_op, wrap_triton

from .checks import (_check_device, _check_disjoint, _check_index, _check_layout_args, _check_output,
                     _check_same_device, _rows_of)
from .common import _CONFIG, _device_guard, _grid_1d, _source_rows, _value_words
from .layout import _launch_layout

@triton.jit(do_not_specialize=["pad_id", "ignore_index", "position_start"])
def _pack_batch_kernel(ids_ptr, labels_ptr, src_offsets_ptr, seg_seq_ptr, seg_start_ptr, cu_ptr, cu_seg_ptr,
                       out_ids_ptr, out_labels_ptr, out_pos_ptr, out_seq_idx_ptr, num_positions, num_src_tokens,
                       num_sequences, num_segments, num_out, pad_id, ignore_index, position_start,
                       MASK_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: the last program may pass 2^31
    p_ok = p < num_positions
    k, off, is_seg, src_ok, src_row = _source_rows(src_offsets_ptr, p, p_ok, cu_ptr, cu_seg_ptr, seg_seq_ptr,
                                                   seg_start_ptr, num_out, num_segments, num_sequences,
                                                   num_src_tokens)
    ids_dtype: tl.constexpr = out_ids_ptr.dtype.element_ty
    labels_dtype: tl.constexpr = out_labels_ptr.dtype.element_ty
    ids = tl.load(ids_ptr + src_row, mask=src_ok, other=0)
    ids = tl.where(src_ok, ids, pad_id.to(ids_dtype))
    labels = tl.load(labels_ptr + src_row, mask=src_ok, other=0)
    ignore = ignore_index.to(labels_dtype)
    labels = tl.where(src_ok, labels, ignore)
    if MASK_FIRST:
        labels = tl.where(is_seg & (off == 0), ignore, labels)
    tl.store(out_ids_ptr + p, ids, mask=p_ok)
    tl.store(out_labels_ptr + p, labels, mask=p_ok)
    tl.store(out_pos_ptr + p, off + position_start.to(tl.int64), mask=p_ok)
    tl.store(out_seq_idx_ptr + p, k.to(tl.int32), mask=p_ok)


def _check_tokens(op, input_ids, labels):
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
        raise ValueError(f"packkit::triton_{op}: input_ids must be 1-D (all sequences concatenated)")
    label_src = input_ids if labels is None else labels
    if label_src.dim() != 1 or label_src.shape[0] != input_ids.shape[0]:
        raise ValueError(f"packkit::triton_{op}: labels must be 1-D and as long as input_ids")
    _check_same_device(op, input_ids, label_src, "input_ids", "labels")
    for t in (input_ids, label_src):
        if t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"packkit::triton_{op}: input_ids and labels must be int64 or int32, got {t.dtype}")
    return label_src


def _pack_batch_into(op, input_ids, labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, num_rows,
                     row_len, flat, pad_id, ignore_index, mask_first_label, position_start, outs):
    label_src = _check_tokens(op, input_ids, labels)
    out_ids, out_labels, position_ids, seq_idx, cu, cu_seg = outs
    num_cu_seqlens = cu.numel()
    total = _check_layout_args(op, seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens)
    _check_index(op, src_offsets, "src_offsets", torch.int64)
    _check_index(op, seg_seq, "seg_seq", torch.int64)
    _check_index(op, seg_start, "seg_start", torch.int64)
    if seg_seq.numel() != seg_start.numel():
        raise ValueError(f"packkit::triton_{op}: seg_seq and seg_start must have the same length, got "
                         f"{seg_seq.numel()} and {seg_start.numel()}")
    if src_offsets.numel() < 1:
        raise ValueError(f"packkit::triton_{op}: src_offsets needs num_sequences + 1 >= 1 entries")
    for t, name in ((src_offsets, "src_offsets"), (seg_seq, "seg_seq"), (seg_start, "seg_start"),
                    (seg_length, "seg_length")):
        _check_same_device(op, input_ids, t, "input_ids", name)
    _check_device(op, input_ids, "input_ids")
    pad = _value_words(op, float(pad_id), input_ids.dtype, "pad_id")[0]
    ignore = _value_words(op, float(ignore_index), label_src.dtype, "ignore_index")[0]
    _launch_layout(seg_length.contiguous(), bin_offsets.contiguous(), num_rows, row_len, flat, num_cu_seqlens, total,
                   cu, cu_seg)
    if total > 0:
        block = _CONFIG["block"]
        input_ids = input_ids.contiguous()
        label_src = input_ids if labels is None else labels.contiguous()
        with _device_guard(input_ids):
            wrap_triton(_pack_batch_kernel)[_grid_1d(op, total, block)](
                input_ids, label_src, src_offsets.contiguous(), seg_seq.contiguous(), seg_start.contiguous(), cu,
                cu_seg, out_ids, out_labels, position_ids, seq_idx, total, input_ids.shape[0], src_offsets.numel() - 1,
                seg_seq.numel(), num_cu_seqlens - 1, pad, ignore, position_start, MASK_FIRST=bool(mask_first_label),
                BLOCK=block, num_warps=_CONFIG["num_warps"])


@triton_op("packkit::triton_pack_batch", mutates_args=())
def pack_batch(input_ids: torch.Tensor, labels: Optional[torch.Tensor], src_offsets: torch.Tensor,
               seg_seq: torch.Tensor, seg_start: torch.Tensor, seg_length: torch.Tensor, bin_offsets: torch.Tensor,
               num_rows: int, row_len: int, flat: bool, num_cu_seqlens: int, pad_id: int = 0,
               ignore_index: int = -100, mask_first_label: bool = True, position_start: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training batch in two launches (layout, then one fused pass): (input_ids, labels,
    position_ids int64, seq_idx int32, cu_seqlens int32); see ``packkit::pack_batch``."""
    op = "pack_batch"
    label_src = _check_tokens(op, input_ids, labels)
    _check_layout_args(op, seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens)
    device = input_ids.device
    shape = (row_len,) if flat else (num_rows, row_len)
    outs = (torch.empty(shape, dtype=input_ids.dtype, device=device),
            torch.empty(shape, dtype=label_src.dtype, device=device),
            torch.empty(shape, dtype=torch.int64, device=device), torch.empty(shape, dtype=torch.int32, device=device),
            torch.empty(num_cu_seqlens, dtype=torch.int32, device=device),
            torch.empty(num_cu_seqlens - 1, dtype=torch.int32, device=device))
    _pack_batch_into(op, input_ids, labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, num_rows,
                     row_len, flat, pad_id, ignore_index, mask_first_label, position_start, outs)
    return outs[:5]


@triton_op("packkit::triton_pack_batch_out", mutates_args={"out_input_ids", "out_labels", "out_position_ids",
                                                           "out_seq_idx", "out_cu_seqlens", "out_cu_seg"})
def pack_batch_out(input_ids: torch.Tensor, labels: Optional[torch.Tensor], src_offsets: torch.Tensor,
                   seg_seq: torch.Tensor, seg_start: torch.Tensor, seg_length: torch.Tensor,
                   bin_offsets: torch.Tensor, flat: bool, out_input_ids: torch.Tensor, out_labels: torch.Tensor,
                   out_position_ids: torch.Tensor, out_seq_idx: torch.Tensor, out_cu_seqlens: torch.Tensor,
                   out_cu_seg: torch.Tensor, pad_id: int = 0, ignore_index: int = -100,
                   mask_first_label: bool = True, position_start: int = 0) -> None:
    """``pack_batch`` into caller-owned outputs, plus the layout's cu_seg; see ``packkit::pack_batch_out``."""
    op = "pack_batch_out"
    label_src = _check_tokens(op, input_ids, labels)
    num_rows, row_len = _rows_of(op, out_input_ids, flat, 0, "out_input_ids")
    shape = (row_len,) if flat else (num_rows, row_len)
    _check_output(op, out_input_ids, "out_input_ids", input_ids, input_ids.dtype, shape)
    _check_output(op, out_labels, "out_labels", input_ids, label_src.dtype, shape)
    _check_output(op, out_position_ids, "out_position_ids", input_ids, torch.int64, shape)
    _check_output(op, out_seq_idx, "out_seq_idx", input_ids, torch.int32, shape)
    if not isinstance(out_cu_seqlens, torch.Tensor) or out_cu_seqlens.dim() != 1 or out_cu_seqlens.numel() < 1:
        raise ValueError(f"packkit::triton_{op}: out_cu_seqlens must be 1-D int32 [num_cu_seqlens >= 1]")
    n = out_cu_seqlens.numel()
    _check_output(op, out_cu_seqlens, "out_cu_seqlens", input_ids, torch.int32, (n,))
    _check_output(op, out_cu_seg, "out_cu_seg", input_ids, torch.int32, (n - 1,))
    outs = (out_input_ids, out_labels, out_position_ids, out_seq_idx, out_cu_seqlens, out_cu_seg)
    _check_disjoint(op, list(zip(("out_input_ids", "out_labels", "out_position_ids", "out_seq_idx", "out_cu_seqlens",
                                  "out_cu_seg"), outs)),
                    [("input_ids", input_ids), ("labels", label_src), ("src_offsets", src_offsets),
                     ("seg_seq", seg_seq), ("seg_start", seg_start), ("seg_length", seg_length),
                     ("bin_offsets", bin_offsets)])
    _pack_batch_into(op, input_ids, labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, num_rows,
                     row_len, flat, pad_id, ignore_index, mask_first_label, position_start, outs)
