"""``packkit.plan_pipeline``: packed micro-batches for every pipeline stage (C++ core: csrc/planner/pipeline_plan.cpp).

The plan chooses which documents share a micro-batch row (each <= ``capacity`` tokens, balanced by cost), which
DP rank runs each row (exactly ``num_microbatches`` rows per rank), and the order of the rows in the step (the
fastest of a few shapes and pairwise swaps under the same simulator as :func:`packkit.planning.pp_simulate`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..planning.arg_rules import Choice, Int, Real, check_args
from .simulate import SCHEDULES, doc_costs, stage_weights


@dataclass(frozen=True)
class PipelinePlan:
    microbatches: list  # per DP rank, in schedule order: micro-batches, each a list of document indices (one row)
    makespan: float  # simulated step time: the slowest DP rank's pipeline
    lower_bound: float  # certified bound on any order of these micro-batches (docs/planner.md)
    data_bound: float  # certified bound on any plan of these documents over these ranks
    rank_makespan: np.ndarray
    busy_work: float  # the sum of all ops' costs over all DP ranks
    pp_size: int
    dp_size: int
    num_microbatches: int
    schedule: str

    @property
    def bubble_fraction(self) -> float:
        total = self.pp_size * self.dp_size * self.makespan
        return 0.0 if total <= 0 else float(1.0 - self.busy_work / total)

    def summary(self) -> str:
        return (f"plan_pipeline: {self.schedule}, pp {self.pp_size} x dp {self.dp_size}, {self.num_microbatches} "
                f"micro-batches per rank; step {self.makespan:.4g} (bound {self.lower_bound:.4g}, "
                f"{self.makespan / max(self.lower_bound, 1e-300):.3f}x; over any plan {self.data_bound:.4g}), "
                f"bubble {100 * self.bubble_fraction:.1f}%")


def plan_pipeline(lengths, capacity: int, *, pp_size: int, dp_size: int = 1, num_microbatches=None,
                  schedule: str = "1f1b", virtual_stages: int = 1, microbatch_group: int = 1, cost="tokens",
                  layer_cost=None, backward_ratio: float = 2.0, weight_fraction: float = 0.5, p2p: float = 0.0,
                  order_rounds: int = 64, padding_cost: float = 0.0) -> PipelinePlan:
    """Plan one step of documents ``lengths`` for ``pp_size`` pipeline stages x ``dp_size`` DP ranks.
    ``num_microbatches`` per DP rank (None: the fewest that hold the tokens and the schedule accepts).
    ``padding_cost``: the cost of one padding token when every micro-batch is padded to ``capacity`` tokens (torch's
    pipeline schedules take one shape per step: ``pipeline_microbatches`` pads so), usually the per-token linear
    part of ``cost`` (1.0 for ``"tokens"``, ``a`` for ``(a, b)``); 0 for rows that are not padded (varlen THD,
    Megatron's ``variable_seq_lengths``). A padded row then costs the same tokens however full it is."""
    from ..planning.planner import as_lengths

    array = as_lengths(lengths)
    n = int(array.size)
    if n == 0:
        raise ValueError("lengths is empty: a pipeline step needs at least dp_size documents")
    cap, pp, dp, v, group = check_args(
        Int("capacity", 1, 2**62), Int("pp_size", 1, 4096), Int("dp_size", 1, max(1, n)),
        Int("virtual_stages", 1, 4096), Int("microbatch_group", 1, max(1, n)),
        values=(capacity, pp_size, dp_size, virtual_stages, microbatch_group))
    m, schedule, rounds = check_args(Int("num_microbatches", 1, max(1, n), optional=True),
                                     Choice("schedule", SCHEDULES), Int("order_rounds", 0, 10**6),
                                     values=(num_microbatches, schedule, order_rounds))
    ratio, wf, p2p, pad = check_args(Real("backward_ratio", 0.0), Real("weight_fraction", 0.0, 1.0), Real("p2p", 0.0),
                                     Real("padding_cost", 0.0), values=(backward_ratio, weight_fraction, p2p,
                                                                        padding_cost))
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"virtual_stages must be 1 under schedule {schedule!r}; use 'interleaved' or 'zb'")
    if array.min() < 1:
        raise ValueError(f"lengths must be >= 1; index {int(np.argmin(array))} is {int(array.min())}")
    if array.max() > cap:
        raise ValueError(f"lengths[{int(np.argmax(array))}] = {int(array.max())} is over capacity {cap}")
    costs = doc_costs(array, cost)
    if pad > 0.0:  # a document's own cost over the padding it displaces: each row pays capacity x pad whatever it holds
        own = costs - pad * array
        worst = int(np.argmin(own / np.maximum(costs, 1e-300)))
        if own[worst] < -1e-9 * costs[worst]:
            raise ValueError(f"padding_cost = {pad} is more than a real token costs: document {worst} ({int(array[worst])} "
                             f"tokens) costs {float(costs[worst]):.6g}, its padding would cost {pad * array[worst]:.6g}")
        costs = np.maximum(own, 0.0)
    weights = stage_weights(layer_cost, pp * v)
    from .. import _planner

    r = _planner.plan_pipeline(array, costs, cap, pp, dp, m or 0, schedule, v, group, weights, ratio, wf, p2p, rounds,
                               pad * cap)
    docs, off, k = r["docs"], r["row_offsets"], int(r["num_microbatches"])
    rows = [docs[off[i]:off[i + 1]].tolist() for i in range(len(off) - 1)]
    per_rank = [rows[j * k:(j + 1) * k] for j in range(dp)]
    return PipelinePlan(per_rank, float(r["makespan"]), float(r["lower_bound"]), float(r["data_bound"]),
                        np.asarray(r["rank_makespan"]), float((costs.sum() + dp * k * pad * cap) * (1.0 + ratio)), pp,
                        dp, k, schedule)
