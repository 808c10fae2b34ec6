"""Issue 63, part 2: a fresh adversarial pass over plan_context_parallel, the heterogeneous plan and the Megatron
scheduler. One test (or property) per class of finding; each fails on the code before the fix."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import packkit
from packkit.integrations.megatron_cp import PackkitCPScheduler, _Size
from packkit.planning.cp_simulate import simulate_passes

pytestmark = pytest.mark.core

A, B, K, O = 1.97e-9, 1.05e-4, 3.15e-5, 0.01
BIG = 2**62


# 1. Integer overflow in token sums and caps: checked, never wrapped.
@pytest.mark.parametrize("barrier", ["none", "pass"])
@pytest.mark.parametrize("lengths, world, cap", [([BIG, BIG], 1, 2**63 - 1), ([BIG, BIG, 5], 2, 2**63 - 1),
                                                 ([BIG + 1, BIG - 1], 1, 2**63 - 1)])
def test_cp_token_sums_never_wrap_past_the_cap(lengths, world, cap, barrier):
    plan = packkit.plan_context_parallel(lengths, world, cap, cost="tokens", barrier=barrier)
    assert (plan.pass_local_tokens >= 0).all() and (plan.pass_local_tokens <= cap).all()
    for (ranks, seqs), tokens in zip(plan.passes, plan.pass_local_tokens.tolist()):
        c = len(ranks)
        assert sum(n if c == 1 else 2 * -(-n // (2 * c)) for n in np.asarray(lengths)[seqs].tolist()) == tokens


@pytest.mark.parametrize("cap", [2**63, [2**63, 4], np.array([2**63, 4], dtype=np.uint64), 2**64])
def test_cp_cap_beyond_int64_names_the_cap(cap):
    with pytest.raises(ValueError, match="max_tokens_per_rank"):
        packkit.plan_context_parallel([5, 5], 2, cap)


def test_cp_local_tokens_of_huge_lengths_at_cp_size_above_one():
    plan = packkit.plan_context_parallel([2**63 - 1], 2, 2**62, cost="tokens")
    assert plan.cp_size.tolist() == [2] and plan.pass_local_tokens.tolist() == [2**62]


def test_hetero_sums_never_wrap_past_a_capacity():
    for caps, speed in (([2**63 - 1, 2**63 - 1], [1.0, 2.0]), ([2**63 - 1, 2**62], [1.0, 1.0])):
        try:
            plan = packkit.plan([BIG, BIG, 5, 5], caps, algorithm="ogbfd", dp_size=2, rank_speed=speed)
        except ValueError as exc:  # refused by name is fine; a wrapped row is not
            assert "2^63" in str(exc) or "sum" in str(exc)
            continue
        assert (plan.bin_tokens >= 0).all()
        assert all(t <= caps[b % 2] for b, t in enumerate(plan.bin_tokens.tolist()))


@pytest.mark.parametrize("caps", [[2**63, 10], [2**64, 10]])
def test_hetero_capacity_beyond_int64_names_capacity(caps):
    with pytest.raises(ValueError, match="capacity"):
        packkit.plan([5, 5], caps, algorithm="ogbfd", dp_size=2)


def test_simulated_peak_tokens_never_wrap():
    out = simulate_passes([BIG, BIG], [(range(1), [0, 1])], 1, cost="tokens")
    assert out["peak_local_tokens"] == 2 * BIG


# 2. Callbacks get a read-only view of packkit's lengths: a write cannot change the plan.
def _writer(lengths):
    lengths[:] = 1
    return lengths.astype(np.float64)


def _caller(kind):
    if kind == "cp":
        return lambda: packkit.plan_context_parallel([10, 20, 30], 2, 100, cost=_writer)
    if kind == "cp_barrier":
        return lambda: packkit.plan_context_parallel([10, 20, 30], 2, 100, cost=_writer, barrier="pass")
    if kind == "plan":
        return lambda: packkit.plan([10, 20, 30, 40], 100, algorithm="ogbfd", dp_size=2, cost=_writer)
    if kind == "hetero":
        return lambda: packkit.plan([10, 20, 30, 40], 100, algorithm="ogbfd", dp_size=2, cost=_writer,
                                    rank_speed=[1, 2])
    if kind == "simulate":
        return lambda: simulate_passes([10, 20], [(range(1), [0, 1])], 1, cost=_writer)
    if kind == "tree":
        from packkit.shared_prefix import groups_forest, tree_costs

        forest = groups_forest([[1, 2, 3], [4, 5]], [[[6, 7], [8]], [[9, 9, 9]]])
        return lambda: tree_costs(forest, cost=_writer)
    return lambda: PackkitCPScheduler(100, _Size(2), cost=_writer).get_groups_and_subsamples([(0, 50), (1, 60)])


@pytest.mark.parametrize("kind", ["cp", "cp_barrier", "plan", "hetero", "simulate", "megatron", "tree"])
def test_a_cost_callback_cannot_write_into_the_lengths(kind):
    with pytest.raises(ValueError, match="cost callable wrote into its lengths"):
        _caller(kind)()


@pytest.mark.parametrize("kind", ["cp", "plan", "hetero", "megatron"])
def test_a_cost_callback_sees_read_only_lengths_and_the_plan_keeps_them(kind):
    seen = []

    def cost(lengths):
        seen.append(lengths.flags.writeable)
        return lengths * 2.0

    if kind == "cp":
        plan = packkit.plan_context_parallel([10, 20, 30], 2, 100, cost=cost)
        assert plan.lengths.tolist() == [10, 20, 30]
    elif kind == "megatron":
        PackkitCPScheduler(100, _Size(2), cost=cost).get_groups_and_subsamples([(0, 50), (1, 60)])
    else:
        speed = [1, 2] if kind == "hetero" else None
        plan = packkit.plan([10, 20, 30, 40], 100, algorithm="ogbfd", dp_size=2, cost=cost, rank_speed=speed)
        assert sorted(plan.bin_tokens.tolist()) != [] and int(plan.bin_tokens.sum()) == 100
    assert seen and not any(seen)


# 3. Mixed bools and coercion: one declared rule (arg_rules) everywhere.
@pytest.mark.parametrize("rank, error", [(True, TypeError), (1.0, TypeError), ("1", TypeError), (2, ValueError),
                                         (-1, ValueError)])
def test_plan_rank_bins_under_the_int_rule(rank, error):
    plan = packkit.plan([1, 2, 3, 4], 10, dp_size=2)
    with pytest.raises(error, match="rank"):
        plan.rank_bins(rank)
    assert len(plan.rank_bins(np.int64(1))) == plan.num_steps


@pytest.mark.parametrize("pair, name", [((0, 3.7), "seq_len"), ((0, "7"), "seq_len"), ((0, True), "seq_len"),
                                        ((0, 7.0), "seq_len"), ((0.5, 7), "sample_id"), ((True, 7), "sample_id"),
                                        (("1", 7), "sample_id"), ((np.float64(2.0), 7), "sample_id")])
def test_megatron_pairs_refuse_coercion_by_name(pair, name):
    s = PackkitCPScheduler(100, _Size(2))
    with pytest.raises(TypeError, match=rf"sample_id_seqlens\[1\] {name} must be an int"):
        s.get_groups_and_subsamples([(5, 10), pair])


def test_megatron_pairs_take_numpy_and_host_tensor_ints():
    s = PackkitCPScheduler(100, _Size(2))
    got = s.get_groups_and_subsamples([(np.int64(0), torch.tensor(5)), (1, np.int32(7))])
    assert got == s.get_groups_and_subsamples([(0, 5), (1, 7)])


@pytest.mark.parametrize("kwargs, name", [
    (dict(max_tokens_per_rank=[True, 64]), "max_tokens_per_rank"),
    (dict(max_tokens_per_rank=[64.0, 64]), "max_tokens_per_rank"),
    (dict(max_tokens_per_rank=["64", 64]), "max_tokens_per_rank"),
    (dict(max_tokens_per_rank=64, rank_speed=[True, 1.0]), "rank_speed"),
    (dict(max_tokens_per_rank=64, rank_speed=["1", 1.0]), "rank_speed"),
    (dict(max_tokens_per_rank=64, cp_comm=True), "cp_comm"),
    (dict(max_tokens_per_rank=64, pass_overhead="0.1"), "pass_overhead"),
    (dict(max_tokens_per_rank=64, min_cp_size=True), "min_cp_size"),
])
def test_cp_arguments_refuse_bools_and_coercion(kwargs, name):
    with pytest.raises(TypeError, match=name):
        packkit.plan_context_parallel([10, 20], 2, **kwargs)


@pytest.mark.parametrize("kwargs, name", [(dict(capacity=[True, 10]), "capacity"),
                                          (dict(capacity=[10, 10], rank_speed=[True, 2]), "rank_speed"),
                                          (dict(capacity=[10, 10], rank_speed=[1, "2"]), "rank_speed")])
def test_hetero_lists_refuse_bools(kwargs, name):
    with pytest.raises(TypeError, match=name):
        packkit.plan([1, 2], kwargs.pop("capacity"), algorithm="ogbfd", dp_size=2, **kwargs)


@pytest.mark.parametrize("kwargs, name", [(dict(world_size=True), "world_size"), (dict(world_size=1.0), "world_size"),
                                          (dict(world_size=1, rank_speed=[True]), "rank_speed"),
                                          (dict(world_size=1, cp_comm="0"), "cp_comm")])
def test_simulate_passes_under_the_planner_rules(kwargs, name):
    with pytest.raises(TypeError, match=name):
        simulate_passes([10, 20], [(range(1), [0, 1])], **kwargs)


def test_cp_rank_passes_under_the_int_rule():
    plan = packkit.plan_context_parallel([1, 2], 2, 10)
    for bad in (True, 1.0):
        with pytest.raises(TypeError, match="rank"):
            plan.rank_passes(bad)


# 4. Overflow named, by the right parameter.
@pytest.mark.parametrize("speed, cost", [([1e-300, 2e-300], (1e10, 0.0)), ([5e-324, 1e-323], "tokens"),
                                         ([1e-300, 1e-300], (1e10, 1e10))])
def test_hetero_extreme_speed_names_rank_speed(speed, cost):
    with pytest.raises(ValueError, match="rank_speed"):
        packkit.plan([10, 20, 30, 40], 100, algorithm="ogbfd", dp_size=2, rank_speed=speed, cost=cost)


def test_hetero_finite_speeds_keep_finite_times_and_balance():
    plan = packkit.plan([10, 20, 30, 40], 100, algorithm="ogbfd", dp_size=2, rank_speed=[1e-3, 1.0])
    assert np.isfinite(plan.rank_times).all() and np.isfinite(plan.balance)


@pytest.mark.parametrize("barrier", ["none", "pass"])
def test_cp_tiny_speed_names_rank_speed_not_cp_comm(barrier):
    with pytest.raises(ValueError, match="^rank_speed") as err:
        packkit.plan_context_parallel([10, 20], 2, 100, rank_speed=[1e-320, 1.0], barrier=barrier)
    assert "cp_comm" not in str(err.value) and "pass_overhead" not in str(err.value)


@pytest.mark.parametrize("name", ["cp_comm", "pass_overhead"])
def test_cp_int_beyond_float64_is_a_value_error_naming_it(name):
    with pytest.raises(ValueError, match=name):
        packkit.plan_context_parallel([10, 20], 2, 100, **{name: 10**400})
    with pytest.raises(ValueError, match=name):
        PackkitCPScheduler(100, _Size(2), **{name: 10**400})


@pytest.mark.parametrize("pair, name", [((0, 2**64), "seq_len"), ((2**64, 5), "sample_id"), ((0, -1), "seq_len")])
def test_megatron_out_of_range_ints_named(pair, name):
    with pytest.raises(ValueError, match=rf"sample_id_seqlens\[0\] {name}"):
        PackkitCPScheduler(100, _Size(2)).get_groups_and_subsamples([pair])


@pytest.mark.parametrize("where", [0, 1])
def test_megatron_meta_tensor_is_a_value_error_naming_it(where):
    pair = [0, 5]
    pair[where] = torch.tensor(pair[where], device="meta")
    with pytest.raises(ValueError, match="sample_id_seqlens.*meta tensor"):
        PackkitCPScheduler(100, _Size(2)).get_groups_and_subsamples([tuple(pair)])


@pytest.mark.parametrize("call", [lambda t: packkit.plan_context_parallel(t, 2, 100), lambda t: packkit.plan(t, 100)])
def test_uint64_length_tensor_shows_the_true_value(call):
    t = torch.tensor([3, 2**63 + 5], dtype=torch.uint64)
    with pytest.raises(ValueError, match=str(2**63 + 5)):
        call(t)
    assert call(torch.tensor([3, 7], dtype=torch.uint64)) is not None


# 5. Barrier plans never worse than a barrier-valid plan already at hand.
def _one_step(plan):
    """The barrier-free plan as steps (each pass after its ranks' earlier ones): valid under the barrier."""
    nxt = [0] * plan.world_size
    steps = {}
    for (ranks, _), d in zip(plan.passes, plan.pass_duration.tolist()):
        s = max(nxt[r] for r in ranks)
        for r in ranks:
            nxt[r] = s + 1
        steps[s] = max(steps.get(s, 0.0), d)
    return sum(steps.values())


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_barrier_plan_never_worse_than_the_list_plan_as_steps(data):
    world = data.draw(st.sampled_from([1, 2, 4, 8]))
    lengths = data.draw(st.lists(st.integers(0, 6000), min_size=1, max_size=10))
    cap = data.draw(st.integers(1500, 8000))
    speed = data.draw(st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]), min_size=world, max_size=world))
    cp_sizes = data.draw(st.sampled_from(["pow2", "any"]))
    kw = dict(cost=(B, A), cp_comm=K, pass_overhead=O, rank_speed=speed, cp_sizes=cp_sizes)
    try:
        free = packkit.plan_context_parallel(lengths, world, cap, **kw)
    except ValueError:
        return  # some sequence fits no group
    plan = packkit.plan_context_parallel(lengths, world, cap, barrier="pass", **kw)
    assert plan.makespan <= _one_step(free) * (1 + 1e-9) + 1e-12
    assert plan.makespan >= plan.lower_bound * (1 - 1e-9)
    for step in plan.steps:
        assert sorted(r for ranks, _ in step for r in ranks) == list(range(world))
    assert sorted(i for _, s in plan.passes for i in s.tolist()) == list(range(len(lengths)))


def test_one_slow_rank_is_left_idle_when_that_is_faster():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1000, 60000, 64)
    kw = dict(cost=(B, A), cp_comm=K, pass_overhead=O, barrier="pass")
    slow = packkit.plan_context_parallel(lengths, 16, 16384, rank_speed=[1.0] * 15 + [0.05], **kw)
    fast = packkit.plan_context_parallel(lengths, 8, 16384, **kw)  # 8 of the 15 fast ranks, aligned blocks
    assert slow.makespan <= fast.makespan * (1 + 1e-9)
    for step in slow.steps:
        assert sorted(r for ranks, _ in step for r in ranks) == list(range(16))


@pytest.mark.parametrize("seed", [0, 1])
def test_one_slow_rank_of_16_never_worse_than_the_15_fast_ranks(seed):
    """Issue 63: one slow rank of 16 gave 20.9 s where the same batch on the 15 fast ranks took 14.1 s."""
    lengths = np.random.default_rng(seed).integers(1000, 60000, 64)
    kw = dict(cost=(B, A), cp_comm=K, pass_overhead=O, barrier="pass", cp_sizes="any")
    slow = packkit.plan_context_parallel(lengths, 16, 16384, rank_speed=[1.0] * 15 + [0.1], **kw)
    fast = packkit.plan_context_parallel(lengths, 15, 16384, **kw)
    assert slow.makespan <= fast.makespan * (1 + 1e-9)
