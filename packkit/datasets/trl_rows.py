"""Rows in ``trl.pack_dataset``'s layout: its ``"wrapped"`` cut (per map batch) and its order of segments in a row.

Shared by the ``datasets.Dataset`` path (:mod:`.hf_datasets`) and the streamed one (:mod:`.streamed`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .global_plan import PackReport


def trl_row_order(segments):
    """Each row's segments in ``trl.pack_dataset``'s order: longest first, equal lengths in source order (row, then
    piece), as its best-fit-decreasing pass adds them. The rows stay where they are."""
    from ..planning.planner import Segments

    seq, start, length, offsets = segments
    counts = np.diff(offsets)
    if len(seq) < 2 or int(counts.max(initial=0)) < 2:
        return segments
    row = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    length64 = np.asarray(length, np.int64)
    d_len, d_seq, d_start = np.diff(length64), np.diff(seq), np.diff(start)
    wrong = (row[1:] == row[:-1]) & ((d_len > 0) | ((d_len == 0) & ((d_seq < 0) | ((d_seq == 0) & (d_start < 0)))))
    if not wrong.any():
        return segments
    bad = np.zeros(len(counts), bool)
    bad[row[1:][wrong]] = True
    idx = np.flatnonzero(bad[row])  # the segments of the rows out of order (rows are contiguous runs)
    order = np.arange(len(seq), dtype=np.int64)
    top, nseq = int(length64.max()) + 1, int(seq.max()) + 1
    if len(counts) * top * nseq < 2 ** 62:  # one int64 key: row, then longest first, then source row (a sequence's
        # pieces never share a row: all but its last are seq_length long)
        key = (row[idx] * top + (top - 1 - length64[idx])) * nseq + seq[idx]
        order[idx] = idx[np.argsort(key)]
    else:
        order[idx] = idx[np.lexsort((start[idx], seq[idx], -length64[idx], row[idx]))]
    return Segments(seq[order], start[order], length[order], offsets)


def wrapped_segments(lengths: np.ndarray, seq_length: int, batch_size: Optional[int], *, shuffle: bool, seed: int):
    """TRL's ``"wrapped"`` rows as segments: within each batch of ``batch_size`` rows (``None``: one batch) the
    rows' tokens one after another, cut every ``seq_length`` tokens; the rows in that order (``shuffle``: a
    ``seed``-ed permutation). Returns (segments, PackReport)."""
    from ..planning.planner import Segments

    lengths = np.asarray(lengths, np.int64)
    n = len(lengths)
    cum = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=cum[1:])
    starts = np.arange(0, n, batch_size or max(n, 1), dtype=np.int64)
    batch_lo = cum[starts]
    batch_tokens = cum[np.minimum(starts + (batch_size or max(n, 1)), n)] - batch_lo
    per_batch = -(-batch_tokens // seq_length)  # rows cut from each batch
    first_row = np.zeros(len(per_batch) + 1, np.int64)
    np.cumsum(per_batch, out=first_row[1:])
    cuts = np.repeat(batch_lo, per_batch) + (np.arange(int(first_row[-1]), dtype=np.int64)
                                             - np.repeat(first_row[:-1], per_batch)) * seq_length
    bounds = np.union1d(cum, cuts)  # every place a segment starts or ends, sorted
    begin = bounds[:-1]
    seg_seq = np.searchsorted(cum, begin, side="right") - 1  # the last row starting at or before: never empty
    seg_start = begin - cum[seg_seq]
    seg_length = np.diff(bounds)
    seg_row = np.searchsorted(cuts, begin, side="right") - 1
    counts = np.bincount(seg_row, minlength=len(cuts)) if len(cuts) else np.zeros(0, np.int64)
    offsets = np.zeros(len(cuts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    segments = Segments(seg_seq, seg_start, seg_length, offsets)
    if shuffle and len(cuts) > 1:
        order = np.random.default_rng(seed).permutation(len(cuts))
        new_counts = counts[order]
        new_offsets = np.zeros(len(cuts) + 1, np.int64)
        np.cumsum(new_counts, out=new_offsets[1:])
        take = np.arange(int(new_offsets[-1]), dtype=np.int64) + np.repeat(offsets[order] - new_offsets[:-1],
                                                                           new_counts)
        segments = Segments(seg_seq[take], seg_start[take], seg_length[take], new_offsets)
    pieces = np.bincount(seg_seq, minlength=n) if len(seg_seq) else np.zeros(n, np.int64)
    tokens = int(cum[-1])
    report = PackReport(sequences=n, rows=len(cuts), tokens=tokens, seq_length=seq_length, algorithm="wrapped",
                        overlong="split", lower_bound=-(-tokens // seq_length),
                        efficiency=tokens / (len(cuts) * seq_length) if len(cuts) else 1.0, columns=[],
                        excluded_columns=[], split=np.flatnonzero(pieces > 1).astype(np.int64),
                        zero_length=np.flatnonzero(lengths == 0).astype(np.int64))
    return segments, report


def pack_column_names(names: Sequence[str], columns: Optional[Sequence[str]], *, wrapped: bool,
                      position_ids: bool) -> list[str]:
    """The columns to pack, in the dataset's order (TRL keeps it): all of ``names`` or those of ``columns``."""
    from .arrow_packing import checked_column_names, refuse_reserved

    names = list(names)
    if columns is None:
        chosen = names
    else:
        keep = set(checked_column_names(names, columns))
        chosen = [c for c in names if c in keep]
    if not chosen:
        raise ValueError(f"there is no column to pack (columns: {names})")
    refuse_reserved(chosen, ([] if wrapped else ["seq_lengths"]) + (["position_ids"] if position_ids else []))
    return chosen
