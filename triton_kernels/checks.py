"""Argument checks of the Triton ops, mirroring ``csrc/ops/pack_checks.hpp`` (metadata only: shapes,
dtypes, devices), so a bad call raises a ValueError/TypeError naming the op and argument."""
from __future__ import annotations

import torch

from torch._subclasses.fake_tensor import is_fake

from ..planning.plan_check import check_index_tensor
from . import common
from .common import _INT32_MAX

def _check_device(op: str, t: torch.Tensor, name: str) -> None:
    if t.device.type == "cpu" and not common._interpreting():
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
