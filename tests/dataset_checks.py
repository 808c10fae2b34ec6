"""Checks shared by the pack_dataset tests (HF and Ray): decode packed rows back to source tokens.

Source token ``t`` of row ``i`` has id ``i * STRIDE + t``, so every packed segment names its source and
where in it it starts; other columns are functions of the id, so a column packed out of step shows.
"""
from __future__ import annotations

import numpy as np

STRIDE = 1 << 20


def make_rows(lengths):
    return [np.arange(i * STRIDE, i * STRIDE + int(n), dtype=np.int64) for i, n in enumerate(lengths)]


def decode_segments(rows_ids, rows_seq_lengths, seq_length):
    """{(source, start): length} of every segment; asserts rows fit and segments are contiguous runs."""
    found = {}
    for ids, seg_lengths in zip(rows_ids, rows_seq_lengths):
        ids = np.asarray(ids, np.int64)
        seg_lengths = np.asarray(seg_lengths, np.int64)
        assert 0 < len(ids) <= seq_length
        assert (seg_lengths >= 1).all() and seg_lengths.sum() == len(ids)
        for seg in np.split(ids, np.cumsum(seg_lengths)[:-1]):
            src, start = divmod(int(seg[0]), STRIDE)
            assert np.array_equal(seg, np.arange(seg[0], seg[0] + len(seg))), "a segment is not one contiguous run"
            assert (src, start) not in found, "a segment appears twice"
            found[(src, start)] = len(seg)
    return found


def expected_segments(lengths, seq_length, overlong):
    """{(source, start): length} that the policy should keep."""
    out = {}
    for i, n in enumerate(lengths):
        n = int(n)
        if n == 0:
            continue
        if n <= seq_length:
            out[(i, 0)] = n
        elif overlong == "truncate":
            out[(i, 0)] = seq_length
        elif overlong == "split":
            for s in range(0, n, seq_length):
                out[(i, s)] = min(seq_length, n - s)
    return out
