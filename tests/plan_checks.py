"""Shared invariant checks for plans: every test of the planner goes through these."""
from __future__ import annotations

import numpy as np


def kept_length(length: int, capacity: int, overlong: str) -> int:
    if length <= capacity:
        return length
    return {"drop": 0, "truncate": capacity, "split": length}[overlong]


def check_plan(lengths, capacity: int, plan, overlong: str = "error") -> None:
    """Asserts the plan's invariants against the input, from its public attributes only."""
    lengths = np.asarray(lengths, dtype=np.int64)
    seq, start, length, offsets = plan.segments
    n_bins = plan.num_bins
    assert offsets[0] == 0 and offsets[-1] == len(seq) and np.all(np.diff(offsets) >= 0)
    assert len(seq) == len(start) == len(length)
    assert np.all(length >= 1) and np.all(length <= capacity)

    # every kept token of every sequence in exactly one segment of exactly one bin
    order = np.lexsort((start, seq))
    covered = np.zeros(len(lengths), dtype=np.int64)
    for k in order:
        s = seq[k]
        assert start[k] == covered[s], f"sequence {s}: gap or overlap at token {start[k]}"
        covered[s] += length[k]
    expected = np.array([kept_length(int(l), capacity, overlong) for l in lengths], dtype=np.int64)
    np.testing.assert_array_equal(covered, expected)
    assert plan.kept_tokens == int(expected.sum())

    # the report says exactly what the policy did
    over = np.flatnonzero(lengths > capacity)
    assert plan.zero_length.tolist() == np.flatnonzero(lengths == 0).tolist()
    assert plan.dropped.tolist() == (over.tolist() if overlong == "drop" else [])
    assert plan.truncated.tolist() == (over.tolist() if overlong == "truncate" else [])
    assert plan.split.tolist() == (over.tolist() if overlong == "split" else [])

    # no bin over capacity; bins agree with the CSR; input order inside a row
    assert len(plan.bins) == n_bins and len(plan.bin_tokens) == n_bins
    for b in range(n_bins):
        lo, hi = offsets[b], offsets[b + 1]
        assert length[lo:hi].sum() <= capacity
        assert plan.bin_tokens[b] == length[lo:hi].sum()
        np.testing.assert_array_equal(plan.bins[b], seq[lo:hi])
        keys = list(zip(seq[lo:hi].tolist(), start[lo:hi].tolist()))
        assert keys == sorted(keys)
    assert n_bins >= plan.lower_bound == -(-plan.kept_tokens // capacity)
    if n_bins:
        assert abs(plan.efficiency - plan.kept_tokens / (n_bins * capacity)) < 1e-12

    # step-major layout: whole steps, rank costs as stated
    assert n_bins == plan.num_steps * plan.dp_size
    assert plan.rank_costs.shape == (plan.num_steps, plan.dp_size)
    assert plan.empty_bins == int(np.sum(np.diff(offsets) == 0))


def rank_costs_of(plan, cost) -> np.ndarray:
    """Per-bin costs recomputed from segments, shaped [num_steps, dp_size]."""
    seg_cost = cost(plan.segments.length.astype(np.float64))
    per_bin = np.add.reduceat(np.append(seg_cost, 0.0), plan.segments.bin_offsets[:-1]) if plan.num_bins else np.zeros(0)
    per_bin = np.where(np.diff(plan.segments.bin_offsets) == 0, 0.0, per_bin)
    return per_bin.reshape(plan.num_steps, plan.dp_size)
