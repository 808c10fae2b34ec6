"""Registration of the pipeline planner (issue 61): ``plan_pipeline`` (every document once, rows within capacity,
m rows per DP rank, the simulated step at or above its bound), ``pp_simulate`` (a makespan at or above its bound)
and ``PipelineStepPlanner`` (a stream of steps and its flush: every document once, none late by more than
max_delay)."""
from __future__ import annotations

import numpy as np

import packkit
from packkit.pipeline import PipelineStepPlanner, plan_pipeline, pp_simulate

from .core import Api, Variant

LENGTHS = [300, 5000, 1200, 64, 7000, 2500, 900, 40, 3000, 150, 6000, 800]
CAPACITY = 8192


def _check_plan(plan, kw):
    lengths = np.asarray(kw["lengths"], np.int64)
    seen = np.zeros(len(lengths), np.int64)
    assert len(plan.microbatches) == kw.get("dp_size", 1)
    for rank in plan.microbatches:
        assert len(rank) == plan.num_microbatches
        for row in rank:
            assert row and lengths[row].sum() <= int(kw["capacity"])
            seen[row] += 1
    assert np.all(seen == 1), "a document missing or planned twice"
    assert plan.makespan >= plan.lower_bound * (1 - 1e-9) and plan.lower_bound >= plan.data_bound * (1 - 1e-9)


def plan_pipeline_api() -> Api:
    return Api("packkit.pipeline.plan_pipeline", plan_pipeline,
               lambda: dict(lengths=list(LENGTHS), capacity=CAPACITY, pp_size=2, dp_size=2), _check_plan, variants=[
                   Variant("degenerate", "lengths", "empty", "refuse", lambda kw: {**kw, "lengths": []}),
                   Variant("degenerate", "dp_size", "more ranks than documents", "refuse",
                           lambda kw: {**kw, "dp_size": len(LENGTHS) + 1})])


def _check_sim(sim, kw):
    assert sim.makespan >= sim.lower_bound * (1 - 1e-9) and len(sim.busy) == kw["pp_size"]


def pp_simulate_api() -> Api:
    return Api("packkit.pipeline.pp_simulate", pp_simulate,
               lambda: dict(microbatches=[[300, 40], [5000], [1200, 64]], pp_size=2), _check_sim)


def _steps(capacity, max_delay=1, outlier_factor=4.0, **kw):
    planner = PipelineStepPlanner(capacity, max_delay=max_delay, outlier_factor=outlier_factor, **kw)
    stream = [LENGTHS, LENGTHS[::-1], LENGTHS[3:] + LENGTHS[:3]]
    return [planner.step(s) for s in stream] + planner.flush(), stream, planner.max_delay


def _check_steps(out, kw):
    steps, stream, max_delay = out
    trained = {}
    for s, step in enumerate(steps):
        for rank in step.microbatch_documents():
            for row in rank:
                for doc in row:
                    assert doc not in trained, "a document planned twice"
                    trained[doc] = s
    assert set(trained) == {(s, i) for s, x in enumerate(stream) for i in range(len(x))}, "a document lost"
    assert all(s - arrived <= max_delay for (arrived, _), s in trained.items())


def step_planner_api() -> Api:
    return Api("packkit.pipeline.PipelineStepPlanner", PipelineStepPlanner,
               lambda: dict(capacity=CAPACITY, pp_size=2, dp_size=2, cost="attention"), _check_steps,
               call=lambda **kw: _steps(**kw))


def register(reg: dict) -> None:
    for api in (plan_pipeline_api(), pp_simulate_api(), step_planner_api()):
        reg[api.name] = api
