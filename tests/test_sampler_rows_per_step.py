"""PackedBatchSampler(rows_per_step=k): k rows per rank per step, balanced on the sums (one process;
the 2-process gloo run is in test_sampler.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packkit
from packkit.training.sampler import PackedBatchSampler
from packkit.training.sampler.epoch import epoch_time

pytestmark = pytest.mark.core


def lognormal(n: int, seed: int = 1, cap: int = 8192) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(rng.normal(np.log(864), 0.932, n))), 1, cap).astype(np.int64)


def ranks(lengths, capacity, world_size, **kw):
    return [PackedBatchSampler(lengths, capacity, rank=r, world_size=world_size, **kw) for r in range(world_size)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 200).flatmap(lambda cap: st.tuples(st.just(cap), st.lists(st.integers(0, cap * 2), max_size=80))),
       st.integers(1, 4), st.integers(1, 4), st.booleans(), st.booleans(), st.sampled_from(["drop", "truncate"]))
def test_exactly_once_k_rows_per_step(case, world_size, k, shuffle, drop_last, overlong):
    capacity, lengths = case
    lengths = np.asarray(lengths, dtype=np.int64)
    samplers = ranks(lengths, capacity, world_size, rows_per_step=k, shuffle=shuffle, drop_last=drop_last,
                     overlong=overlong)
    s = samplers[0]
    rows = [list(x) for x in samplers]
    assert all(len(x) == len(r) == s.num_steps * k for x, r in zip(samplers, rows))
    kept = np.flatnonzero((lengths > 0) & ((lengths <= capacity) | (overlong == "truncate")))
    flat = [i for r in rows for row in r for i in row]
    assert sorted(flat) == sorted(set(kept.tolist()) - set(s.dropped_last.tolist())) and len(flat) == len(set(flat))
    planned = np.minimum(lengths, capacity)
    sums = np.zeros((s.num_steps, world_size))
    for r, rank_rows in enumerate(rows):
        for item, row in enumerate(rank_rows):
            assert planned[row].sum() <= capacity
            sums[item // k, r] += float((planned[row].astype(np.float64) ** 2).sum())
    np.testing.assert_allclose(s.rank_costs, sums, rtol=1e-12)
    if drop_last:
        assert all(len(row) > 0 for r in rows for row in r)
    # resume at any row, mid-step included
    at = len(s) // 2 + (1 if len(s) % 2 else 0)
    fresh = PackedBatchSampler(lengths, capacity, rank=world_size - 1, world_size=world_size, rows_per_step=k,
                               shuffle=shuffle, drop_last=drop_last, overlong=overlong)
    fresh.load_state_dict(samplers[-1].state_dict(steps_done=at))
    assert list(fresh) == rows[-1][at:]


def test_sums_are_balanced_better_than_dealing_rows_in_order():
    lengths = lognormal(20_000)
    samplers = ranks(lengths, 8192, 4, rows_per_step=4)
    s = samplers[0]
    assert s.num_steps * 4 == len(s)
    assert s.balance < 1.003
    # control: the same plan's rows dealt in plan order (rank r gets rows r*k..r*k+k-1) are worse
    costs = s.plan.rank_costs[s.step_order].reshape(s.num_steps, 4, 4).sum(axis=2)
    assert costs.max(1).sum() / costs.mean(1).sum() > s.balance


def test_state_dict_names_rows_per_step_and_old_states_load():
    lengths = lognormal(500)
    a = PackedBatchSampler(lengths, 8192, rank=0, world_size=2, rows_per_step=2)
    b = PackedBatchSampler(lengths, 8192, rank=0, world_size=2, rows_per_step=3)
    with pytest.raises(ValueError, match="rows_per_step"):
        b.load_state_dict(a.state_dict(steps_done=1))
    one = PackedBatchSampler(lengths, 8192, rank=0, world_size=2)
    state = one.state_dict(steps_done=2)
    del state["config"]["rows_per_step"]  # saved by a packkit without rows_per_step
    fresh = PackedBatchSampler(lengths, 8192, rank=0, world_size=2)
    fresh.load_state_dict(state)
    assert list(fresh) == list(one)[2:]


@pytest.mark.parametrize("bad, error", [(0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_rows_per_step(bad, error):
    with pytest.raises(error, match="rows_per_step"):
        PackedBatchSampler([5, 6], 16, rank=0, world_size=1, rows_per_step=bad)


# -- issue 42: no more steps than a plain plan's rows need --------------------------------------------------------
def fewest_steps(lengths, capacity, per_step, **kw):
    return -(-packkit.plan(lengths, capacity, **kw).num_bins // per_step)


def test_one_rank_gets_the_fewest_steps_where_ogbfd_needs_one_more():
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(288), 0.932, 768))), 1, 2048).astype(np.int64)
    s = PackedBatchSampler(lengths, 2048, rows_per_step=2, shuffle=False)
    fewest = fewest_steps(lengths, 2048, 2)
    # control: ogbfd's balanced layout of these lengths takes one step more (the 208 rows for 202)
    assert packkit.plan(lengths, 2048, algorithm="ogbfd", dp_size=2, cost="attention").num_steps == fewest + 1
    assert s.num_steps == fewest and len(s) == 2 * fewest
    rows = list(s)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(lengths[row].sum() <= 2048 for row in rows)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(8, 400), st.sampled_from([64, 288, 864]), st.sampled_from([512, 2048]),
       st.integers(1, 8), st.integers(1, 3), st.sampled_from(["attention", "tokens"]))
def test_steps_within_one_step_of_a_plain_plan(seed, n, median, capacity, k, world_size, cost):
    """One rank: exactly the fewest steps a plain (obfd) plan's rows allow, so at most k - 1 rows more than it.
    Several ranks: the fewest steps unless ogbfd's extra step runs the epoch faster under the cost model (its
    balance), and never more than one extra step."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(median), 0.932, n))), 1, capacity).astype(np.int64)
    s = PackedBatchSampler(lengths, capacity, rank=0, world_size=world_size, rows_per_step=k, cost=cost, seed=seed)
    fewest = fewest_steps(lengths[s.permutation], capacity, world_size * k)
    if world_size == 1:
        assert s.num_steps == fewest
        assert s.num_steps * k - packkit.plan(lengths, capacity).num_bins < k
    else:
        assert fewest <= s.num_steps <= fewest + 1
        if s.num_steps > fewest:  # kept ogbfd: its slowest-rank total beats the plain rows'
            plain = packkit.plan(lengths[s.permutation], capacity, algorithm="obfd", dp_size=world_size * k, cost=cost)
            assert epoch_time(s.plan, world_size, k) < epoch_time(plain, world_size, k)
