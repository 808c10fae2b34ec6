"""Plan.from_bins: rows decided elsewhere, checked like a planner's output."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from plan_checks import check_plan

pytestmark = pytest.mark.core


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), max_size=40), seed=st.integers(0, 1000))
def test_from_bins_of_a_real_plan_is_the_same_plan(lengths, seed):
    reference = packkit.plan(lengths, 32, algorithm=["nf", "obfd", "ffd"][seed % 3])
    rebuilt = packkit.Plan.from_bins(lengths, reference.bins, 32)
    for a, b in zip(rebuilt.segments, reference.segments):
        assert np.array_equal(a, b)
    assert rebuilt.kept_tokens == reference.kept_tokens and np.array_equal(rebuilt.zero_length, reference.zero_length)
    check_plan(np.array(lengths, np.int64), 32, rebuilt, "error")


def test_from_bins_packs():
    plan = packkit.Plan.from_bins([3, 2, 4], [[2], [0, 1]], 5)
    batch = packkit.pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9]], plan=plan, layout="padded")
    assert batch["input_ids"].tolist() == [[6, 7, 8, 9, 0], [1, 2, 3, 4, 5]]


@pytest.mark.parametrize("bins, match", [
    ([[0, 1], [2, 5]], "index 5"),
    ([[0, 1], [1, 2]], "more than one bin"),
    ([[0, 1]], "in no bin"),
    ([[0, 1, 2]], "more than capacity"),
    ([[-1, 0], [1, 2]], "index -1"),
])
def test_from_bins_rejects(bins, match):
    with pytest.raises(ValueError, match=match):
        packkit.Plan.from_bins([3, 2, 4], bins, 5)


@pytest.mark.parametrize("bins", [[], [[0]], [[0, 1]]])
def test_from_bins_rejects_negative_lengths(bins):
    """Fuzz finding (tests/fuzz/corpus/from_bins/crash-negative-length): a negative length was accepted and
    its sequence vanished from the plan (in no bin, not reported)."""
    with pytest.raises(ValueError, match=r"1 lengths are negative \(first at index 0: -851\)"):
        packkit.Plan.from_bins([-851, 2], bins, 10)


def test_bin_sum_near_int64_max_is_rejected():
    """Fuzz finding (tests/fuzz/corpus/from_bins/from_bins-overflowing-bin-sum): 1 + (2^63 - 1) tokens in
    one bin wrapped to a negative sum and passed the capacity check."""
    import pytest

    import packkit

    with pytest.raises(ValueError, match="more than capacity"):
        packkit.Plan.from_bins([0, 1, 2**63 - 1], [[1, 2]], 48)
    with pytest.raises(ValueError, match="more than capacity|2\\^63"):
        packkit.Plan.from_bins([2**62, 2**62, 2**62], [[0], [1], [2]], 2**62)
