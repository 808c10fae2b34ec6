"""pp_simulate (issue 61): torch's schedule orders, hand-computable step times, and invariants."""
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from packkit import _planner
from packkit.planning import pp_simulate

pytestmark = pytest.mark.core


@pytest.mark.parametrize("m,p", [(4, 2), (8, 4), (5, 5), (16, 8)])
def test_equal_microbatches_1f1b_and_gpipe_hand_computed(m, p):
    f = 1.0 / p  # each stage's forward of a unit micro-batch
    for schedule in ("1f1b", "gpipe"):
        sim = pp_simulate(forward=[1.0] * m, pp_size=p, schedule=schedule)
        assert sim.makespan == pytest.approx((m + p - 1) * 3 * f)
        assert sim.lower_bound == pytest.approx(sim.makespan)
        assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_p2p_adds_two_hops_per_stage_boundary_on_the_critical_path():
    sim = pp_simulate(forward=[4.0], pp_size=4, schedule="gpipe", p2p=0.5)
    assert sim.makespan == pytest.approx(4.0 * 3 + 2 * 3 * 0.5)


def _torch_orders(cls, pp, v, m):
    self = SimpleNamespace(n_local_stages=v, pp_group_size=pp, _n_microbatches=m,
                           number_of_rounds=max(1, m // pp))
    self.microbatches_per_round = m // self.number_of_rounds
    out = []
    for rank in range(pp):
        ops = cls._calculate_single_rank_operations(self, rank)
        out.append([(a.stage_index, {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W"}[a.computation_type.name], a.microbatch_index)
                    for a in ops if a is not None])
    return out


@pytest.mark.parametrize("pp,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (2, 1, 4), (4, 2, 4), (3, 2, 9)])
def test_orders_are_torchs_interleaved_and_zero_bubble(pp, v, m):
    from torch.distributed.pipelining import schedules as S

    assert _planner.pp_orders("interleaved", pp, v, m) == _torch_orders(S.ScheduleInterleaved1F1B, pp, v, m)
    assert _planner.pp_orders("zb", pp, v, m) == _torch_orders(S.ScheduleInterleavedZeroBubble, pp, v, m)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=12), st.integers(1, 4), st.integers(1, 2),
       st.sampled_from(["gpipe", "1f1b", "interleaved", "zb"]), st.floats(0.0, 2.0))
def test_invariants(fwd, p, v, schedule, p2p):
    m = len(fwd)
    if schedule == "1f1b" and m < p:
        m, fwd = p, (fwd * p)[:p]
    if schedule in ("gpipe", "1f1b"):
        v = 1
    if schedule in ("interleaved", "zb") and m % max(1, m // p):
        fwd = fwd[:max(1, m // p) * (m // max(1, m // p))]
    sim = pp_simulate(forward=fwd, pp_size=p, virtual_stages=v, schedule=schedule, p2p=p2p)
    total = 3.0 * sum(fwd)
    assert sim.busy.sum() == pytest.approx(total)
    assert sim.makespan >= sim.busy.max() - 1e-9  # a rank's work is serial
    hops = 2 * (p * v - 1) * p2p if p > 1 else 0.0
    # the heaviest micro-batch's path: F and B through every (virtual) stage; zero-bubble splits B into the input
    # grad (on the path) and the weight grad W (off it, but the first stage's W follows its input grad)
    path = 3.0 if schedule != "zb" else 2.0 + 1.0 / (p * v)
    assert sim.makespan >= path * max(fwd) + hops - 1e-9
    assert sim.makespan >= sim.lower_bound - 1e-9


def test_gpipe_equals_1f1b_on_equal_microbatches_with_uneven_layers():
    a = pp_simulate(forward=[2.0] * 8, pp_size=4, schedule="gpipe", layer_cost=[1, 1, 1, 1])
    b = pp_simulate(forward=[2.0] * 8, pp_size=4, schedule="1f1b", layer_cost=[1, 1, 1, 1])
    assert a.makespan == pytest.approx(b.makespan)


def test_bad_arguments_named():
    with pytest.raises(ValueError, match="pp_size"):
        pp_simulate(forward=[1.0], pp_size=0)
    with pytest.raises(ValueError, match="schedule"):
        pp_simulate(forward=[1.0], pp_size=1, schedule="dualpipe")
    with pytest.raises(ValueError, match="layer_cost"):
        pp_simulate(forward=[1.0], pp_size=2, layer_cost=[1.0])
    with pytest.raises(TypeError, match="p2p"):
        pp_simulate(forward=[1.0], pp_size=2, p2p="x")
    with pytest.raises(ValueError, match="virtual_stages"):
        pp_simulate(forward=[1.0, 1.0], pp_size=2, virtual_stages=2, schedule="1f1b")
