"""Issue 57 part 3: held-out bad-input cases of packkit.plan and the CP shard, each refused by name (or correct),
with a working control beside it."""
from __future__ import annotations

import resource
import time

import numpy as np
import pytest
import torch

import packkit

pytestmark = pytest.mark.core

L = [3, 5, 4, 4]


@pytest.mark.parametrize("cost, match", [
    (lambda x: x + 1j, r"cost must hold ints or floats, got dtype complex128"),
    ((1 + 1j, 0), r"cost must hold ints or floats: the pair \(a, b\) has complex"),
    (np.array([1 + 1j, 0]), r"cost must hold ints or floats: the pair \(a, b\) has complex128"),
    (True, r"cost must be .* got bool True"),
    ((True, 1), r"cost must hold ints or floats: the pair \(a, b\) has bool True"),
    ((np.bool_(True), 1), r"cost must hold ints or floats: the pair \(a, b\) has bool"),
    (lambda x: x > 3, r"cost must hold ints or floats, got dtype bool"),
])
def test_complex_and_bool_costs_refused(cost, match):
    with pytest.raises(TypeError, match=match):
        packkit.plan(L, 10, dp_size=2, cost=cost)


def test_bool_extra_cost_same_rule():
    with pytest.raises(TypeError, match=r"extra_cost must hold ints or floats, got dtype bool"):
        packkit.plan(L, 10, extra_cost=[True, False, True, False])


@pytest.mark.parametrize("cost", [(1, 0.5), (2, 0), lambda x: x * 2, lambda x: torch.from_numpy(x * 2)])
def test_real_costs_still_plan(cost):
    assert packkit.plan(L, 10, dp_size=2, cost=cost).balance >= 1.0


@pytest.mark.parametrize("lengths, dp", [([1, 1], 2), ([1, 1], 4), ([1, 1, 1, 1], 4)])
def test_costs_near_float_max_overflow_refused(lengths, dp):
    with pytest.raises(ValueError, match=r"per-row costs overflow float64"):
        packkit.plan(lengths, 10, algorithm="ogbfd", dp_size=dp, cost=lambda x: np.full(x.shape, 1.7e308))
    with pytest.raises(ValueError, match=r"per-row costs overflow float64"):
        packkit.plan(lengths, 10, dp_size=dp, cost=(1e308, 1e308))


def test_large_costs_that_fit_still_balance():
    p = packkit.plan([1, 1], 10, algorithm="ogbfd", dp_size=2, cost=lambda x: np.full(x.shape, 1e307))
    assert p.balance == 1.0


def test_meta_tensors_refused_by_name():
    with pytest.raises(ValueError, match=r"lengths is a meta tensor: meta tensors carry no data"):
        packkit.plan(torch.tensor([3, 5], device="meta"), 10)
    with pytest.raises(ValueError, match=r"extra_cost is a meta tensor: meta tensors carry no data"):
        packkit.plan([3, 5], 10, extra_cost=torch.zeros(2, device="meta"))
    with pytest.raises(ValueError, match=r"meta"):
        packkit.pack_sequences([torch.tensor([1, 2, 3], device="meta")])
    assert packkit.plan(torch.tensor([3, 5]), 10).num_bins == 1


def test_lengths_messages_name_the_cause():
    with pytest.raises(TypeError, match=r"got an array of dtype object \(Python ints\)"):
        packkit.plan(np.array([3, 5], dtype=object), 10)
    with pytest.raises(ValueError, match=rf"lengths must fit in int64; index 1 is {2**63},"):
        packkit.plan([3, 2**63], 10)
    with pytest.raises(ValueError, match=rf"index 1 is {2**64},"):
        packkit.plan(np.array([3, 2**64], dtype=object), 10)
    with pytest.raises(ValueError, match=rf"index 1 is {2**64 - 1} \(dtype uint64\)"):
        packkit.plan(np.array([3, 2**64 - 1], dtype=np.uint64), 10)
    assert packkit.plan(np.array([3, 5], dtype=np.uint64), 10).num_bins == 1


def test_shard_names_decreasing_cu_seq_lens():
    batch = packkit.pack_sequences([list(range(1, 8)), list(range(1, 15))])
    bad = dict(batch)
    bad["cu_seq_lens_q"] = bad["cu_seq_lens_k"] = torch.tensor([0, 14, 7, 21], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seq_lens_q must be non-decreasing; index 2 is 7"):
        packkit.shard_context_parallel(bad, 2, 0)
    assert packkit.shard_context_parallel(batch, 2, 0)["input_ids"].numel() > 0


def test_huge_dp_size_refused_fast_and_small():
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for algorithm in ("obfd", "ogbfd"):
        with pytest.raises(ValueError, match=r"dp_size=16777216 is more than 65536"):
            packkit.plan([3, 5], 10, algorithm=algorithm, dp_size=2**24)
    assert time.perf_counter() - start < 0.5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB
    p = packkit.plan([3, 5], 10, algorithm="ogbfd", dp_size=8)  # more ranks than rows: empty bins, as before
    assert p.num_bins == 8 and p.empty_bins >= 6


def test_pack_tree_rank_rows_partition_the_batch():
    from packkit import shared_prefix as sp

    prompt = [7, 8, 9, 10]
    seqs = [prompt + [20 + i] * (i + 1) for i in range(6)] + [[50 + i] * 3 for i in range(4)]
    batch, info = sp.pack_tree(seqs, capacity=16, dp_size=2)
    rows = batch["input_ids"].shape[0]
    assert info.dp_size == 2 and rows % 2 == 0
    got = np.concatenate([info.rank(r) for r in range(2)])
    assert sorted(got.tolist()) == list(range(rows))  # every row to exactly one rank
    assert info.rank(1).tolist() == list(range(1, rows, 2))
    for bad in (2, -1, True, 1.0):
        with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\) \(dp_size=2\)"):
            info.rank(bad)
    _, one = sp.pack_tree(seqs, capacity=16)
    assert one.rank(0).tolist() == list(range(len(one.plan.rows)))
