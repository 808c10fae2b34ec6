"""Property tests of the planner's invariants (hypothesis), for every algorithm and policy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import packkit
from plan_checks import check_plan, kept_length, rank_costs_of

pytestmark = pytest.mark.core

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

capacities = st.integers(min_value=1, max_value=300)


@st.composite
def lengths_and_capacity(draw, max_n=60):
    capacity = draw(capacities)
    lengths = draw(st.lists(st.integers(min_value=0, max_value=capacity * 3), max_size=max_n))
    return lengths, capacity


@SETTINGS
@given(lengths_and_capacity(), st.sampled_from(packkit.ALGORITHMS), st.sampled_from(["drop", "truncate", "split"]),
       st.integers(min_value=1, max_value=5))
def test_invariants_every_algorithm_and_policy(case, algorithm, overlong, dp_size):
    lengths, capacity = case
    plan = packkit.plan(lengths, capacity, algorithm=algorithm, overlong=overlong, dp_size=dp_size)
    check_plan(lengths, capacity, plan, overlong)


@SETTINGS
@given(lengths_and_capacity(), st.sampled_from(packkit.ALGORITHMS))
def test_error_policy_raises_only_for_overlong(case, algorithm):
    lengths, capacity = case
    if any(l > capacity for l in lengths):
        with pytest.raises(ValueError, match="longer than capacity"):
            packkit.plan(lengths, capacity, algorithm=algorithm)
    else:
        check_plan(lengths, capacity, packkit.plan(lengths, capacity, algorithm=algorithm))


@SETTINGS
@given(lengths_and_capacity(), st.sampled_from(["drop", "truncate", "split"]))
def test_next_fit_keeps_input_order(case, overlong):
    lengths, capacity = case
    plan = packkit.plan(lengths, capacity, algorithm="nf", overlong=overlong)
    seq, start, _, _ = plan.segments
    keys = list(zip(seq.tolist(), start.tolist()))
    assert keys == sorted(keys)
    # and it is next fit: each row could not take the next row's first segment
    for b in range(plan.num_bins - 1):
        nxt = plan.segments.length[plan.segments.bin_offsets[b + 1]]
        assert plan.bin_tokens[b] + nxt > capacity


def optimum_bins(lengths, capacity) -> int:
    """Exact minimum number of bins, by DP over subsets (tiny inputs only)."""
    n = len(lengths)
    best = [(0, 0)] + [(n + 1, 0)] * ((1 << n) - 1)  # (bins used, fill of the last bin), minimal
    for mask in range(1 << n):
        bins, fill = best[mask]
        for i in range(n):
            if mask & (1 << i):
                continue
            cand = (bins, fill + lengths[i]) if fill + lengths[i] <= capacity and bins > 0 else (bins + 1, lengths[i])
            nxt = mask | (1 << i)
            if cand < best[nxt]:
                best[nxt] = cand
    return best[-1][0]


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=40).flatmap(
    lambda c: st.tuples(st.lists(st.integers(min_value=1, max_value=c), max_size=9), st.just(c))))
def test_decreasing_algorithms_near_optimal(case):
    lengths, capacity = case
    opt = optimum_bins(lengths, capacity)
    for algorithm in ("ffd", "bfd", "obfd", "ogbfd"):
        bins = packkit.plan(lengths, capacity, algorithm=algorithm).num_bins
        assert opt <= bins <= 11 / 9 * opt + 1, (algorithm, bins, opt)


@SETTINGS
@given(st.lists(st.integers(min_value=1, max_value=500), max_size=300), st.integers(min_value=500, max_value=2000))
def test_obfd_matches_textbook_best_fit(lengths, capacity):
    # counting sort + bitmap search must be best fit decreasing, bin for bin in count
    assert packkit.plan(lengths, capacity, algorithm="obfd").num_bins == \
        packkit.plan(lengths, capacity, algorithm="bfd").num_bins


@SETTINGS
@given(lengths_and_capacity(max_n=120), st.integers(min_value=2, max_value=8),
       st.sampled_from(["tokens", "attention", (1.0, 0.01)]))
def test_ogbfd_steps_and_balance(case, dp_size, cost):
    lengths, capacity = case
    plan = packkit.plan(lengths, capacity, algorithm="ogbfd", dp_size=dp_size, cost=cost, overlong="split")
    check_plan(lengths, capacity, plan, "split")
    a, b = {"tokens": (1.0, 0.0), "attention": (0.0, 1.0)}.get(cost, cost) if isinstance(cost, str) else cost
    cost_fn = lambda l: a * l + b * l * l  # noqa: E731
    np.testing.assert_allclose(plan.rank_costs, rank_costs_of(plan, cost_fn), rtol=1e-9)
    # every step has dp_size bins; only the last may hold empty bins
    assert plan.num_bins % dp_size == 0
    sizes = np.diff(plan.segments.bin_offsets).reshape(plan.num_steps, dp_size)
    if plan.num_steps > 1:
        assert (sizes[:-1] > 0).all()
    # no worse than dealing the same (obfd) bins round robin
    dealt = packkit.plan(lengths, capacity, algorithm="obfd", dp_size=dp_size, cost=cost, overlong="split")
    obfd_rows = packkit.plan(lengths, capacity, overlong="split").num_bins
    assert plan.num_bins - plan.empty_bins <= obfd_rows + dp_size  # at most dp_size more rows than best fit
    assert plan.rank_costs.max(axis=1).sum() <= dealt.rank_costs.max(axis=1).sum() * (1 + 1e-9) + 1e-9


@SETTINGS
@given(lengths_and_capacity(), st.sampled_from(packkit.ALGORITHMS), st.integers(min_value=1, max_value=4))
def test_deterministic(case, algorithm, dp_size):
    lengths, capacity = case
    p1 = packkit.plan(lengths, capacity, algorithm=algorithm, dp_size=dp_size, overlong="split", cost="attention")
    p2 = packkit.plan(list(lengths), capacity, algorithm=algorithm, dp_size=dp_size, overlong="split", cost="attention")
    for x, y in zip(p1.segments, p2.segments):
        np.testing.assert_array_equal(x, y)


def test_lightbinpack_duplicate_case_is_exact():
    # LightBinPack's ogbfd returns items 2 and 3 twice here (REFERENCE §1).
    lengths = [30, 30, 30, 30, 30, 5]
    plan = packkit.plan(lengths, 40, algorithm="ogbfd", dp_size=4)
    check_plan(lengths, 40, plan)
    flat = sorted(np.concatenate(plan.bins).tolist())
    assert flat == list(range(6))
    assert plan.num_steps == 2 and plan.num_bins == 8
    assert plan.empty_bins == 2  # 6 items cannot fill 8 rows: reported, not hidden
    assert plan.rank_costs.max(axis=1).sum() == 60  # each step's slowest rank holds 30 tokens


def test_zero_length_sequences_are_reported_and_in_no_bin():
    plan = packkit.plan([0, 5, 0, 3], 8)
    assert plan.zero_length.tolist() == [0, 2]
    assert sorted(np.concatenate(plan.bins).tolist()) == [1, 3]
    assert plan.num_bins == 1


def test_all_zero_and_empty_inputs():
    for lengths in ([], [0, 0]):
        plan = packkit.plan(lengths, 16, algorithm="ogbfd", dp_size=4)
        assert plan.num_bins == 0 and plan.num_steps == 0 and plan.efficiency == 1.0 and plan.bins == []


def test_split_pieces_are_consecutive():
    plan = packkit.plan([25, 4], 10, overlong="split")
    pieces = sorted((int(s), int(l)) for q, s, l in zip(*plan.segments[:3]) if q == 0)
    assert pieces == [(0, 10), (10, 10), (20, 5)]
    assert plan.split.tolist() == [0]


def test_totals_beyond_int32():
    capacity = 2**40
    lengths = [2**39, 2**39 + 7, 2**38, 3 * 2**38]
    for algorithm in packkit.ALGORITHMS:  # capacity this large takes obfd's comparison-sort path
        plan = packkit.plan(lengths, capacity, algorithm=algorithm)
        check_plan(lengths, capacity, plan)
        assert plan.kept_tokens == sum(lengths)


@pytest.mark.parametrize("algorithm", packkit.ALGORITHMS)
def test_large_random_input(algorithm):
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 5000, 20_000)
    plan = packkit.plan(lengths, 4096, algorithm=algorithm, overlong="split", dp_size=3)
    check_plan(lengths, 4096, plan, "split")
    if algorithm != "nf":
        assert plan.num_bins <= plan.lower_bound * 1.01 + 3


@pytest.mark.parametrize("dp_size", [1, 4])
def test_obfd_above_the_two_thread_size_matches_the_general_path(dp_size):
    # From 2^18 items obfd scatters the sorted order on a second thread, and whole sequences are emitted
    # through packed (index, length) keys; a zero-length sequence at the end sends the same items down
    # the general path (items copied, two-array emission). Both must give the same rows.
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 4097, 300_000)
    fast = packkit.plan(lengths, 16384, algorithm="obfd", dp_size=dp_size)
    general = packkit.plan(np.append(lengths, 0), 16384, algorithm="obfd", dp_size=dp_size)
    assert general.zero_length.tolist() == [len(lengths)]
    for a, b in zip(fast.segments, general.segments):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fast.rank_costs, general.rank_costs)
    check_plan(lengths, 16384, fast)
    assert fast.num_bins <= fast.lower_bound * 1.001 + dp_size


def test_input_kinds_agree():
    torch = pytest.importorskip("torch")
    base = [7, 3, 0, 12, 5, 9, 1]
    ref = packkit.plan(base, 12)
    for kind in (tuple(base), np.array(base, dtype=np.int32), np.array(base, dtype=np.uint16),
                 torch.tensor(base), torch.tensor(base, dtype=torch.int32)):
        got = packkit.plan(kind, 12)
        for x, y in zip(ref.segments, got.segments):
            np.testing.assert_array_equal(x, y)
    assert packkit.plan(base, np.int64(12)).num_bins == ref.num_bins


def test_numpy_int64_input_is_not_copied():
    from packkit.planning import as_lengths

    lengths = np.arange(1, 100, dtype=np.int64)
    assert np.shares_memory(as_lengths(lengths), lengths)


def test_callable_cost_sees_items_after_the_policy():
    seen = []

    def cost(item_lengths):
        seen.append(item_lengths.copy())
        return item_lengths.astype(float) ** 1.5

    plan = packkit.plan([30, 8, 8, 25], 10, algorithm="ogbfd", dp_size=2, cost=cost, overlong="split")
    check_plan([30, 8, 8, 25], 10, plan, "split")
    assert sorted(seen[0].tolist()) == sorted([10, 10, 10, 8, 8, 10, 10, 5])
    np.testing.assert_allclose(plan.rank_costs, rank_costs_of(plan, lambda l: l ** 1.5))
