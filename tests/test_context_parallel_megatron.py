"""packkit.plan_context_parallel against megatron-core's BalancedCPScheduler (installed, unmodified) under one cost
and execution model: packkit's makespan is never longer, and its to_megatron() output has Megatron's layout."""
from __future__ import annotations

import math

import numpy as np
import pytest

from packkit.planning.context_parallel import plan_context_parallel
from packkit.planning.cp_simulate import megatron_passes, simulate_passes

pytestmark = pytest.mark.full

hybrid_cp = pytest.importorskip("megatron.core.pipeline_parallel.hybrid_cp_schedule")

A, B, K, O = 1.97e-9, 1.05e-4, 3.15e-5, 0.01
MODEL = dict(cost=(B, A), cp_comm=K, pass_overhead=O)


class Group:  # BalancedCPScheduler.__init__ reads only dp_cp_group.size()
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


def workload(kind, n, seed):
    rng = np.random.default_rng(seed)
    if kind == "long-tail":
        return np.clip(rng.lognormal(math.log(2048), 1.2, n), 64, 65536).astype(np.int64)
    if kind == "uniform":
        return rng.integers(8192, 65537, n)
    return np.clip(rng.lognormal(math.log(1200), 0.8, n), 16, 32768).astype(np.int64)


@pytest.mark.parametrize("kind", ["long-tail", "uniform", "short"])
@pytest.mark.parametrize("n, ranks, cap", [(64, 8, 8192), (256, 32, 8192), (256, 32, 16384), (128, 64, 16384)])
def test_packkit_is_never_slower_than_megatron(kind, n, ranks, cap):
    lengths = workload(kind, n, seed=n + ranks + cap)
    plan = plan_context_parallel(lengths, ranks, cap, **MODEL)
    _, ids = hybrid_cp.BalancedCPScheduler(cap, Group(ranks)).get_groups_and_subsamples(
        [(i, int(x)) for i, x in enumerate(lengths)], None)
    passes = megatron_passes(ids)
    assert sorted(i for _, s in passes for i in s) == list(range(n))
    megatron = simulate_passes(lengths, passes, ranks, **MODEL)["makespan"]
    assert plan.lower_bound <= megatron * (1 + 1e-9)     # the bound holds for Megatron's plan too
    assert plan.makespan <= megatron * (1 + 1e-9), (plan.makespan, megatron)
    assert simulate_passes(lengths, plan.passes, ranks, **MODEL)["makespan"] == pytest.approx(plan.makespan)


def test_to_megatron_has_the_schedulers_layout():
    lengths = workload("long-tail", 200, seed=1)
    plan = plan_context_parallel(lengths, 16, 8192, **MODEL)
    groups, ids = plan.to_megatron()
    theirs_groups, theirs_ids = hybrid_cp.BalancedCPScheduler(8192, Group(16)).get_groups_and_subsamples(
        [(i, int(x)) for i, x in enumerate(lengths)], None)
    for ours, theirs in ((groups, theirs_groups), (ids, theirs_ids)):   # list (groups) of lists (ranks) of ints
        assert type(ours) is type(theirs) is list and all(len(g) == 16 for g in ours + theirs)
        assert all(isinstance(x, int) for g in ours for rank in g for x in rank)
    # Megatron's reading of our groups (ranks listing an id form its CP set) gives back our CP sizes.
    for i in range(len(lengths)):
        assert sum(i in rank for rank in ids[0]) == plan.cp_size[i]
