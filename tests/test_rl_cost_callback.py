"""``packkit.rl.micro_batches`` checks what a user cost callback returns: real numbers (no bool, complex, strings or
None), one per sequence, each finite and >= 0, with a finite sum (an overflowing callback gave an inf total and a
NaN balance); each failure is a ValueError naming the callback."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packkit import rl

pytestmark = pytest.mark.core

LENGTHS = np.array([100, 200, 300, 400, 50, 250])


def overflowing(x):  # each cost finite, their sum not
    return np.full(len(x), 1e308)


def wraps(x):  # int32 overflow wraps to negative
    return torch.as_tensor(x, dtype=torch.int32) ** 4


BAD = [
    (overflowing, r"overflowing returned costs that sum to inf"),
    (lambda x: x * np.inf, r"<lambda> returned a non-finite cost \(inf\) for sequence 0"),
    (lambda x: torch.as_tensor(x, dtype=torch.float32) * 1e37, r"non-finite cost \(inf\)"),
    (lambda x: np.where(x > 150, np.nan, 1.0), r"non-finite cost \(nan\) for sequence 1 \(4 in all\)"),
    (wraps, r"wraps returned a negative cost .* for sequence 2"),
    (lambda x: -1.0 * x, r"negative cost \(-100.0\) for sequence 0"),
    (lambda x: x + 1j, r"returned complex128"),
    (lambda x: torch.as_tensor(x) + 1j, r"returned a torch.complex"),
    (lambda x: x > 150, r"returned bool"),
    (lambda x: torch.as_tensor(x) > 150, r"returned a torch.bool tensor"),
    (lambda x: np.array(["a"] * len(x)), r"returned str"),
    (lambda x: None, r"returned None"),
    (lambda x: x[:-1], r"shape \(5,\) for 6 sequences"),
    (lambda x: np.stack([x, x]), r"shape \(2, 6\) for 6 sequences"),
    (lambda x: 3.0, r"shape \(\) for 6 sequences"),
]


@pytest.mark.parametrize("cost, message", BAD)
@pytest.mark.parametrize("dp_size", [1, 4])
def test_a_bad_callback_is_a_value_error_naming_it(cost, message, dp_size):
    with pytest.raises(ValueError, match=r"the cost callable .*" + message):
        rl.micro_batches(LENGTHS, 500, dp_size=dp_size, cost=cost)


@pytest.mark.parametrize("cost", [lambda x: [float(v) for v in x], lambda x: x[:, None] * 2.0,
                                  lambda x: torch.as_tensor(x, dtype=torch.bfloat16),
                                  lambda x: torch.as_tensor(x).to(torch.int16), lambda x: x.astype(np.uint32),
                                  lambda x: np.zeros(len(x))])
def test_real_costs_of_any_numeric_type_are_accepted(cost):
    plan = rl.micro_batches(LENGTHS, 500, dp_size=2, cost=cost)
    assert math.isfinite(plan.balance) and plan.balance >= 1.0
    assert sorted(np.concatenate([p for rank in plan.indices for p in rank]).tolist()) == list(range(len(LENGTHS)))


def test_a_bad_cost_array_names_it():
    with pytest.raises(ValueError, match="the cost array returned a non-finite cost"):
        rl.micro_batches(LENGTHS, 500, dp_size=2, cost=np.array([1.0, np.inf, 1, 1, 1, 1]))
    with pytest.raises(ValueError, match="the cost array returned costs of shape"):
        rl.micro_batches(LENGTHS, 500, dp_size=2, cost=np.ones(5))


@settings(max_examples=60, deadline=None)
@given(scale=st.floats(1e-300, 1e308, allow_nan=False), n=st.integers(1, 40), dp=st.integers(1, 4))
def test_any_callback_gives_a_finite_balance_or_a_value_error(scale, n, dp):
    lengths = np.arange(1, n + 1) * 7

    def scaled(x):
        with np.errstate(over="ignore"):
            return x.astype(np.float64) * scale

    try:
        plan = rl.micro_batches(lengths, 400, dp_size=dp, cost=scaled)
    except ValueError as exc:
        assert "scaled" in str(exc) and ("inf" in str(exc) or "non-finite" in str(exc))
        return
    assert math.isfinite(plan.balance) and plan.balance >= 1.0 - 1e-12
