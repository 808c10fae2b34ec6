"""PackedBatchSampler(max_sequences=N): every yielded row collates under PackingCollator(max_sequences=N), every
sample exactly once (issue 62's static-shape contract, on the sampler's rows)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import packkit
from packkit.training.sampler import PackedBatchSampler

pytestmark = pytest.mark.core


def _features(lengths, row):
    return [{"input_ids": list(range(1, int(lengths[i]) + 1))} for i in row]


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=0, max_size=90), capacity=st.integers(40, 120),
       n=st.integers(1, 7), world=st.integers(1, 4), k=st.integers(1, 3),
       algorithm=st.sampled_from(["ogbfd", "obfd", "nf"]), layout=st.sampled_from(["flat", "padded"]))
def test_every_row_collates_under_the_contract(lengths, capacity, n, world, k, algorithm, layout):
    samplers = [PackedBatchSampler(lengths, capacity, rank=r, world_size=world, rows_per_step=k, seed=3,
                                   algorithm=algorithm, max_sequences=n) for r in range(world)]
    collator = packkit.PackingCollator(capacity, layout=layout, max_sequences=n)
    seen = []
    for s in samplers:
        for row in s:
            seen += row
            if not row:
                continue
            if n == 1 and sum(lengths[i] for i in row) < capacity:
                continue  # N=1: a row its sample does not fill needs a padding slot (refused: see the test below)
            batch = collator(_features(lengths, row))
            rows = batch["input_ids"].shape[0]
            assert batch["cu_seq_lens_q"].shape[0] == rows * n + 1
            assert (np.diff(batch["cu_seq_lens_q"].numpy()) >= 0).all()
    assert sorted(seen) == [i for i, x in enumerate(lengths) if x > 0]  # every sample once, none dropped
    assert all(len(row) <= max(n - 1, 1) for s in samplers for row in s.batches())


def test_the_limit_binds_and_a_row_over_it_is_refused_by_name():
    lengths = [100] + [1] * 30
    capped = PackedBatchSampler(lengths, 128, world_size=1, rank=0, shuffle=False, max_sequences=4)
    assert max(len(r) for r in capped) == 3  # a row's padding takes the 4th slot
    collator = packkit.PackingCollator(128, max_sequences=4)
    for row in capped:
        assert collator(_features(lengths, row))["cu_seq_lens_q"].shape[0] == 5
    free = PackedBatchSampler(lengths, 128, world_size=1, rank=0, shuffle=False)  # control: no limit
    crowded = max(free, key=len)
    assert len(crowded) > 4
    with pytest.raises(ValueError, match="max_sequences=4"):
        collator(_features(lengths, crowded))  # refused, never truncated
    one = packkit.PackingCollator(128, max_sequences=1)
    with pytest.raises(ValueError, match="max_sequences=1"):  # N=1: a sample short of the row needs a padding slot
        one(_features(lengths, [1]))


def test_ogbfd_keeps_balancing_within_the_limit():
    rng = np.random.default_rng(1)
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(200), 0.9, 3000))), 1, 1024).astype(np.int64)
    s = PackedBatchSampler(lengths, 1024, rank=0, world_size=8, max_sequences=6)
    assert max(len(r) for r in s.batches(3)) <= 5
    obfd = PackedBatchSampler(lengths, 1024, rank=0, world_size=8, max_sequences=6, algorithm="obfd")
    assert s.balance <= obfd.balance  # the step balancing still runs


def test_state_and_bad_input():
    s = PackedBatchSampler([5, 6, 7], 16, rank=0, world_size=1, max_sequences=3)
    with pytest.raises(ValueError, match="max_sequences: saved 3, now None"):
        PackedBatchSampler([5, 6, 7], 16, rank=0, world_size=1).load_state_dict(s.state_dict())
    state = PackedBatchSampler([5, 6, 7], 16, rank=0, world_size=1).state_dict()
    del state["config"]["max_sequences"]  # a state saved before the option existed
    PackedBatchSampler([5, 6, 7], 16, rank=0, world_size=1).load_state_dict(state)
    for value, exc in ((0, ValueError), (2.0, TypeError), (True, TypeError), (2**40, ValueError)):
        with pytest.raises(exc, match="max_sequences"):
            PackedBatchSampler([5, 6], 16, rank=0, world_size=1, max_sequences=value)
