"""The cross-step local search of packkit.rl.micro_batches (C++, csrc/planner/step_search.cpp) against its Python
reference (packkit/rl/local_search.py): the C++ result is a local optimum of the reference's neighbourhood, keeps
every guarantee of the layout, never raises the per-step balance, and is deterministic."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packkit import _planner, rl
from packkit.rl.local_search import refine_across_steps


def _layout(lengths, costs, cap, dp, k, equal_count, search_rounds):
    """The C++ layout as indices[rank][step] (index arrays), or None where it finds none at this k."""
    out = _planner.rl_micro_batches(lengths, costs, cap, dp, k, equal_count, search_rounds=search_rounds,
                                    search_above=1.0)
    if out is None:
        return None, None
    order, offsets = out["order"], out["offsets"].tolist()
    indices = [[order[offsets[r * k + s]:offsets[r * k + s + 1]] for s in range(k)] for r in range(dp)]
    return indices, out


def _balance(indices, costs):
    c = np.array([[costs[b].sum() for b in rank] for rank in indices])  # [dp, k]
    mean = c.mean(axis=0).sum()
    return float(c.max(axis=0).sum() / mean) if mean > 0 else 1.0


def _heavy(rng, n, cap):
    """Heavy-tailed rollouts: many short ones, a few near the cap."""
    x = np.exp(rng.normal(np.log(cap / 12), 1.1, n)).astype(np.int64)
    return np.clip(x, 1, cap)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(0, 90), dp=st.integers(2, 6), extra=st.integers(0, 2),
       equal_count=st.booleans(), cost=st.sampled_from(["verl", "tokens", "random"]))
def test_cpp_search_is_a_local_optimum_of_the_python_reference(seed, n, dp, extra, equal_count, cost):
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(200, 2000))
    n -= n % dp if equal_count else 0
    lengths = _heavy(rng, n, cap)
    costs = {"verl": 24576.0 * lengths + lengths.astype(np.float64) ** 2, "tokens": lengths.astype(np.float64),
             "random": rng.random(n) * 1000}[cost]
    k = max(1, -(-(-(-int(lengths.sum()) // cap)) // dp)) + extra
    searched, out = _layout(lengths, costs, cap, dp, k, equal_count, 100_000)
    plain, _ = _layout(lengths, costs, cap, dp, k, equal_count, 0)
    if searched is None:
        assert plain is None
        return
    # exactly once, the cap, equal counts: the layout's guarantees hold after the search
    flat = np.concatenate([b for rank in searched for b in rank]) if n else np.zeros(0, np.int64)
    assert sorted(flat.tolist()) == list(range(n))
    for rank in searched:
        for b in rank:
            assert int(lengths[b].sum()) <= cap
    if equal_count:
        assert len({sum(len(b) for b in rank) for rank in searched}) <= 1
    assert np.allclose(out["costs"], [costs[b].sum() for rank in searched for b in rank])
    # the search only lowers the objective
    assert _balance(searched, costs) <= _balance(plain, costs) * (1 + 1e-12)
    # ... and stops where the Python reference (same moves and swaps across steps) finds nothing to improve
    probe = [[b.copy() for b in rank] for rank in searched]
    assert not refine_across_steps(probe, lengths, costs, cap, swaps_only=equal_count, rounds=1)
    again, _ = _layout(lengths, costs, cap, dp, k, equal_count, 100_000)  # deterministic
    assert all(np.array_equal(a, b) for ra, rb in zip(searched, again) for a, b in zip(ra, rb))


def test_local_optimum_check_bites_without_the_search():
    """Control: the layout alone (no cross-step search) leaves changes the reference finds, on heavy tails."""
    rng = np.random.default_rng(3)
    cap, dp = 16384, 8
    lengths = rng.integers(64, 1501, 512) + np.clip(np.exp(rng.normal(np.log(1500), 1.0, 512)).astype(np.int64), 1,
                                                    cap - 1500)
    costs = 24576.0 * lengths + lengths.astype(np.float64) ** 2
    k = -(-(-(-int(lengths.sum()) // cap)) // dp)
    plain, _ = _layout(lengths, costs, cap, dp, k, False, 0)
    searched, _ = _layout(lengths, costs, cap, dp, k, False, 100_000)
    assert refine_across_steps([[b.copy() for b in r] for r in plain], lengths, costs, cap, swaps_only=False, rounds=1)
    assert not refine_across_steps([[b.copy() for b in r] for r in searched], lengths, costs, cap, swaps_only=False,
                                   rounds=1)
    assert _balance(searched, costs) < _balance(plain, costs) - 0.003  # 1.0143 -> ~1.007 here


@pytest.mark.parametrize("n, median, cap, dp, seed, bound", [
    (1024, 1500, 16384, 8, 0, 1.00064), (2048, 2000, 16384, 16, 1, 1.00104), (512, 1500, 16384, 8, 0, 1.00644)])
def test_heavy_rows_near_the_certified_bound(n, median, cap, dp, seed, bound):
    """bench_rl.py --heavy rows: <= 1.003 where the bound allows it, else within 0.002 of the bound."""
    from packkit.planning.balance_bound import step_balance_lower_bound

    rng = np.random.default_rng(seed)
    prompt = rng.integers(64, 1501, n)
    lengths = prompt + np.clip(np.exp(rng.normal(np.log(median), 1.0, n)).astype(np.int64), 1, cap - prompt)
    plan = rl.micro_batches(lengths, cap, dp, cost=lambda x: 24576 * x + x ** 2)
    certified = step_balance_lower_bound(lengths, cap, dp, plan.num_micro_batches, 24576, 1)
    assert certified <= plan.balance
    assert plan.balance <= max(1.003, certified + 0.002)
    assert plan.num_micro_batches <= plan.rank_bound + 1 and plan.tokens.max() <= cap


def test_search_arguments_are_checked():
    with pytest.raises(ValueError, match="search_rounds must be >= 0"):
        _planner.rl_micro_batches(np.array([5, 6], np.int64), np.array([1.0, 1.0]), 100, 2, 1, False,
                                  search_rounds=-1)
