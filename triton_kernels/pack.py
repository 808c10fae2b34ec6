"""Triton implementations of the pack op family: ``torch.ops.packkit.triton_<name>``.

Semantics (bit for bit) are those of ``tests/pack_reference.py`` and the C++ ops in
``csrc/ops/pack_op.cpp``; argument checks mirror ``csrc/ops/pack_checks.hpp`` (metadata only: shapes,
dtypes, devices). Nothing here reads a device value back to the host: every size comes from an int
argument or a tensor shape, and every kernel masks its loads and stores, so inconsistent plans give
wrong values, never out-of-bounds accesses.

Kernels (launches per op):

* ``layout``: one program walks the plan once, BLOCK items at a time. The items are the segments
  with one end-of-row marker after each row's segments (row b's marker is item
  ``g[b] = bin_offsets[b + 1] + b``), so a block's rows are found by a short vectorised binary search
  (the rows of a block of BLOCK items lie in ``[row of the previous item, that + BLOCK]``). Running
  carries across blocks: the token count (``tl.cumsum``), the start of the current row (a running
  maximum, ``tl.associative_scan``), the output segment count and the current row. 1 launch.
* ``pack`` / ``unpack`` / ``unpack_padded`` / the fused ``pack_batch`` pass: each program owns a tile
  of BLOCK_P output (packed) positions and finds each position's output segment with a branchless
  binary search over ``cu_seqlens`` (floor(log2(num_segments)) + 1 vector gather steps, the step count
  computed in the kernel), then gathers (pack) or scatters (unpack) whole token records, BLOCK_F
  feature elements at a time. Any dtype is copied as same-width integers (16-byte dtypes as 2 x
  int64), pad/first values as bit patterns made by torch's own conversion.
  pack: 1 launch; pack_batch: 2 (layout + fused ids/labels/position_ids/seq_idx); unpack and
  unpack_padded: 2 (fill with pad_value, then scatter).
"""
from __future__ import annotations

import contextlib
import struct
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - exercised only without triton
    raise ImportError(
        "packkit.triton_kernels.pack needs Triton (pip install 'packkit[triton]', or triton>=3.3)"
    ) from exc

from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op, wrap_triton

from ..planning.plan_check import check_index_tensor

__all__ = ["layout", "pack", "pack_batch", "unpack", "unpack_padded", "layout_out", "pack_out", "pack_batch_out",
           "unpack_out", "unpack_padded_out"]

_INT32_MAX = 2**31 - 1

# Tile sizes. BLOCK: elements per program in the gather/scatter kernels (positions x features);
# LAYOUT_BLOCK: items per step of the single layout program. Tests shrink them to cover many tiles.
_CONFIG = {"block": 2048, "layout_block": 1024, "max_block_f": 1024, "num_warps": 4}

# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _pow2_at_least(n, cap: tl.constexpr):
    """Smallest power of two >= min(n, cap) (and >= 1), as an int32 scalar."""
    top = tl.full([], 1, tl.int32)
    while (top < n) & (top < cap):
        top = top * 2
    return top


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
    for i0 in range(0, num_items, BLOCK):
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
    for k0 in range(0, num_out, BLOCK):
        k = k0 + offs
        rest = (k >= carry_k) & (k < num_out)
        tl.store(cu_ptr + k, tl.zeros([BLOCK], tl.int32) + total, mask=rest)
        tl.store(cu_seg_ptr + k, tl.full([BLOCK], -1, tl.int32), mask=rest)
    tl.store(cu_ptr + num_out, total)


@triton.jit
def _locate(cu_ptr, cu_seg_ptr, seg_seq_ptr, seg_start_ptr, p, p_ok, num_out, num_segments, num_sequences):
    """Output segment k of each position p (last k with cu[k] <= p), its plan segment j (-1: padding
    or invalid), the offset of p in its segment, and the segment's sequence and start."""
    top = _pow2_at_least(num_out, 1 << 30)
    k = tl.zeros_like(p)
    step = top
    while step > 0:
        cand = k + step
        in_range = cand < num_out
        c = tl.load(cu_ptr + cand, mask=in_range, other=0)
        k = tl.where(in_range & (c <= p), cand, k)
        step = step // 2
    k_ok = p_ok & (k < num_out)
    seg_begin = tl.load(cu_ptr + k, mask=k_ok, other=0)
    j = tl.load(cu_seg_ptr + k, mask=k_ok, other=-1)
    is_seg = k_ok & (j >= 0) & (j < num_segments)
    seq = tl.load(seg_seq_ptr + j, mask=is_seg, other=0)
    seg_start = tl.load(seg_start_ptr + j, mask=is_seg, other=0)
    seq_ok = is_seg & (seq >= 0) & (seq < num_sequences)
    off = (p - seg_begin).to(tl.int64)
    return k, is_seg, seq_ok, seq, seg_start, off


@triton.jit
def _source_rows(src_offsets_ptr, p, p_ok, cu_ptr, cu_seg_ptr, seg_seq_ptr, seg_start_ptr, num_out, num_segments,
                 num_sequences, num_src_tokens):
    """For each packed position: its output segment k, offset in the segment, whether it is a real
    segment's token, and its source row (valid where src_ok)."""
    k, is_seg, seq_ok, seq, seg_start, off = _locate(cu_ptr, cu_seg_ptr, seg_seq_ptr, seg_start_ptr, p, p_ok,
                                                     num_out, num_segments, num_sequences)
    base = tl.load(src_offsets_ptr + seq, mask=seq_ok, other=0)
    src_row = base + seg_start + off
    src_ok = seq_ok & (src_row >= 0) & (src_row < num_src_tokens)
    return k, off, is_seg, src_ok, src_row


@triton.jit
def _pattern(w0, w1, f, WORDS: tl.constexpr, dtype: tl.constexpr):
    """The pad/first pattern for word f of a token record (16-byte dtypes alternate two words)."""
    v0 = w0.to(dtype)
    if WORDS == 2:
        return tl.where((f % 2) == 0, v0, w1.to(dtype))
    else:
        return v0 + tl.zeros_like(f).to(dtype)


@triton.jit(do_not_specialize=["pad0", "pad1", "first0", "first1"])
def _pack_kernel(src_ptr, out_ptr, src_offsets_ptr, seg_seq_ptr, seg_start_ptr, cu_ptr, cu_seg_ptr, num_positions,
                 F, num_src_tokens, num_sequences, num_segments, num_out, pad0, pad1, first0, first1,
                 HAS_FIRST: tl.constexpr, WORDS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_F: tl.constexpr):
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = p < num_positions
    k, off, is_seg, src_ok, src_row = _source_rows(src_offsets_ptr, p, p_ok, cu_ptr, cu_seg_ptr, seg_seq_ptr,
                                                   seg_start_ptr, num_out, num_segments, num_sequences,
                                                   num_src_tokens)
    is_first = is_seg & (off == 0)
    src_base = src_row * F
    out_base = p.to(tl.int64) * F
    for f0 in range(0, F, BLOCK_F):
        f = f0 + tl.arange(0, BLOCK_F)
        f_ok = f < F
        vals = tl.load(src_ptr + src_base[:, None] + f[None, :], mask=src_ok[:, None] & f_ok[None, :], other=0)
        vals = tl.where(src_ok[:, None], vals, _pattern(pad0, pad1, f, WORDS, dtype)[None, :])
        if HAS_FIRST:
            vals = tl.where(is_first[:, None], _pattern(first0, first1, f, WORDS, dtype)[None, :], vals)
        tl.store(out_ptr + out_base[:, None] + f[None, :], vals, mask=p_ok[:, None] & f_ok[None, :])


@triton.jit(do_not_specialize=["pad_id", "ignore_index", "position_start"])
def _pack_batch_kernel(ids_ptr, labels_ptr, src_offsets_ptr, seg_seq_ptr, seg_start_ptr, cu_ptr, cu_seg_ptr,
                       out_ids_ptr, out_labels_ptr, out_pos_ptr, out_seq_idx_ptr, num_positions, num_src_tokens,
                       num_sequences, num_segments, num_out, pad_id, ignore_index, position_start,
                       MASK_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
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


@triton.jit(do_not_specialize=["pad0", "pad1"])
def _fill_kernel(out_ptr, n, pad0, pad1, WORDS: tl.constexpr, BLOCK: tl.constexpr):
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + e, _pattern(pad0, pad1, e, WORDS, dtype), mask=e < n)


@triton.jit
def _unpack_kernel(packed_ptr, out_ptr, src_offsets_ptr, seg_seq_ptr, seg_start_ptr, cu_ptr, cu_seg_ptr,
                   num_positions, F, num_segments, num_out, num_sequences, num_dest_tokens, max_len,
                   PADDED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_F: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
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
    for f0 in range(0, F, BLOCK_F):
        f = f0 + tl.arange(0, BLOCK_F)
        f_ok = f < F
        vals = tl.load(packed_ptr + src_base[:, None] + f[None, :], mask=dest_ok[:, None] & f_ok[None, :], other=0)
        tl.store(out_ptr + dest_base[:, None] + f[None, :], vals, mask=dest_ok[:, None] & f_ok[None, :])


# --------------------------------------------------------------------------------------------------
# Host helpers (metadata only)
# --------------------------------------------------------------------------------------------------

_WORD_DTYPES = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}


def _interpreting() -> bool:
    """Whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 when triton was imported)."""
    return type(_pack_kernel).__name__ == "InterpretedFunction"


def _check_device(op: str, t: torch.Tensor, name: str) -> None:
    if t.device.type == "cpu" and not _interpreting():
        raise ValueError(f"packkit::triton_{op}: {name} is a CPU tensor; the Triton kernels need GPU tensors "
                         "(or TRITON_INTERPRET=1 set before triton is imported)")


def _check_index(op: str, t, name: str, dtype: torch.dtype) -> None:
    check_index_tensor(f"packkit::triton_{op}", t, name, dtype)


def _check_same_device(op: str, a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    if a.device != b.device:
        raise ValueError(f"packkit::triton_{op}: {name_a} and {name_b} must be on the same device, got "
                         f"{a.device} and {b.device}")


def _checked_total_tokens(op: str, num_rows: int, row_len: int, flat: bool) -> int:
    if num_rows < 0 or row_len < 0:
        raise ValueError(f"packkit::triton_{op}: num_rows and row_len must be >= 0, got {num_rows} and {row_len}")
    if flat and num_rows != 1:
        raise ValueError(f"packkit::triton_{op}: the flat layout is one row of row_len tokens, so num_rows must "
                         f"be 1, got {num_rows}")
    # num_rows is bounded even when row_len == 0: the layout walks every row.
    if num_rows > _INT32_MAX or (row_len != 0 and num_rows > _INT32_MAX // row_len):
        raise ValueError(f"packkit::triton_{op}: num_rows * row_len must be < 2^31 (cu_seqlens are int32), got "
                         f"{num_rows} * {row_len}")
    return num_rows * row_len


def _check_layout_args(op, seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens) -> int:
    _check_index(op, seg_length, "seg_length", torch.int64)
    _check_index(op, bin_offsets, "bin_offsets", torch.int64)
    _check_same_device(op, seg_length, bin_offsets, "seg_length", "bin_offsets")
    _check_device(op, seg_length, "seg_length")
    total = _checked_total_tokens(op, num_rows, row_len, flat)
    if bin_offsets.numel() < 1:
        raise ValueError(f"packkit::triton_{op}: bin_offsets needs num_bins + 1 >= 1 entries")
    if not flat and bin_offsets.numel() - 1 > num_rows:
        raise ValueError(f"packkit::triton_{op}: the plan has {bin_offsets.numel() - 1} bins but num_rows is "
                         f"{num_rows}")
    if seg_length.numel() >= _INT32_MAX:
        raise ValueError(f"packkit::triton_{op}: at most 2^31 - 2 segments")
    padding = 1 if flat else num_rows
    if num_cu_seqlens < 1 or num_cu_seqlens - 1 > seg_length.numel() + padding:
        raise ValueError(f"packkit::triton_{op}: num_cu_seqlens must be in [1, num_segments + padding segments "
                         f"+ 1], got {num_cu_seqlens}")
    return total


def _check_segment_args(op, ref, seg_seq, seg_start, cu_seqlens, cu_seg) -> None:
    _check_index(op, seg_seq, "seg_seq", torch.int64)
    _check_index(op, seg_start, "seg_start", torch.int64)
    _check_index(op, cu_seqlens, "cu_seqlens", torch.int32)
    _check_index(op, cu_seg, "cu_seg", torch.int32)
    if seg_seq.numel() != seg_start.numel():
        raise ValueError(f"packkit::triton_{op}: seg_seq and seg_start must have the same length, got "
                         f"{seg_seq.numel()} and {seg_start.numel()}")
    if cu_seqlens.numel() != cu_seg.numel() + 1:
        raise ValueError(f"packkit::triton_{op}: cu_seqlens must have one more entry than cu_seg, got "
                         f"{cu_seqlens.numel()} and {cu_seg.numel()}")
    for t, name in ((seg_seq, "seg_seq"), (seg_start, "seg_start"), (cu_seqlens, "cu_seqlens"), (cu_seg, "cu_seg")):
        _check_same_device(op, ref, t, "the data", name)
    _check_device(op, ref, "the data")


def _check_output(op: str, out, name: str, like: torch.Tensor, dtype: torch.dtype, shape) -> None:
    """An out-variant's output: exactly the shape, dtype and device the functional op allocates, contiguous."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"packkit::triton_{op}: {name} must be a tensor, got {type(out).__name__}")
    if out.device != like.device:
        raise ValueError(f"packkit::triton_{op}: {name} must be on the same device as the inputs ({like.device}), "
                         f"got {out.device}")
    if out.dtype != dtype:
        raise TypeError(f"packkit::triton_{op}: {name} has dtype {out.dtype} but must be {dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"packkit::triton_{op}: {name} must have shape {list(shape)}, got {list(out.shape)}")
    if not out.is_contiguous():
        raise ValueError(f"packkit::triton_{op}: {name} must be contiguous")


def _byte_range(t: torch.Tensor):
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + span * t.element_size()


def _check_disjoint(op: str, outs, ins) -> None:
    """No output shares memory with an input or another output (address ranges only; skipped while
    tracing, where tensors have no memory)."""
    named = [t for _, t in (*outs, *ins) if t is not None and t.numel() > 0]
    if any(is_fake(t) for t in named):  # tracing (torch.compile, opcheck): no memory to compare
        return
    try:
        ranges = {id(t): _byte_range(t) for t in named}
    except (RuntimeError, NotImplementedError):  # other tensor subclasses without storage
        return
    for i, (out_name, out) in enumerate(outs):
        if id(out) not in ranges:
            continue
        a0, a1 = ranges[id(out)]
        for in_name, other in (*outs[i + 1:], *ins):
            if other is None or id(other) not in ranges or other.device != out.device:
                continue
            b0, b1 = ranges[id(other)]
            if a0 < b1 and b0 < a1:
                raise ValueError(f"packkit::triton_{op}: {out_name} overlaps {in_name}; outputs must not share "
                                 "memory with inputs")


def _rows_of(op: str, out, flat: bool, feature_dims: int, name: str):
    """(num_rows, row_len) of a packed output [num_rows, row_len, *f] or [row_len, *f] (flat)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"packkit::triton_{op}: {name} must be a tensor, got {type(out).__name__}")
    token_dims = 1 if flat else 2
    if out.dim() != token_dims + feature_dims:
        raise ValueError(f"packkit::triton_{op}: {name} must have {token_dims + feature_dims} dims, got {out.dim()}")
    return (1, out.shape[0]) if flat else (out.shape[0], out.shape[1])


def _packed_tokens(op: str, packed: torch.Tensor, flat: bool) -> int:
    token_dims = 1 if flat else 2
    if packed.dim() < token_dims:
        raise ValueError(f"packkit::triton_{op}: packed must have at least {token_dims} dims for the "
                         f"{'flat' if flat else 'padded'} layout, got {packed.dim()}")
    tokens = 1
    for d in range(token_dims):
        tokens *= packed.shape[d]
    if tokens > _INT32_MAX:
        raise ValueError(f"packkit::triton_{op}: packed must hold fewer than 2^31 tokens (cu_seqlens are int32)")
    return tokens


def _words(op: str, t: torch.Tensor, name: str):
    """A contiguous tensor as a flat tensor of same-width integers, and the words per element."""
    size = t.element_size()
    if size not in _WORD_DTYPES:
        raise TypeError(f"packkit::triton_{op}: {name} has dtype {t.dtype} ({size}-byte elements); supported "
                        "element sizes are 1, 2, 4, 8 and 16 bytes")
    try:
        flat = t.reshape(-1).view(_WORD_DTYPES[size])
    except RuntimeError as exc:
        raise TypeError(f"packkit::triton_{op}: cannot view {name} ({t.dtype}) as raw words: {exc}") from exc
    return flat, (2 if size == 16 else 1)


def _no_dispatch_modes():
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    return _disable_current_modes()


_PATTERN_CACHE: dict = {}


def _value_words(op: str, value: float, dtype: torch.dtype, name: str):
    """The bits of ``value`` converted to ``dtype`` by torch (``torch.full((1,), value, dtype=dtype)``, as
    the C++ ops and the reference do), as two signed integers (the second only for 16-byte dtypes).
    Computed on the host from a Python number, outside any fake/functional mode, so it works while
    torch.compile traces the op."""
    value = float(value)
    key = (struct.pack("<d", value), dtype)
    words = _PATTERN_CACHE.get(key)
    if words is None:
        with _no_dispatch_modes():
            try:
                one = torch.full((1,), value, dtype=dtype, device="cpu")
            except RuntimeError as exc:
                raise ValueError(f"packkit::triton_{op}: {name} = {value!r} cannot be converted to {dtype}: "
                                 f"{exc}") from exc
            raw = bytes(one.view(torch.uint8).numpy().tobytes())
        size = len(raw)
        width = 8 if size == 16 else size
        w0 = int.from_bytes(raw[:width], "little", signed=True)
        w1 = int.from_bytes(raw[width:], "little", signed=True) if size == 16 else 0
        words = (w0, w1)
        if len(_PATTERN_CACHE) < 4096:
            _PATTERN_CACHE[key] = words
    return words


def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _tiles(features: int):
    """(BLOCK_P, BLOCK_F) for records of `features` words."""
    block = _CONFIG["block"]
    block_f = min(_next_pow2(max(features, 1)), _CONFIG["max_block_f"], block)
    return max(block // block_f, 1), block_f


# --------------------------------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------------------------------


def _launch_layout(seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens, total, cu, cu_seg):
    num_segments = seg_length.numel()
    num_bins = bin_offsets.numel() - 1
    num_items = num_segments + num_rows if num_rows > 0 else 0
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
    wrap_triton(_pack_kernel)[(triton.cdiv(total, block_p),)](
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
        wrap_triton(_pack_batch_kernel)[(triton.cdiv(total, block),)](
            input_ids, label_src, src_offsets.contiguous(), seg_seq.contiguous(), seg_start.contiguous(), cu, cu_seg,
            out_ids, out_labels, position_ids, seq_idx, total, input_ids.shape[0], src_offsets.numel() - 1,
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


def _launch_fill(out_words, words_per_elem, pad):
    n = out_words.numel()
    if n == 0:
        return
    block = _CONFIG["block"]
    wrap_triton(_fill_kernel)[(triton.cdiv(n, block),)](
        out_words, n, pad[0], pad[1], WORDS=words_per_elem, BLOCK=block, num_warps=_CONFIG["num_warps"])


def _launch_unpack(op, packed, flat, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, out, num_sequences,
                   num_dest_tokens, max_len, pad_value, padded):
    tokens = _packed_tokens(op, packed, flat)
    packed = packed.contiguous()
    packed_words, words_per_elem = _words(op, packed, "packed")
    out_words, _ = _words(op, out, "out")
    _launch_fill(out_words, words_per_elem, _value_words(op, pad_value, packed.dtype, "pad_value"))
    features = words_per_elem
    for d in packed.shape[1 if flat else 2:]:
        features *= d
    if tokens == 0 or features == 0 or out_words.numel() == 0:
        return
    block_p, block_f = _tiles(features)
    wrap_triton(_unpack_kernel)[(triton.cdiv(tokens, block_p),)](
        packed_words, out_words, src_offsets, seg_seq.contiguous(), seg_start.contiguous(), cu_seqlens.contiguous(),
        cu_seg.contiguous(), tokens, features, seg_seq.numel(), cu_seg.numel(), num_sequences, num_dest_tokens,
        max_len, PADDED=padded, BLOCK_P=block_p, BLOCK_F=block_f, num_warps=_CONFIG["num_warps"])


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
