"""Bad input to the planner: each case raises a clear ValueError/TypeError, never a crash."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packkit

pytestmark = pytest.mark.core

BAD_INPUTS = [
    # (lengths, capacity, kwargs, exception, message fragment)
    ([3, -1, 4, -2], 10, {}, ValueError, r"2 lengths are negative \(first at index 1: -1\)"),
    ([3, 15, 4, 20], 10, {}, ValueError, r"2 sequences are longer than capacity 10 \(first at index 1, length 15\)"),
    ([1.5, 2], 10, {}, TypeError, "integers"),
    (np.array([1.0, 2.0]), 10, {}, TypeError, "float64"),
    (np.array([True, False]), 10, {}, TypeError, "bool"),
    # issue 63: one rule for bools in a list, whatever the other elements are
    ([True, 2], 10, {}, TypeError, "not bools; index 0 is True"),
    ([True, False], 10, {}, TypeError, "not bools; index 0 is True"),
    ((3, np.True_), 10, {}, TypeError, "not bools; index 1"),
    ([2.5, True], 10, {}, TypeError, "not bools; index 1"),
    (np.array([[1, 2], [3, 4]]), 10, {}, ValueError, "1-D"),
    ([[1, 2], [3]], 10, {}, ValueError, "flat sequence"),
    (["a", "b"], 10, {}, TypeError, "integers"),
    ([1, "b"], 10, {}, TypeError, "integers"),
    ([1, 2**70], 10, {}, ValueError, "int64"),
    (np.array([1, 2**63 + 5], dtype=np.uint64), 10, {}, ValueError, "int64"),
    ("1234", 10, {}, TypeError, "lengths must be"),
    (None, 10, {}, TypeError, "lengths must be"),
    ({1: 2}, 10, {}, TypeError, "lengths must be"),
    (torch.tensor([1.0, 2.0]), 10, {}, TypeError, "integer tensor"),
    (torch.tensor([[1, 2]]), 10, {}, ValueError, "1-D"),
    ([1, 2], 0, {}, ValueError, "capacity must be a positive integer, got 0"),
    ([1, 2], -5, {}, ValueError, "capacity"),
    ([1, 2], 1.5, {}, TypeError, "capacity"),
    ([1, 2], 10.0, {}, TypeError, "capacity"),
    ([1, 2], True, {}, TypeError, "capacity"),
    ([1, 2], "10", {}, TypeError, "capacity"),
    ([1, 2], None, {}, TypeError, "capacity"),
    ([1, 2], 10, {"algorithm": "first_fit"}, ValueError, "allowed: nf, ffd, bfd, obfd, ogbfd"),
    ([1, 2], 10, {"overlong": "clip"}, ValueError, "allowed: error, drop, truncate, split"),
    ([1, 2], 10, {"dp_size": 0}, ValueError, "dp_size"),
    ([1, 2], 10, {"dp_size": 2.0}, TypeError, "dp_size"),
    # fuzz finding (UBSan: signed overflow rounding the rows up to a multiple of dp_size)
    ([6] * 7, 10, {"dp_size": 2**63 - 1}, ValueError, r"dp_size must be in \[1, 16777216\], got 9223372036854775807"),
    ([6] * 7, 10, {"dp_size": 2**24 + 1, "algorithm": "ogbfd"}, ValueError, "dp_size must be in"),
    # fuzz finding (UBSan: signed overflow summing the kept tokens; corpus/plan/crash-kept-tokens-overflow)
    ([2**63 - 1] * 2, 2**63 - 1, {}, ValueError, r"kept lengths sum to more than 2\^63 - 1 tokens"),
    ([2**62] * 3, 2**63 - 1, {"algorithm": "nf", "overlong": "truncate"}, ValueError, "kept lengths sum"),
    ([1, 2], 10, {"cost": "flops"}, ValueError, "unknown cost"),
    ([1, 2], 10, {"cost": (-1, 0)}, ValueError, "cost coefficients"),
    ([1, 2], 10, {"cost": (0, 0)}, ValueError, "cost coefficients"),
    ([1, 2], 10, {"cost": (float("nan"), 1)}, ValueError, "cost coefficients"),
    ([1, 2], 10, {"cost": 5}, TypeError, "cost must be"),
    ([1, 2], 10, {"cost": lambda l: l[:1]}, ValueError, "one cost per item"),
    ([1, 2], 10, {"cost": lambda l: -l}, ValueError, "negative or non-finite"),
    ([1, 2], 10, {"cost": lambda l: l * np.inf}, ValueError, "negative or non-finite"),
]


@pytest.mark.parametrize("lengths, capacity, kwargs, exc, match", BAD_INPUTS)
@pytest.mark.parametrize("algorithm", ["obfd", "ogbfd"])
def test_bad_input_raises_clearly(lengths, capacity, kwargs, exc, match, algorithm):
    kwargs = {"algorithm": algorithm, "dp_size": 2, **kwargs}
    with pytest.raises(exc, match=match):
        packkit.plan(lengths, capacity, **kwargs)


def test_cost_callable_exception_propagates():
    def boom(item_lengths):
        raise RuntimeError("user cost failed")

    with pytest.raises(RuntimeError, match="user cost failed"):
        packkit.plan([1, 2, 3], 4, algorithm="ogbfd", dp_size=2, cost=boom)


def test_plan_arrays_are_read_only():
    """Every array a Plan hands out is read-only (a caller cannot corrupt a plan that packs later), and the
    values are still the plan's after the refused writes."""
    plan = packkit.plan([3, 4, 5, 9, 1], 8, overlong="split", algorithm="ogbfd", dp_size=2)
    arrays = {**plan.segments._asdict(), "dropped": plan.dropped, "truncated": plan.truncated, "split": plan.split,
              "zero_length": plan.zero_length, "rank_costs": plan.rank_costs}
    before = {k: v.copy() for k, v in arrays.items()}
    for name, array in arrays.items():
        assert not array.flags.writeable, name
        if array.size:
            with pytest.raises(ValueError, match="read-only"):
                array.flat[0] = 7
    for name, array in arrays.items():
        assert np.array_equal(array, before[name]), name
    with pytest.raises(ValueError):
        plan.rank_bins(2)  # ranks are 0..dp_size-1
