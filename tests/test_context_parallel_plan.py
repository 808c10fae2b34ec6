"""packkit.plan_context_parallel: every plan valid (each sequence once and whole, caps, group shapes, the
barrier's steps), its makespan equal to an independent re-simulation of its passes and never below its lower
bound, the bound below a brute-force optimum, the errors, and the ratio target on one workload."""
from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packkit.planning.context_parallel import plan_context_parallel

pytestmark = pytest.mark.core

A, B, K, O = 1.97e-9, 1.05e-4, 3.15e-5, 0.01  # the 7B H100 model of REFERENCE.md section 19


def seq_cost(length, cost):
    if cost == "tokens":
        return float(length)
    if cost == "attention":
        return float(length) ** 2
    return cost[0] * length + cost[1] * float(length) ** 2


def local_tokens(length, c):
    return length if c == 1 else 2 * math.ceil(length / (2 * c))


def resimulate(plan, lengths, cost, caps, speed):
    """Makespan from plan.passes alone, by the model's rules, in plain Python (no packkit code)."""
    free = [0.0] * plan.world_size
    step_len = {}
    for p, (ranks, seqs) in enumerate(plan.passes):
        c = len(ranks)
        work = sum(seq_cost(lengths[i], cost) / c + plan.cp_comm * (c - 1) / c * lengths[i] if c > 1
                   else seq_cost(lengths[i], cost) for i in seqs.tolist())
        d = plan.pass_overhead + work / min(speed[r] for r in ranks)
        if plan.barrier == "pass":
            s = int(plan.pass_step[p])
            step_len[s] = max(step_len.get(s, 0.0), d)
        else:
            begin = max(free[r] for r in ranks)
            for r in ranks:
                free[r] = begin + d
    return sum(step_len.values()) if plan.barrier == "pass" else max(free)


def check_plan(plan, lengths, cost, caps, speed, cp_sizes):
    n, world = len(lengths), plan.world_size
    seen = np.zeros(n, dtype=np.int64)
    for ranks, seqs in plan.passes:
        c = len(ranks)
        assert isinstance(ranks, range) and 0 <= ranks.start and ranks.stop <= world and c >= 1
        if cp_sizes == "pow2":
            assert c & (c - 1) == 0 and ranks.start % c == 0, "pow2 groups are aligned power-of-two blocks"
        seen[seqs] += 1
        assert sum(local_tokens(lengths[i], c) for i in seqs.tolist()) <= min(caps[r] for r in ranks)
        for i in seqs.tolist():
            assert plan.cp_size[i] == c
    assert (seen == 1).all(), "every sequence exactly once"
    if plan.barrier == "pass":
        for step in plan.steps:
            covered = sorted(r for ranks, _ in step for r in ranks)
            assert covered == list(range(world)), "each step partitions the ranks"
        counts = [len(plan.rank_passes(r)) for r in range(world)]
        assert counts == [plan.num_steps] * world
    else:
        assert plan.steps is None
    for r in range(world):
        mine = [(ranks, seqs) for ranks, seqs in plan.passes if r in ranks]
        got = plan.rank_passes(r)
        assert len(got) == len(mine)
        for (group, cp_rank, seqs), (ranks, want) in zip(got, mine):
            assert group == ranks and group[cp_rank] == r and np.array_equal(seqs, want)
    resim = resimulate(plan, lengths, cost, caps, speed)
    assert resim == pytest.approx(plan.makespan, rel=1e-9, abs=1e-12)
    assert plan.makespan >= plan.lower_bound * (1 - 1e-9) - 1e-12
    groups, ids = plan.to_megatron()
    assert len(ids) == (plan.num_steps if plan.barrier == "pass" else 1) and all(len(g) == world for g in ids)
    assert all(len(gl) == len(gi) for g_l, g_i in zip(groups, ids) for gl, gi in zip(g_l, g_i))


@st.composite
def instances(draw):
    world = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 16]))
    cp_sizes = draw(st.sampled_from(["pow2", "any"]))
    n = draw(st.integers(0, 40))
    lengths = draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    if draw(st.booleans()):
        caps = draw(st.lists(st.integers(64, 2048), min_size=world, max_size=world))
    else:
        caps = [draw(st.integers(64, 2048))] * world
    speed = draw(st.one_of(st.none(), st.lists(st.floats(0.25, 4.0), min_size=world, max_size=world)))
    cost = draw(st.sampled_from(["tokens", "attention", (B, A), (1.0, 0.0)]))
    return dict(lengths=lengths, world=world, caps=caps, speed=speed, cost=cost, cp_sizes=cp_sizes,
                cp_comm=draw(st.sampled_from([0.0, K, 1e-3])), overhead=draw(st.sampled_from([0.0, O, 0.5])),
                barrier=draw(st.sampled_from(["none", "pass"])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_every_plan_is_valid_and_resimulates(inst):
    cap_arg = inst["caps"] if len(set(inst["caps"])) > 1 else inst["caps"][0]
    try:
        plan = plan_context_parallel(inst["lengths"], inst["world"], cap_arg, cost=inst["cost"],
                                     cp_comm=inst["cp_comm"], pass_overhead=inst["overhead"],
                                     cp_sizes=inst["cp_sizes"], rank_speed=inst["speed"], barrier=inst["barrier"])
    except ValueError as e:  # only when some sequence fits no group: checked independently here
        assert "fits no allowed CP group" in str(e)
        i = int(re.match(r"lengths\[(\d+)\]", str(e)).group(1))
        sizes = [c for c in range(1, inst["world"] + 1) if inst["cp_sizes"] == "any" or c & (c - 1) == 0]
        for c in sizes:
            starts = range(0, inst["world"] - c + 1, c if inst["cp_sizes"] == "pow2" else 1)
            assert all(local_tokens(inst["lengths"][i], c) > min(inst["caps"][s:s + c]) for s in starts)
        return
    speed = inst["speed"] or [1.0] * inst["world"]
    check_plan(plan, inst["lengths"], inst["cost"], inst["caps"], speed, inst["cp_sizes"])


def brute_force_optimum(lengths, world, cap, cost, cp_comm, overhead, speed, pow2):
    """Shortest makespan over every plan: every ordered partition of the sequences into passes, every group for
    each pass (list scheduling of a fixed order is optimal for that order: a pass never waits needlessly)."""
    groups = [range(s, s + c) for c in range(1, world + 1) if not pow2 or c & (c - 1) == 0
              for s in range(0, world - c + 1, c if pow2 else 1)]
    n = len(lengths)
    best = math.inf

    def ordered_partitions(items):
        if not items:
            yield []
            return
        for k in range(1, len(items) + 1):
            for first in itertools.combinations(items, k):
                rest = [i for i in items if i not in first]
                for tail in ordered_partitions(rest):
                    yield [list(first)] + tail

    for parts in ordered_partitions(list(range(n))):
        for choice in itertools.product(groups, repeat=len(parts)):
            free = [0.0] * world
            ok = True
            for seqs, ranks in zip(parts, choice):
                c = len(ranks)
                if sum(local_tokens(lengths[i], c) for i in seqs) > cap:
                    ok = False
                    break
                work = sum(seq_cost(lengths[i], cost) / c + cp_comm * (c - 1) / c * lengths[i] if c > 1
                           else seq_cost(lengths[i], cost) for i in seqs)
                begin = max(free[r] for r in ranks)
                for r in ranks:
                    free[r] = begin + overhead + work / min(speed[r] for r in ranks)
            if ok:
                best = min(best, max(free))
    return best


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 1200), min_size=1, max_size=3), st.sampled_from([1, 2, 3, 4]),
       st.sampled_from([256, 512, 1024]), st.sampled_from([0.0, 0.05]), st.sampled_from([0.0, 2.0]),
       st.booleans(), st.sampled_from([None, "mixed"]))
def test_lower_bound_is_below_the_brute_force_optimum(lengths, world, cap, overhead, comm, pow2, speeds):
    if pow2 and world == 3:
        world = 4
    speed = [1.0] * world if speeds is None else [1.0 + 0.5 * (r % 2) for r in range(world)]
    cost = (0.0, 1e-6)
    try:
        plan = plan_context_parallel(lengths, world, cap, cost=cost, cp_comm=comm * 1e-3, pass_overhead=overhead,
                                     cp_sizes="pow2" if pow2 else "any", rank_speed=speed)
    except ValueError:
        return
    optimum = brute_force_optimum(lengths, world, cap, cost, comm * 1e-3, overhead, speed, pow2)
    assert plan.lower_bound <= optimum * (1 + 1e-9)
    assert plan.makespan >= optimum * (1 - 1e-9)       # the planner's plan is one of the enumerated
    assert plan.makespan <= 1.5 * optimum


def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first] + part[k]] + part[k + 1:]
        yield [[first]] + part


def brute_force_barrier_optimum(lengths, world, cap, cost, cp_comm, overhead, speed, pow2):
    """Shortest makespan over every "pass"-barrier plan: every partition of the sequences into steps, of each
    step into passes, and every choice of pairwise disjoint groups for a step's passes; a step lasts its longest
    pass (an idle rank's empty pass lasts the overhead)."""
    groups = [range(s, s + c) for c in range(1, world + 1) if not pow2 or c & (c - 1) == 0
              for s in range(0, world - c + 1, c if pow2 else 1)]

    def step_time(seqs):
        best = math.inf
        for passes in set_partitions(seqs):
            for choice in itertools.product(groups, repeat=len(passes)):
                used = [r for g in choice for r in g]
                if len(used) != len(set(used)):
                    continue
                length = overhead if len(used) < world else 0.0
                for p, ranks in zip(passes, choice):
                    c = len(ranks)
                    if sum(local_tokens(lengths[i], c) for i in p) > cap:
                        break
                    work = sum(seq_cost(lengths[i], cost) / c + cp_comm * (c - 1) / c * lengths[i] if c > 1
                               else seq_cost(lengths[i], cost) for i in p)
                    length = max(length, overhead + work / min(speed[r] for r in ranks))
                else:
                    best = min(best, length)
        return best

    return min(sum(step_time(step) for step in steps) for steps in set_partitions(list(range(len(lengths)))))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 1200), min_size=1, max_size=3), st.sampled_from([1, 2, 4]),
       st.sampled_from([256, 512, 1024]), st.sampled_from([0.0, 0.05]), st.sampled_from([0.0, 2.0]),
       st.booleans(), st.sampled_from([None, "mixed"]))
def test_barrier_lower_bound_is_below_the_brute_force_barrier_optimum(lengths, world, cap, overhead, comm, pow2,
                                                                       speeds):
    """The "pass" barrier's own bound term (one step holds the costliest pass and at most sum(caps) tokens)."""
    speed = [1.0] * world if speeds is None else [1.0 + 0.5 * (r % 2) for r in range(world)]
    cost = (0.0, 1e-6)
    try:
        plan = plan_context_parallel(lengths, world, cap, cost=cost, cp_comm=comm * 1e-3, pass_overhead=overhead,
                                     cp_sizes="pow2" if pow2 else "any", rank_speed=speed, barrier="pass")
    except ValueError:
        return
    optimum = brute_force_barrier_optimum(lengths, world, cap, cost, comm * 1e-3, overhead, speed, pow2)
    assert plan.lower_bound <= optimum * (1 + 1e-9)
    assert plan.makespan >= optimum * (1 - 1e-9)


def test_barrier_bound_above_the_barrier_free_one_where_a_step_is_long():
    """One long sequence's step beside cap-limited short passes: the barrier bound is the larger (and still
    below the plan)."""
    rng = np.random.default_rng(0)
    lengths = np.concatenate(([120_000], rng.integers(500, 3000, 2000)))
    kw = dict(cost=(B, A), cp_comm=K, pass_overhead=O)
    free = plan_context_parallel(lengths, 128, 8192, **kw)
    barrier = plan_context_parallel(lengths, 128, 8192, barrier="pass", **kw)
    assert barrier.lower_bound > 1.05 * free.lower_bound
    assert barrier.makespan >= barrier.lower_bound


def test_ratio_target_on_a_long_tail_batch():
    rng = np.random.default_rng(7)
    lengths = np.clip(rng.lognormal(np.log(2048), 1.2, 1024), 64, 131072).astype(np.int64)
    plan = plan_context_parallel(lengths, 128, 16384, cost=(B, A), cp_comm=K, pass_overhead=O)  # 8 per rank
    assert plan.makespan <= 1.05 * plan.lower_bound, plan.summary()
    # Sequences share passes: far fewer passes than sequences (each pass pays the overhead once).
    assert plan.num_passes < 0.6 * len(lengths)


def test_widens_the_critical_sequence_beyond_its_memory_minimum():
    lengths = [100_000] + [2_000] * 60
    plan = plan_context_parallel(lengths, 64, 16384, cost=(B, A), cp_comm=K, pass_overhead=O)
    assert plan.cp_size[0] > 8          # 8 is the smallest size that holds it; wider is faster here
    narrow = (B * 1e5 + A * 1e10) / 8 + K * 7 / 8 * 1e5 + O
    assert plan.makespan < narrow


def test_zero_length_sequences_join_a_pass_and_cost_nothing():
    plan = plan_context_parallel([0, 5000, 0, 300], 4, 4096, cost=(B, A), pass_overhead=O)
    check_plan(plan, [0, 5000, 0, 300], (B, A), [4096] * 4, [1.0] * 4, "pow2")
    alone = plan_context_parallel([5000, 300], 4, 4096, cost=(B, A), pass_overhead=O)
    assert plan.makespan == pytest.approx(alone.makespan)
    only_empty = plan_context_parallel([0, 0], 2, 16, pass_overhead=O)
    assert only_empty.makespan == pytest.approx(O)  # one overhead: the two empty passes run side by side
    assert plan_context_parallel([], 4, 16).makespan == 0.0


def test_pass_barrier_steps_are_partitions_and_rank_counts_match():
    rng = np.random.default_rng(3)
    lengths = rng.integers(100, 30000, 200)
    plan = plan_context_parallel(lengths, 16, 8192, cost=(B, A), cp_comm=K, pass_overhead=O, barrier="pass")
    check_plan(plan, lengths.tolist(), (B, A), [8192] * 16, [1.0] * 16, "pow2")
    assert plan.summary()["steps"] == plan.num_steps == len(plan.steps)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(lengths=[10, 200_000], world_size=4, max_tokens_per_rank=1024), ValueError, r"lengths\[1\] = 200000 fits no allowed CP group.*CP size of at least 256"),
    (dict(lengths=[10], world_size=4, max_tokens_per_rank=0), ValueError, "max_tokens_per_rank"),
    (dict(lengths=[10], world_size=4, max_tokens_per_rank=[64, 64]), ValueError, "max_tokens_per_rank"),
    (dict(lengths=[10], world_size=4, max_tokens_per_rank=64.5), TypeError, "max_tokens_per_rank"),
    (dict(lengths=[10], world_size=6, max_tokens_per_rank=64, max_cp_size=4), ValueError, "multiple of max_cp_size"),
    (dict(lengths=[10], world_size=4, max_tokens_per_rank=64, min_cp_size=3), ValueError, "min_cp_size"),
    (dict(lengths=[10], world_size=0, max_tokens_per_rank=64), ValueError, "world_size"),
    (dict(lengths=[10], world_size=2.0, max_tokens_per_rank=64), TypeError, "world_size"),
    (dict(lengths=[10, -1], world_size=2, max_tokens_per_rank=64), ValueError, "lengths"),
    (dict(lengths=[10, 1.5], world_size=2, max_tokens_per_rank=64), TypeError, "lengths"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, cost=(float("nan"), 1.0)), ValueError, "cost"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, cost=lambda x: -x), ValueError, "cost"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, cost=(1j, 1.0)), TypeError, "cost"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, cp_comm=float("nan")), ValueError, "cp_comm"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, cp_comm=-1.0), ValueError, "cp_comm"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, pass_overhead=1j), TypeError, "pass_overhead"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, rank_speed=[1.0, float("nan")]), ValueError, "rank_speed"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, rank_speed=[1.0, -2.0]), ValueError, "rank_speed"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, rank_speed=[1.0, 2j]), TypeError, "rank_speed"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, rank_speed=[1.0]), ValueError, "rank_speed"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, cp_sizes="odd"), ValueError, "cp_sizes"),
    (dict(lengths=[10], world_size=2, max_tokens_per_rank=64, barrier="step"), ValueError, "barrier"),
])
def test_bad_input_names_the_parameter(kwargs, error, match):
    lengths = kwargs.pop("lengths")
    with pytest.raises(error, match=match):
        plan_context_parallel(lengths, **kwargs)


def test_work_does_not_depend_on_a_huge_cap():
    plan = plan_context_parallel([5, 7, 2**40], 2, 2**62, cost="tokens")
    assert sorted(plan.pass_seqs.tolist()) == [0, 1, 2]


def test_summary_and_megatron_layout():
    lengths = [30000, 9000, 500, 500, 700, 12000]
    plan = plan_context_parallel(lengths, 8, 8192, cost=(B, A), cp_comm=K, pass_overhead=O)
    s = plan.summary()
    assert 0 < s["communication_share"] < 1 and s["balance"] >= 1 and s["peak_local_tokens"] <= 8192
    groups, ids = plan.to_megatron()
    for r in range(8):
        assert ids[0][r] == [i for _, _, seqs in plan.rank_passes(r) for i in seqs.tolist()]
        assert groups[0][r] == [lengths[i] for i in ids[0][r]]


def test_few_sequences_run_one_after_another_on_the_whole_world():
    """Two short sequences on 4 ranks (CI's hypothesis counterexample): side by side (13 tokens on 2 ranks, 7 on one,
    a rank idle) took 1.55x the bound; one pass of both on all 4 ranks meets it."""
    plan = plan_context_parallel([7, 13], 4, 256)
    assert plan.makespan == pytest.approx(plan.lower_bound)
    assert [list(r) for r, _ in plan.passes] == [[0, 1, 2, 3]]
