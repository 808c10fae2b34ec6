"""PipelineStepPlanner (issue 61): consecutive pipeline steps with a bounded outlier delay."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import packkit
from packkit.pipeline import PipelineStepPlanner

pytestmark = pytest.mark.core

COST = (1.0, 1.0 / 4096)


def _run(stream, max_delay, **kw):
    planner = PipelineStepPlanner(kw.pop("capacity", 4096), max_delay=max_delay, cost=COST, **kw)
    steps = [planner.step(lengths) for lengths in stream]
    return steps + planner.flush(), planner


def _trained(steps):
    """(arrival step, index) -> the step that trained it; each document exactly once."""
    out = {}
    for s, step in enumerate(steps):
        for rank in step.microbatch_documents():
            for row in rank:
                for doc in row:
                    assert doc not in out, f"document {doc} trained twice"
                    out[doc] = s
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(1, 4096), min_size=8, max_size=40), min_size=1, max_size=8),
       st.integers(0, 3), st.sampled_from([(2, 1), (2, 2), (4, 1)]))
def test_every_document_once_within_max_delay(stream, max_delay, shape):
    pp, dp = shape
    steps, planner = _run(stream, max_delay, pp_size=pp, dp_size=dp)
    trained = _trained(steps)
    assert set(trained) == {(s, i) for s, lengths in enumerate(stream) for i in range(len(lengths))}
    for (arrived, i), s in trained.items():
        assert arrived <= s <= arrived + max_delay
    for step in steps:
        for rank in step.plan.microbatches:
            for row in rank:
                assert sum(int(step.lengths[d]) for d in row) <= 4096
    assert len(planner.pending) == 0


def test_max_delay_0_is_plan_pipeline_per_step():
    rng = np.random.default_rng(3)
    stream = [rng.integers(1, 400, 64) for _ in range(5)]
    steps, _ = _run(stream, 0, pp_size=2, dp_size=2, num_microbatches=4)
    assert len(steps) == 5
    for lengths, step in zip(stream, steps):
        ref = packkit.plan_pipeline(lengths, 4096, pp_size=2, dp_size=2, num_microbatches=4, cost=COST)
        assert step.held_back == 0
        assert step.plan.makespan == ref.makespan
        assert [[[int(step.documents[d, 1]) for d in row] for row in rank] for rank in step.plan.microbatches] == \
            ref.microbatches


def _moe_stream(steps, seed=0, per_step=64):
    rng = np.random.default_rng(seed)
    return [np.minimum(rng.lognormal(np.log(3000), 0.8, per_step).astype(np.int64) + 1, 32768) for _ in range(steps)]


def test_the_delay_evens_out_step_work_and_is_deterministic():
    stream = _moe_stream(40, per_step=256)
    kw = dict(capacity=65536, pp_size=2, dp_size=4, num_microbatches=8)

    def work_cv(steps):
        w = np.array([packkit.pipeline.simulate.doc_costs(s.lengths, COST).sum() for s in steps[:40]])
        return w.std() / w.mean()

    plain, _ = _run(stream, 0, **dict(kw))
    held, _ = _run(stream, 1, **dict(kw))
    assert work_cv(held) < 0.75 * work_cv(plain)  # control: without the delay the spread is the data's (10%)
    again, _ = _run(stream, 1, **dict(kw))
    assert [s.documents.tolist() for s in again] == [s.documents.tolist() for s in held]
    assert [s.plan.microbatches for s in again] == [s.plan.microbatches for s in held]
    assert sum(s.held_back > 0 for s in held) > 10  # the delay did act


def test_the_heaviest_are_held_and_position_in_the_step_does_not_matter():
    stream = _moe_stream(60, seed=1, per_step=256)
    steps, _ = _run(stream, 1, capacity=65536, pp_size=2, dp_size=4, num_microbatches=8)
    trained = _trained(steps)
    late = np.array([[stream[a][i], i, s - a] for (a, i), s in trained.items()])
    heavy = late[:, 0] > np.quantile(late[:, 0], 0.9)
    assert late[heavy, 2].mean() > 3 * late[~heavy, 2].mean()  # outliers wait; the rest mostly do not
    first, second = late[:, 1] < 128, late[:, 1] >= 128  # halves of each step's list: same delay rate (within noise)
    assert abs(late[first, 2].mean() - late[second, 2].mean()) < 0.05


def test_last_holds_nothing_back():
    planner = PipelineStepPlanner(65536, max_delay=2, pp_size=2, dp_size=2, num_microbatches=4, cost=COST)
    stream = _moe_stream(3, seed=2)
    planner.step(stream[0])
    planner.step(stream[1])
    final = planner.step(stream[2], last=True)
    assert final.held_back == 0 and len(planner.pending) == 0 and planner.flush() == []


def test_bad_input_named():
    with pytest.raises(ValueError, match="max_delay"):
        PipelineStepPlanner(4096, max_delay=-1, pp_size=2)
    with pytest.raises(TypeError, match="pp_size"):
        PipelineStepPlanner(4096)
    with pytest.raises(TypeError, match="num_microbatch"):
        PipelineStepPlanner(4096, pp_size=2, num_microbatch=4)
    with pytest.raises(ValueError, match="capacity"):
        PipelineStepPlanner(0, pp_size=2)
    with pytest.raises(ValueError, match="outlier_factor"):
        PipelineStepPlanner(4096, pp_size=2, outlier_factor=float("nan"))
    planner = PipelineStepPlanner(4096, pp_size=2, dp_size=1, num_microbatches=2)
    with pytest.raises(ValueError, match="over capacity"):
        planner.step([5000, 10, 10])
    assert planner.step([10, 10, 10]).plan.num_microbatches == 2  # a refused step changed nothing
    planner = PipelineStepPlanner(100, max_delay=1, pp_size=2, dp_size=1, num_microbatches=2)
    planner.step([100, 100, 100, 1, 1])  # the step's work target holds the heavy ones back
    with pytest.raises(ValueError, match="must train at this step"):
        planner.step([1, 1], last=True)  # more held-back full rows than 2 micro-batches hold
