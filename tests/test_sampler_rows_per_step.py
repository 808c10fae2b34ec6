"""PackedBatchSampler(rows_per_step=k): k rows per rank per step, balanced on the sums (one process;
the 2-process gloo run is in test_sampler.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packkit.training.sampler import PackedBatchSampler


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
