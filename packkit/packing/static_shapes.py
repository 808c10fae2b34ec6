"""The fixed (tokens, sequences) contract: a packed batch a compiled model or a captured CUDA graph can rely on.

``max_sequences=N`` gives every row N sequence slots: ``cu_seq_lens_q/k`` always hold ``num_rows * N + 1`` offsets
(one flat batch: ``N + 1``), the slots a batch does not use repeating the last offset (zero-length sequences at
the end, as flash-attn's varlen kernels, torchtitan's ``max_packed_sequences_per_sample`` and Megatron's
``--cuda-graph-max-packed-seqs`` take them). A row's padding tail is a sequence of its own (its tokens attend only to
each other), so it takes one of the row's N slots. ``position_ids`` and ``seq_idx`` are those of the batch without
the unused slots (they index tokens; an unused slot has none). More sequences than slots are never dropped: the
planner keeps rows within N, and a batch that still does not fit is refused by name.

``max_length_buckets`` rounds ``max_length_q/k`` (host ints: what a compiled step specialises on) up to a bucket:
``"pow2"`` (1, 2, 4, ... capped at the row length: at most log2(row_len) + 2 values) or a list of ints (the batch's
row length is always allowed as the last bucket). A larger ``max_length`` than the batch's own only tells the
attention kernel it may see longer sequences; no path reads past a sequence's own offsets.
"""
from __future__ import annotations

import numbers
from typing import Optional

import numpy as np
import torch

from ..planning.arg_rules import MAX_INT, Int, check_args

POW2 = "pow2"


def check_max_sequences(value) -> Optional[int]:
    """``max_sequences`` as an int >= 1, or None."""
    if value is None:
        return None
    return check_args(Int("max_sequences", 1, 2**31 - 2), values=(value,))[0]  # cu_seqlens are int32


def documents_per_row(max_sequences: Optional[int]) -> Optional[int]:
    """Documents a planned row may hold under ``max_sequences`` slots: one slot is kept for the row's padding
    tail (a row the documents fill exactly needs none, but the plan cannot know it ahead); N=1: one document."""
    return None if max_sequences is None else max(max_sequences - 1, 1)


def check_buckets(buckets):
    """``max_length_buckets`` as ``"pow2"``, a sorted tuple of distinct ints >= 1, or None."""
    if buckets is None or (isinstance(buckets, str) and buckets == POW2):
        return buckets
    if isinstance(buckets, str) or not isinstance(buckets, (list, tuple, np.ndarray, range)):
        raise TypeError(f"max_length_buckets must be 'pow2', a list of ints or None, got {type(buckets).__name__} "
                        f"{buckets!r:.60}")
    if len(buckets) == 0:
        raise ValueError("max_length_buckets must hold at least one int (or be 'pow2' / None)")
    if len(buckets) > 4096:  # a compiled step sees at most this many values: more defeats the purpose
        raise ValueError(f"max_length_buckets holds {len(buckets)} values; at most 4096 (each is a compile)")
    values = []
    for i, b in enumerate(buckets):
        if isinstance(b, (bool, np.bool_)) or not isinstance(b, (numbers.Integral, np.integer)):
            raise TypeError(f"max_length_buckets[{i}] must be an int, got {type(b).__name__} {b!r:.60}")
        if not 1 <= int(b) <= MAX_INT:
            raise ValueError(f"max_length_buckets[{i}] must be >= 1, got {int(b)}")
        values.append(int(b))
    return tuple(sorted(set(values)))


def bucket(value: int, buckets, row_len: int) -> int:
    """The smallest bucket >= ``value`` (never above ``row_len``, which bounds every sequence of a row)."""
    if buckets is None or value <= 0:  # no bucket, or an empty batch: nothing to round
        return value
    if buckets == POW2:
        return min(1 << (int(value) - 1).bit_length(), max(row_len, value))
    for b in buckets:
        if b >= value:
            return min(b, max(row_len, value))
    return max(row_len, value)  # every listed bucket is below it: the row length is the last bucket


def check_slots(seg_length: np.ndarray, bin_offsets: np.ndarray, shape, max_sequences: int) -> int:
    """The ``cu_seq_lens`` length of ``shape`` (a PackLayout) under ``max_sequences``; ValueError naming the first
    row whose sequences (its padding tail included) need more slots."""
    if shape.flat:
        used, rows = shape.num_cu_seqlens - 1, 1
        if used > max_sequences:
            raise ValueError(f"the flat batch holds {used} sequences ({len(seg_length)} documents"
                             f"{' and its padding' if used > len(seg_length) else ''}) but max_sequences="
                             f"{max_sequences}: pass fewer sequences per batch (a sampler or PackedIterableDataset "
                             "with the same max_sequences plans them), or a larger max_sequences")
        return max_sequences + 1
    counts = np.diff(bin_offsets)
    cumulative = np.concatenate(([0], np.cumsum(seg_length, dtype=np.int64)))
    tokens = cumulative[bin_offsets[1:]] - cumulative[bin_offsets[:-1]]
    need = counts + (tokens < shape.row_len)
    if len(need) and int(need.max()) > max_sequences:
        row = int(np.argmax(need))
        raise ValueError(f"row {row} holds {int(counts[row])} documents{' and a padding tail' if need[row] > counts[row] else ''}"
                         f" but max_sequences={max_sequences} slots per row (a row's padding takes one): plan "
                         f"with max_sequences={max_sequences - 1} per row, or raise max_sequences")
    rows = shape.num_rows
    if rows * max_sequences + 1 > 2**31 - 1:
        raise ValueError(f"num_rows x max_sequences = {rows} x {max_sequences} slots do not fit int32 cu_seqlens")
    return rows * max_sequences + 1


def pad_cu_seqlens(cu: torch.Tensor, length: int) -> torch.Tensor:
    """``cu`` extended to ``length`` offsets by repeating its last (device ops only: no host read)."""
    extra = length - cu.shape[0]
    if extra <= 0:
        return cu
    return torch.cat((cu, cu[-1:].expand(extra)))
