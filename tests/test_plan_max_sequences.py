"""plan(max_sequences=N): no row holds more than N sequences (the static-shape contract's bin constraint)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import packkit

pytestmark = pytest.mark.core

ALGORITHMS = ["nf", "ffd", "bfd", "obfd", "ogbfd"]


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=0, max_size=120), capacity=st.integers(64, 200),
       n=st.integers(1, 9), algorithm=st.sampled_from(ALGORITHMS), overlong=st.sampled_from(["error", "split"]))
def test_rows_respect_the_limit_and_keep_every_sequence(lengths, capacity, n, algorithm, overlong):
    p = packkit.plan(lengths, capacity, algorithm=algorithm, max_sequences=n, overlong=overlong)
    seq, _, seg_length, offsets = p.segments
    counts = np.diff(offsets)
    assert (counts <= n).all()
    assert sorted(seq.tolist()) == list(range(len(lengths)))  # every sequence once (no overlong here)
    bounds = np.concatenate(([0], np.cumsum(seg_length)))
    assert (bounds[offsets[1:]] - bounds[offsets[:-1]] <= capacity).all()
    assert p.num_bins >= -(-len(lengths) // n)
    free = packkit.plan(lengths, capacity, algorithm=algorithm, overlong=overlong)
    assert p.num_bins >= free.num_bins  # a constraint never helps
    if len(lengths) <= n:  # never binding: the same plan
        assert [b.tolist() for b in p.bins] == [b.tolist() for b in free.bins]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_split_pieces_count_one_each(algorithm):
    p = packkit.plan([25, 3, 3], 10, algorithm=algorithm, overlong="split", max_sequences=2)
    assert max(len(b) for b in p.bins) <= 2
    assert sum(p.segments.length) == 31


def test_limit_binds_where_short_sequences_would_crowd_a_row():
    lengths = [1000] + [1] * 40
    p = packkit.plan(lengths, 1100, max_sequences=8)
    assert [len(b) for b in p.bins] == [8] * 5 + [1]
    assert packkit.plan(lengths, 1100).num_bins == 1  # control: without it all 41 share a row


@pytest.mark.parametrize("value, exc, match", [
    (0, ValueError, r"max_sequences must be >= 1"), (-3, ValueError, r"max_sequences must be >= 1"),
    (2.0, TypeError, "max_sequences must be an int"), (True, TypeError, "max_sequences must be an int"),
    ("4", TypeError, "max_sequences must be an int"), (2**63, ValueError, "max_sequences must be <="),
])
def test_bad_max_sequences(value, exc, match):
    with pytest.raises(exc, match=match):
        packkit.plan([3, 4], 10, max_sequences=value)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=0, max_size=200), capacity=st.integers(64, 200),
       n=st.integers(1, 9), dp=st.integers(2, 6), cost=st.sampled_from(["tokens", "attention"]))
def test_ogbfd_step_layouts_respect_the_limit(lengths, capacity, n, dp, cost):
    # the step balancing moves items between rows: only into rows below N (a candidate that breaks it is dropped)
    p = packkit.plan(lengths, capacity, algorithm="ogbfd", dp_size=dp, cost=cost, max_sequences=n)
    seq, _, seg_length, offsets = p.segments
    assert (np.diff(offsets) <= n).all()
    assert sorted(seq.tolist()) == list(range(len(lengths)))
    assert len(p.bins) % dp == 0
    bounds = np.concatenate(([0], np.cumsum(seg_length)))
    assert (bounds[offsets[1:]] - bounds[offsets[:-1]] <= capacity).all()


def test_ogbfd_limit_binds_and_refusals_are_named():
    lengths = [1000, 1000] + [1] * 40
    p = packkit.plan(lengths, 1100, algorithm="ogbfd", dp_size=2, max_sequences=4)
    assert max(len(b) for b in p.bins) == 4
    assert max(len(b) for b in packkit.plan(lengths, 1100, algorithm="ogbfd", dp_size=2).bins) > 4  # control
    with pytest.raises(ValueError, match="max_sequences is not planned with per-rank capacities or rank_speed"):
        packkit.plan([3, 4, 5, 6], 10, algorithm="ogbfd", dp_size=2, rank_speed=[1.0, 2.0], max_sequences=2)
    with pytest.raises(ValueError, match="no max_sequences"):
        packkit.plan([1.5, 2.5], 10.0, algorithm="ffd", max_sequences=2)


def test_huge_limit_allocates_nothing_by_it():
    p = packkit.plan([3, 4, 5], 10, max_sequences=2**62)
    assert p.num_bins == packkit.plan([3, 4, 5], 10).num_bins
