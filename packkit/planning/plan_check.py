"""``packkit.check_plan``: is a plan, as the CSR tensors the raw pack ops take, consistent with its data?

The device pack kernels (CUDA and Triton) bound every read and write, so no plan can make them touch
memory outside their tensors or fault the CUDA context; but an inconsistent plan gives meaningless
outputs. ``pack_sequences`` and the collators validate their plans on the host before any launch.
Whoever calls ``torch.ops.packkit.*`` directly checks with this function:

* ``check_plan(...)`` returns None or raises ValueError naming every problem found (one host sync
  when the tensors are on a GPU);
* ``check_plan(..., sync=False)`` returns a 0-d int32 tensor on the plan's device, 0 for a consistent
  plan, else the OR of the :data:`PLAN_ERRORS` bits. It is computed with torch ops only (no host
  sync, no data-dependent shapes), so it runs inside CUDA graphs and ``torch.compile``: skip the
  step with ``torch.where``, or read it at the next natural sync (``loss.item()``). Do not feed it to
  ``torch._assert_async`` on CUDA if the job must survive: a failed device assert poisons the context.

Metadata problems (dtype, dims, devices, sizes) raise ValueError/TypeError at once in both modes.
"""
from __future__ import annotations

import numbers
from typing import Optional

import torch

__all__ = ["check_plan", "plan_errors", "PLAN_ERRORS"]

PLAN_ERRORS = {
    1: "src_offsets must start at >= 0, never decrease and end at most at the number of source tokens",
    2: "seg_seq must name a source sequence (0 <= seg_seq < number of sequences)",
    4: "every segment must lie inside its sequence (seg_start >= 0, length >= 1, start + length <= its length)",
    8: "bin_offsets must run from 0 to the number of segments and never decrease",
    16: "the segments of every row must fit in row_len",
    32: "num_cu_seqlens must be the plan's output segments (segments + padding segments) + 1",
    64: "cu_seqlens must start at 0, increase strictly and end at the packed token count",
    128: "cu_seg entries must be -1 (padding) or a segment index",
}


def plan_errors(status) -> list[str]:
    """The messages of the bits set in a status code (int or 0-d tensor)."""
    code = int(status)
    return [message for bit, message in PLAN_ERRORS.items() if code & bit]


def check_index_tensor(where: str, t, name: str, dtype: torch.dtype) -> torch.Tensor:
    """A plan tensor must be a 1-D tensor of ``dtype``; ``where`` prefixes the error (every op's check)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{where}: {name} must be 1-D, got {t.dim()} dims")
    if t.dtype != dtype:
        raise TypeError(f"{where}: {name} must be {str(dtype).replace('torch.', '')}, got "
                        f"{str(t.dtype).replace('torch.', '')}")
    return t


def _index(t, name: str, dtype: torch.dtype) -> torch.Tensor:
    return check_index_tensor("check_plan", t, name, dtype)


def _size(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"check_plan: {name} must be a non-negative int, got {value!r}")
    return int(value)


def check_plan(src_offsets: torch.Tensor, seg_seq: torch.Tensor, seg_start: torch.Tensor,
               seg_length: Optional[torch.Tensor] = None, bin_offsets: Optional[torch.Tensor] = None, *,
               num_rows: int, row_len: int, flat: bool, num_cu_seqlens: Optional[int] = None,
               cu_seqlens: Optional[torch.Tensor] = None, cu_seg: Optional[torch.Tensor] = None,
               num_src_tokens: Optional[int] = None, sync: bool = True):
    """Check the arguments of ``torch.ops.packkit.*`` for consistency, on their device.

    Pass what the op takes: ``layout``/``pack_batch`` take ``seg_length``, ``bin_offsets`` and
    ``num_cu_seqlens``; ``pack``/``unpack`` take ``cu_seqlens`` and ``cu_seg`` (both sets may be given).
    ``num_src_tokens`` is the source's token count (``input_ids.shape[0]``, ``src.shape[0]`` or
    unpack's ``num_src_tokens``); without it the end of ``src_offsets`` is not bounded.
    """
    src_offsets = _index(src_offsets, "src_offsets", torch.int64)
    seg_seq = _index(seg_seq, "seg_seq", torch.int64)
    seg_start = _index(seg_start, "seg_start", torch.int64)
    num_rows, row_len = _size(num_rows, "num_rows"), _size(row_len, "row_len")
    if flat and num_rows != 1:
        raise ValueError(f"check_plan: the flat layout is one row, so num_rows must be 1, got {num_rows}")
    if src_offsets.numel() < 1:
        raise ValueError("check_plan: src_offsets needs num_sequences + 1 >= 1 entries")
    if seg_seq.numel() != seg_start.numel():
        raise ValueError(f"check_plan: seg_seq and seg_start must have the same length, got {seg_seq.numel()} "
                         f"and {seg_start.numel()}")
    plan_mode = seg_length is not None or bin_offsets is not None or num_cu_seqlens is not None
    layout_mode = cu_seqlens is not None or cu_seg is not None
    if not plan_mode and not layout_mode:
        raise ValueError("check_plan: pass seg_length, bin_offsets and num_cu_seqlens (layout/pack_batch) and/or "
                         "cu_seqlens and cu_seg (pack/unpack)")
    tensors = [src_offsets, seg_seq, seg_start]
    if plan_mode:
        if seg_length is None or bin_offsets is None or num_cu_seqlens is None:
            raise ValueError("check_plan: seg_length, bin_offsets and num_cu_seqlens go together")
        seg_length = _index(seg_length, "seg_length", torch.int64)
        bin_offsets = _index(bin_offsets, "bin_offsets", torch.int64)
        num_cu_seqlens = _size(num_cu_seqlens, "num_cu_seqlens")
        if seg_length.numel() != seg_seq.numel():
            raise ValueError(f"check_plan: seg_length has {seg_length.numel()} entries but seg_seq has "
                             f"{seg_seq.numel()}")
        if bin_offsets.numel() < 1:
            raise ValueError("check_plan: bin_offsets needs num_bins + 1 >= 1 entries")
        if not flat and bin_offsets.numel() - 1 > num_rows:
            raise ValueError(f"check_plan: the plan has {bin_offsets.numel() - 1} bins but num_rows is {num_rows}")
        tensors += [seg_length, bin_offsets]
    if layout_mode:
        if cu_seqlens is None or cu_seg is None:
            raise ValueError("check_plan: cu_seqlens and cu_seg go together")
        cu_seqlens = _index(cu_seqlens, "cu_seqlens", torch.int32)
        cu_seg = _index(cu_seg, "cu_seg", torch.int32)
        if cu_seqlens.numel() != cu_seg.numel() + 1:
            raise ValueError("check_plan: cu_seqlens must have one more entry than cu_seg")
        tensors += [cu_seqlens, cu_seg]
    if any(t.device != src_offsets.device for t in tensors):
        raise ValueError("check_plan: all tensors must be on one device")
    if num_src_tokens is not None:
        num_src_tokens = _size(num_src_tokens, "num_src_tokens")

    status = _status(src_offsets, seg_seq, seg_start, seg_length, bin_offsets, cu_seqlens, cu_seg, num_rows,
                     row_len, flat, num_cu_seqlens, num_src_tokens)
    if not sync:
        return status
    problems = plan_errors(status)
    if problems:
        raise ValueError("inconsistent plan: " + "; ".join(problems))
    return None


def _status(src_offsets, seg_seq, seg_start, seg_length, bin_offsets, cu_seqlens, cu_seg, num_rows, row_len,
            flat, num_cu_seqlens, num_src_tokens) -> torch.Tensor:
    # Every gather index is clamped first: a bad index must raise a flag, not a device assert.
    device = src_offsets.device
    status = torch.zeros((), dtype=torch.int32, device=device)

    def flag(bad: torch.Tensor, bit: int):
        nonlocal status
        status = status | (bad.any().to(torch.int32) * bit)

    num_sequences, num_segments = src_offsets.numel() - 1, seg_seq.numel()
    seq_len = src_offsets[1:] - src_offsets[:-1]
    bad = (src_offsets[:1] < 0) | (seq_len < 0).any()
    if num_src_tokens is not None:
        bad = bad | (src_offsets[-1:] > num_src_tokens)
    flag(bad, 1)

    def lengths_of(seq: torch.Tensor) -> torch.Tensor:
        """Length of each named sequence (0 where the name is invalid)."""
        if num_sequences == 0:
            return torch.zeros_like(seq)
        ok = (seq >= 0) & (seq < num_sequences)
        return torch.where(ok, seq_len[seq.clamp(0, num_sequences - 1)], 0)

    total = row_len * num_rows
    if seg_length is not None:  # every segment is laid out; pack/unpack read only those cu_seg names
        flag((seg_seq < 0) | (seg_seq >= num_sequences), 2)
        flag((seg_start < 0) | (seg_length < 1) | (seg_start > lengths_of(seg_seq) - seg_length), 4)
        num_bins = bin_offsets.numel() - 1
        flag((bin_offsets[:1] != 0) | (bin_offsets[-1:] != num_segments) | (bin_offsets[1:] < bin_offsets[:-1]).any(),
             8)
        # Clamped lengths keep every sum far from int64 overflow and still exceed row_len when too long.
        clamped = seg_length.clamp(0, row_len + 1)
        cumulative = torch.cat((clamped.new_zeros(1), torch.cumsum(clamped, 0)))
        if flat:
            plan_tokens = cumulative[-1:]
            flag(plan_tokens > row_len, 16)
            pad_segments = (plan_tokens < row_len).to(torch.int64).sum()
        else:
            bounded = bin_offsets.clamp(0, num_segments)
            bin_tokens = cumulative[bounded[1:]] - cumulative[bounded[:-1]]
            flag(bin_tokens > row_len, 16)
            pad_segments = (bin_tokens < row_len).to(torch.int64).sum() + (num_rows - num_bins) * int(row_len > 0)
        flag((num_segments + pad_segments + 1) != num_cu_seqlens, 32)
    if cu_seqlens is not None:
        cu = cu_seqlens.to(torch.int64)
        width = cu[1:] - cu[:-1]
        flag((cu[:1] != 0) | (cu[-1:] != total) | (width < 1).any(), 64)
        flag((cu_seg < -1) | (cu_seg >= num_segments), 128)
        if num_segments > 0:
            real = (cu_seg >= 0) & (cu_seg < num_segments)
            j = cu_seg.to(torch.int64).clamp(0, num_segments - 1)
            seq, start = seg_seq[j], seg_start[j]
            flag(real & ((seq < 0) | (seq >= num_sequences)), 2)
            flag(real & ((start < 0) | (start > lengths_of(seq) - width)), 4)
    return status
