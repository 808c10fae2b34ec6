"""``packkit::triton_unpack`` / ``triton_unpack_padded`` and their ``_out`` variants: packed rows back
to source order ([tokens, *feature]) or to one padded row per sequence ([sequences, max_len, *feature]).

Two launches: a fill with pad_value, then a scatter in which each program owns a tile of packed
positions (the same segment search as ``pack``) and writes whole token records, BLOCK_F words at a time."""
from __future__ import annotations

import torch

from .common import tl, triton  # the one guarded triton import (common.py), for every op family

from torch.library import triton_op, wrap_triton

from .checks import (_check_disjoint, _check_index, _check_output, _check_same_device, _check_segment_args,
                     _packed_tokens)
from .common import _CONFIG, _device_guard, _grid_1d, _i64, _locate, _pattern, _tiles, _value_words, _words

@triton.jit(do_not_specialize=["pad0", "pad1"])
def _fill_kernel(out_ptr, n, pad0, pad1, WORDS: tl.constexpr, BLOCK: tl.constexpr):
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + e, _pattern(pad0, pad1, e, WORDS, dtype), mask=e < n)


@triton.jit
def _unpack_kernel(packed_ptr, out_ptr, src_offsets_ptr, seg_seq_ptr, seg_start_ptr, cu_ptr, cu_seg_ptr,
                   num_positions, F, num_segments, num_out, num_sequences, num_dest_tokens, max_len,
                   PADDED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_F: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)  # int64: the last program may pass 2^31
    p_ok = p < num_positions
    k, is_seg, seq_ok, seq, seg_start, off = _locate(cu_ptr, cu_seg_ptr, seg_seq_ptr, seg_start_ptr, p, p_ok,
                                                     num_out, num_segments, num_sequences)
    if PADDED:
        t = seg_start + off
        dest_ok = seq_ok & (t >= 0) & (t < max_len)
        dest = seq * max_len + t
    else:
        base = tl.load(src_offsets_ptr + seq, mask=seq_ok, other=0)
        dest = base + seg_start + off
        dest_ok = seq_ok & (dest >= 0) & (dest < num_dest_tokens)
    dest_base = dest * F
    src_base = p.to(tl.int64) * F
    for f0 in range(0, _i64(F), BLOCK_F):
        f = f0 + tl.arange(0, BLOCK_F)
        f_ok = f < F
        vals = tl.load(packed_ptr + src_base[:, None] + f[None, :], mask=dest_ok[:, None] & f_ok[None, :], other=0)
        tl.store(out_ptr + dest_base[:, None] + f[None, :], vals, mask=dest_ok[:, None] & f_ok[None, :])


def _launch_fill(op, out_words, words_per_elem, pad):
    n = out_words.numel()
    if n == 0:
        return
    block = _CONFIG["block"]
    with _device_guard(out_words):
        wrap_triton(_fill_kernel)[_grid_1d(op, n, block)](
            out_words, n, pad[0], pad[1], WORDS=words_per_elem, BLOCK=block, num_warps=_CONFIG["num_warps"])


def _launch_unpack(op, packed, flat, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, out, num_sequences,
                   num_dest_tokens, max_len, pad_value, padded):
    tokens = _packed_tokens(op, packed, flat)
    packed = packed.contiguous()
    packed_words, words_per_elem = _words(op, packed, "packed")
    out_words, _ = _words(op, out, "out")
    _launch_fill(op, out_words, words_per_elem, _value_words(op, pad_value, packed.dtype, "pad_value"))
    features = words_per_elem
    for d in packed.shape[1 if flat else 2:]:
        features *= d
    if tokens == 0 or features == 0 or out_words.numel() == 0:
        return
    block_p, block_f = _tiles(features)
    with _device_guard(packed):
        wrap_triton(_unpack_kernel)[_grid_1d(op, tokens, block_p)](
            packed_words, out_words, src_offsets, seg_seq.contiguous(), seg_start.contiguous(),
            cu_seqlens.contiguous(), cu_seg.contiguous(), tokens, features, seg_seq.numel(), cu_seg.numel(),
            num_sequences, num_dest_tokens, max_len, PADDED=padded, BLOCK_P=block_p, BLOCK_F=block_f,
            num_warps=_CONFIG["num_warps"])


def _check_unpack_args(op, packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat):
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"packkit::triton_{op}: packed must be a tensor")
    if src_offsets is not None:
        _check_index(op, src_offsets, "src_offsets", torch.int64)
    _check_segment_args(op, packed, seg_seq, seg_start, cu_seqlens, cu_seg)
    if src_offsets is not None:
        _check_same_device(op, packed, src_offsets, "the data", "src_offsets")
    _packed_tokens(op, packed, flat)
    if src_offsets is not None and src_offsets.numel() < 1:
        raise ValueError(f"packkit::triton_{op}: src_offsets needs num_sequences + 1 >= 1 entries")


def _unpack_into(op, packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out):
    """Flat unpack (src_offsets given) into out [num_src_tokens, *f], or padded (None) into
    out [num_sequences, max_len, *f]."""
    if src_offsets is not None:
        _launch_unpack(op, packed, flat, src_offsets.contiguous(), seg_seq, seg_start, cu_seqlens, cu_seg, out,
                       src_offsets.numel() - 1, out.shape[0], 0, pad_value, False)
    else:
        num_sequences, max_len = out.shape[0], out.shape[1]
        # seg_seq doubles as the (unused) src_offsets pointer: PADDED never reads it.
        _launch_unpack(op, packed, flat, seg_seq, seg_seq, seg_start, cu_seqlens, cu_seg, out, num_sequences,
                       num_sequences * max_len, max_len, pad_value, True)


def _check_unpack_output(op, packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, out):
    feature = tuple(packed.shape[1 if flat else 2:])
    lead = 1 if src_offsets is not None else 2
    if not isinstance(out, torch.Tensor) or out.dim() != lead + len(feature):
        raise ValueError(f"packkit::triton_{op}: out must have {lead + len(feature)} dims")
    _check_output(op, out, "out", packed, packed.dtype, tuple(out.shape[:lead]) + feature)
    _check_disjoint(op, [("out", out)], [("packed", packed), ("src_offsets", src_offsets), ("seg_seq", seg_seq),
                                         ("seg_start", seg_start), ("cu_seqlens", cu_seqlens), ("cu_seg", cu_seg)])


@triton_op("packkit::triton_unpack", mutates_args=())
def unpack(packed: torch.Tensor, src_offsets: torch.Tensor, seg_seq: torch.Tensor, seg_start: torch.Tensor,
           cu_seqlens: torch.Tensor, cu_seg: torch.Tensor, flat: bool, num_src_tokens: int,
           pad_value: float = 0.0) -> torch.Tensor:
    """Inverse of pack: [num_src_tokens, *feature] in source order; tokens no segment covers get
    pad_value. See ``packkit::unpack``."""
    op = "unpack"
    _check_unpack_args(op, packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat)
    if num_src_tokens < 0:
        raise ValueError(f"packkit::triton_{op}: num_src_tokens must be >= 0, got {num_src_tokens}")
    feature = tuple(packed.shape[1 if flat else 2:])
    out = torch.empty((num_src_tokens,) + feature, dtype=packed.dtype, device=packed.device)
    _unpack_into(op, packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out)
    return out


@triton_op("packkit::triton_unpack_out", mutates_args={"out"})
def unpack_out(packed: torch.Tensor, src_offsets: torch.Tensor, seg_seq: torch.Tensor, seg_start: torch.Tensor,
               cu_seqlens: torch.Tensor, cu_seg: torch.Tensor, flat: bool, out: torch.Tensor,
               pad_value: float = 0.0) -> None:
    """``unpack`` into a caller-owned ``out`` [num_src_tokens, *feature]; see ``packkit::unpack_out``."""
    op = "unpack_out"
    _check_unpack_args(op, packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat)
    _check_unpack_output(op, packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, out)
    _unpack_into(op, packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out)


@triton_op("packkit::triton_unpack_padded", mutates_args=())
def unpack_padded(packed: torch.Tensor, seg_seq: torch.Tensor, seg_start: torch.Tensor, cu_seqlens: torch.Tensor,
                  cu_seg: torch.Tensor, flat: bool, num_sequences: int, max_len: int,
                  pad_value: float = 0.0) -> torch.Tensor:
    """Inverse of pack into [num_sequences, max_len, *feature] (tokens past max_len are dropped,
    uncovered ones get pad_value). See ``packkit::unpack_padded``."""
    op = "unpack_padded"
    _check_unpack_args(op, packed, None, seg_seq, seg_start, cu_seqlens, cu_seg, flat)
    if num_sequences < 0 or max_len < 0:
        raise ValueError(f"packkit::triton_{op}: num_sequences and max_len must be >= 0, got {num_sequences} and "
                         f"{max_len}")
    feature = tuple(packed.shape[1 if flat else 2:])
    out = torch.empty((num_sequences, max_len) + feature, dtype=packed.dtype, device=packed.device)
    _unpack_into(op, packed, None, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out)
    return out


@triton_op("packkit::triton_unpack_padded_out", mutates_args={"out"})
def unpack_padded_out(packed: torch.Tensor, seg_seq: torch.Tensor, seg_start: torch.Tensor, cu_seqlens: torch.Tensor,
                      cu_seg: torch.Tensor, flat: bool, out: torch.Tensor, pad_value: float = 0.0) -> None:
    """``unpack_padded`` into a caller-owned ``out`` [num_sequences, max_len, *feature]; see
    ``packkit::unpack_padded_out``."""
    op = "unpack_padded_out"
    _check_unpack_args(op, packed, None, seg_seq, seg_start, cu_seqlens, cu_seg, flat)
    _check_unpack_output(op, packed, None, seg_seq, seg_start, cu_seqlens, cu_seg, flat, out)
    _unpack_into(op, packed, None, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out)
