"""``packkit::triton_pack`` / ``triton_pack_out``: any tensor [tokens, *feature] into packed rows.

Each program owns a tile of BLOCK_P output (packed) positions and finds each position's output
segment with a branchless binary search over ``cu_seqlens`` (floor(log2(num_segments)) + 1 vector
gather steps, the step count computed in the kernel), then gathers whole token records, BLOCK_F feature
elements at a time. Any dtype is copied as same-width integers (16-byte dtypes as 2 x int64), pad/first
values as bit patterns made by torch's own conversion. 1 launch (after the layout).

Importing this module registers the whole family (``packkit::triton_layout``, ``_pack``,
``_pack_batch``, ``_unpack``, ``_unpack_padded`` and their ``_out`` variants): it is the import path
packkit and its tests use, and it re-exports every op.
"""
from __future__ import annotations

from typing import Optional
import torch

from .common import tl, triton  # the one guarded triton import (common.py), for every op family

from torch.library import triton_op, wrap_triton

from .checks import (_check_disjoint, _check_index, _check_output, _check_same_device, _check_segment_args,
                     _checked_total_tokens, _rows_of)
from .common import _CONFIG, _device_guard, _grid_1d, _i64, _pattern, _source_rows, _tiles, _value_words, _words

@triton.jit(do_not_specialize=["pad0", "pad1", "first0", "first1"])
def _pack_kernel(src_ptr, out_ptr, src_offsets_ptr, seg_seq_ptr, seg_start_ptr, cu_ptr, cu_seg_ptr, num_positions,
                 F, num_src_tokens, num_sequences, num_segments, num_out, pad0, pad1, first0, first1,
                 HAS_FIRST: tl.constexpr, WORDS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_F: tl.constexpr):
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)  # int64: the last program may pass 2^31
    p_ok = p < num_positions
    k, off, is_seg, src_ok, src_row = _source_rows(src_offsets_ptr, p, p_ok, cu_ptr, cu_seg_ptr, seg_seq_ptr,
                                                   seg_start_ptr, num_out, num_segments, num_sequences,
                                                   num_src_tokens)
    is_first = is_seg & (off == 0)
    src_base = src_row * F
    out_base = p.to(tl.int64) * F
    for f0 in range(0, _i64(F), BLOCK_F):
        f = f0 + tl.arange(0, BLOCK_F)
        f_ok = f < F
        vals = tl.load(src_ptr + src_base[:, None] + f[None, :], mask=src_ok[:, None] & f_ok[None, :], other=0)
        vals = tl.where(src_ok[:, None], vals, _pattern(pad0, pad1, f, WORDS, dtype)[None, :])
        if HAS_FIRST:
            vals = tl.where(is_first[:, None], _pattern(first0, first1, f, WORDS, dtype)[None, :], vals)
        tl.store(out_ptr + out_base[:, None] + f[None, :], vals, mask=p_ok[:, None] & f_ok[None, :])


def _pack_into(op, src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, num_rows, row_len, flat, pad_value,
               first_value, out):
    _check_index(op, src_offsets, "src_offsets", torch.int64)
    _check_segment_args(op, src, seg_seq, seg_start, cu_seqlens, cu_seg)
    _check_same_device(op, src, src_offsets, "the data", "src_offsets")
    total = _checked_total_tokens(op, num_rows, row_len, flat)
    if src_offsets.numel() < 1:
        raise ValueError(f"packkit::triton_{op}: src_offsets needs num_sequences + 1 >= 1 entries")
    src = src.contiguous()
    src_words, words_per_elem = _words(op, src, "src")
    pad = _value_words(op, pad_value, src.dtype, "pad_value")
    first = _value_words(op, first_value, src.dtype, "first_value") if first_value is not None else (0, 0)
    out_words, _ = _words(op, out, "out")
    features = words_per_elem
    for d in src.shape[1:]:
        features *= d
    if total == 0 or features == 0:
        return
    block_p, block_f = _tiles(features)
    with _device_guard(src):
        wrap_triton(_pack_kernel)[_grid_1d(op, total, block_p)](
            src_words, out_words, src_offsets.contiguous(), seg_seq.contiguous(), seg_start.contiguous(),
            cu_seqlens.contiguous(), cu_seg.contiguous(), total, features, src.shape[0], src_offsets.numel() - 1,
            seg_seq.numel(), cu_seg.numel(), pad[0], pad[1], first[0], first[1], HAS_FIRST=first_value is not None,
            WORDS=words_per_elem, BLOCK_P=block_p, BLOCK_F=block_f, num_warps=_CONFIG["num_warps"])


def _check_src(op, src):
    if not isinstance(src, torch.Tensor) or src.dim() < 1:
        raise ValueError(f"packkit::triton_{op}: src must be [tokens, *feature], got a 0-d tensor")


@triton_op("packkit::triton_pack", mutates_args=())
def pack(src: torch.Tensor, src_offsets: torch.Tensor, seg_seq: torch.Tensor, seg_start: torch.Tensor,
         cu_seqlens: torch.Tensor, cu_seg: torch.Tensor, num_rows: int, row_len: int, flat: bool,
         pad_value: float = 0.0, first_value: Optional[float] = None) -> torch.Tensor:
    """src [T_src, *feature] (any dtype) into [num_rows, row_len, *feature] ([row_len, *feature] if flat);
    see ``packkit::pack``."""
    _check_src("pack", src)
    _checked_total_tokens("pack", num_rows, row_len, flat)
    shape = ((row_len,) if flat else (num_rows, row_len)) + tuple(src.shape[1:])
    out = torch.empty(shape, dtype=src.dtype, device=src.device)
    _pack_into("pack", src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, num_rows, row_len, flat, pad_value,
               first_value, out)
    return out


@triton_op("packkit::triton_pack_out", mutates_args={"out"})
def pack_out(src: torch.Tensor, src_offsets: torch.Tensor, seg_seq: torch.Tensor, seg_start: torch.Tensor,
             cu_seqlens: torch.Tensor, cu_seg: torch.Tensor, flat: bool, out: torch.Tensor, pad_value: float = 0.0,
             first_value: Optional[float] = None) -> None:
    """``pack`` into a caller-owned ``out`` (num_rows, row_len from its shape); see ``packkit::pack_out``."""
    op = "pack_out"
    _check_src(op, src)
    num_rows, row_len = _rows_of(op, out, flat, src.dim() - 1, "out")
    shape = ((row_len,) if flat else (num_rows, row_len)) + tuple(src.shape[1:])
    _check_output(op, out, "out", src, src.dtype, shape)
    _check_disjoint(op, [("out", out)], [("src", src), ("src_offsets", src_offsets), ("seg_seq", seg_seq),
                                         ("seg_start", seg_start), ("cu_seqlens", cu_seqlens), ("cu_seg", cu_seg)])
    _pack_into(op, src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, num_rows, row_len, flat, pad_value,
               first_value, out)


# The rest of the family, so that importing this module registers every packkit::triton_* op.
from .layout import layout, layout_out  # noqa: E402
from .pack_batch import pack_batch, pack_batch_out  # noqa: E402
from .unpack import unpack, unpack_out, unpack_padded, unpack_padded_out  # noqa: E402

__all__ = ["layout", "pack", "pack_batch", "unpack", "unpack_padded", "layout_out", "pack_out", "pack_batch_out",
           "unpack_out", "unpack_padded_out"]
