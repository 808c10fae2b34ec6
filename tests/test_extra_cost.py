"""Per-sample ``extra_cost=`` in the planner (C++ item costs), ``packkit.plan`` and ``PackedBatchSampler`` (issue 50
§6): an extra cost of zero changes no plan; each row's cost is its items' costs plus their samples' extras (a split
sample's on its first piece); a VLM workload with uneven images balances better under the true cost (text + vision
tower) when the vision cost is passed; bad input is refused by name."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from packkit import _planner

pytestmark = pytest.mark.core

CAPACITY = 64
COSTS = {"tokens": "tokens", "attention": "attention", "pair": (3.0, 0.25),
         "callable": lambda l: np.sqrt(l.astype(np.float64)) + 1.0}


def _same_plan(a, b) -> None:
    for x, y in zip(a.segments, b.segments):
        assert np.array_equal(x, y)
    assert np.array_equal(a.rank_costs, b.rank_costs)
    for name in ("dropped", "truncated", "split", "zero_length"):
        assert np.array_equal(getattr(a, name), getattr(b, name))


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(0, 100), max_size=60), algorithm=st.sampled_from(packkit.ALGORITHMS),
       dp_size=st.integers(1, 4), cost=st.sampled_from(sorted(COSTS)),
       overlong=st.sampled_from(["drop", "truncate", "split"]))
def test_zero_extra_cost_changes_no_plan(lengths, algorithm, dp_size, cost, overlong):
    kwargs = dict(algorithm=algorithm, dp_size=dp_size, cost=COSTS[cost], overlong=overlong)
    _same_plan(packkit.plan(lengths, CAPACITY, extra_cost=np.zeros(len(lengths)), **kwargs),
               packkit.plan(lengths, CAPACITY, **kwargs))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), algorithm=st.sampled_from(packkit.ALGORITHMS), dp_size=st.integers(1, 4),
       overlong=st.sampled_from(["drop", "truncate", "split"]))
def test_row_cost_is_items_plus_their_samples_extra(data, algorithm, dp_size, overlong):
    lengths = np.array(data.draw(st.lists(st.integers(0, 150), max_size=40)), dtype=np.int64)
    extra = np.array(data.draw(st.lists(st.floats(0, 1e4), min_size=len(lengths), max_size=len(lengths))))
    a, b = 2.0, 0.5
    plan = packkit.plan(lengths, CAPACITY, algorithm=algorithm, dp_size=dp_size, cost=(a, b), overlong=overlong,
                        extra_cost=extra)
    seg = plan.segments
    item = a * seg.length + b * seg.length.astype(np.float64) ** 2 + np.where(seg.start == 0, extra[seg.seq_index], 0)
    rows = [item[lo:hi].sum() for lo, hi in zip(seg.bin_offsets[:-1], seg.bin_offsets[1:])]
    assert np.allclose(plan.rank_costs.reshape(-1), rows, rtol=1e-12, atol=1e-9)
    assert plan.cost_ab is None and plan.balance_lower_bound is None  # the (a, b) bound knows no extras


def test_split_sample_extra_goes_with_its_first_piece():
    plan = packkit.plan([10, 3], 4, overlong="split", cost="tokens", extra_cost=[100.0, 0.0])
    seg = plan.segments
    first = int(np.flatnonzero((seg.seq_index == 0) & (seg.start == 0))[0])
    row = int(np.searchsorted(seg.bin_offsets, first, side="right") - 1)
    assert plan.rank_costs.reshape(-1)[row] == pytest.approx(100.0 + seg.length[first] + (
        seg.length[seg.bin_offsets[row]:seg.bin_offsets[row + 1]].sum() - seg.length[first]))
    assert plan.rank_costs.sum() == pytest.approx(113.0)


def _vlm_workload(n: int, seed: int = 0):
    """Lengths of similar text, a third of the samples with one large image and the rest with none."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(100, 600, n)
    grids = [[[1, 2 * int(rng.integers(16, 40)), 2 * int(rng.integers(16, 40))]] if rng.random() < 0.33 else None
             for _ in range(n)]
    return lengths, grids


def _truth(lengths, text, extra):
    return (text(lengths) if callable(text) else text[0] * lengths + text[1] * lengths ** 2.0) + extra


def _step_balance(plan, truth) -> float:
    rows = np.array([truth[b].sum() if len(b) else 0.0 for b in plan.bins]).reshape(-1, plan.dp_size)
    return float(rows.max(axis=1).sum() / rows.mean(axis=1).sum())


def test_balance_under_the_true_cost_improves_with_uneven_images():
    from vlm_helpers import tiny_config

    config = tiny_config("qwen3_vl")
    text = packkit.transformer_cost(config)
    lengths, grids = _vlm_workload(600)
    extra = packkit.vision_cost(config).per_sample(grids)
    truth = _truth(lengths, text, extra)
    kwargs = dict(algorithm="ogbfd", dp_size=8, cost=text)
    old = packkit.plan(lengths, 2048, **kwargs)
    new = packkit.plan(lengths, 2048, extra_cost=extra, **kwargs)
    assert new.rank_costs.sum() == pytest.approx(truth.sum(), rel=1e-12)
    assert _step_balance(new, truth) == pytest.approx(new.balance, rel=1e-9)
    assert _step_balance(new, truth) < _step_balance(old, truth) - 0.05
    # the control: with the images' cost left out, the planner's own figure says all is well, the truth does not
    assert old.balance < 1.05 < _step_balance(old, truth)


@pytest.mark.parametrize("bad, error, match", [
    ([1.0, 2.0], ValueError, "extra_cost has 2 entries for 3 lengths"),
    ([0.0, -1.0, 0.0], ValueError, "extra_cost must be finite and >= 0.*index 1, -1.0"),
    ([0.0, 0.0, float("nan")], ValueError, "extra_cost must be finite.*index 2"),
    ([float("inf"), 0.0, 0.0], ValueError, "extra_cost must be finite.*index 0"),
    ([[0.0, 0.0, 0.0]], ValueError, "extra_cost must be 1-D"),
    ([True, False, True], TypeError, "extra_cost must hold ints or floats"),
    (["a", "b", "c"], TypeError, "extra_cost must hold ints or floats"),
    ("abc", TypeError, "extra_cost must be a 1-D array"),
])
def test_bad_extra_cost_is_named(bad, error, match):
    with pytest.raises(error, match=match):
        packkit.plan([3, 4, 5], 8, extra_cost=bad)
    with pytest.raises(error, match=match):
        packkit.PackedBatchSampler([3, 4, 5], 8, rank=0, world_size=1, extra_cost=bad)


def test_the_core_refuses_bad_extra_costs_too():
    lengths = np.array([3, 4, 5], dtype=np.int64)
    with pytest.raises(ValueError, match=r"extra_cost\[1\] is nan"):
        _planner.plan(lengths, 8, "ogbfd", "error", 2, 1.0, 0.0, None, np.array([0.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match="one entry per length"):
        _planner.plan(lengths, 8, "ogbfd", "error", 2, 1.0, 0.0, None, np.zeros(2))


def test_sampler_takes_the_extra_cost():
    lengths, grids = _vlm_workload(400, seed=1)
    from vlm_helpers import tiny_config

    config = tiny_config("qwen2_5_vl")
    text = packkit.transformer_cost(config)
    extra = packkit.vision_cost(config).per_sample(grids)
    common = dict(capacity=2048, rank=0, world_size=4, cost=text, seed=3)
    plain = packkit.PackedBatchSampler(lengths, **common)
    zero = packkit.PackedBatchSampler(lengths, extra_cost=np.zeros(len(lengths)), **common)
    assert zero.batches() == plain.batches() and zero.num_steps == plain.num_steps
    vision = packkit.PackedBatchSampler(lengths, extra_cost=extra, **common)
    truth = _truth(lengths, text, extra)
    assert vision.rank_costs.sum() == pytest.approx(truth.sum(), rel=1e-12)

    def true_balance(sampler):
        per_step = np.array([[truth[sampler.batches(r)[s]].sum() for r in range(4)] for s in range(sampler.num_steps)])
        return per_step.max(axis=1).sum() / per_step.mean(axis=1).sum()
    assert true_balance(vision) == pytest.approx(vision.balance, rel=1e-9)
    assert true_balance(vision) < true_balance(plain) - 0.05
    with pytest.raises(ValueError, match="extra_cost"):  # a resume under another extra cost is refused
        vision.load_state_dict(plain.state_dict())
    vision.load_state_dict(packkit.PackedBatchSampler(lengths, extra_cost=extra, **common).state_dict())
