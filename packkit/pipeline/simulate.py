"""``packkit.planning.pp_simulate``: one pipeline step under torch.distributed.pipelining's schedules, simulated.

Each rank runs its ops in the order the torch schedule issues them (``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``; the C++ orders in csrc/planner/pipeline_sim.cpp); an
op starts when its rank is free and its inputs have arrived (``p2p`` per hop between ranks). Costs per micro-batch
and stage come from the cost model ``a * len + b * len**2`` summed over a micro-batch's documents and split over
the stages evenly or by ``layer_cost``; backward = ``backward_ratio`` x forward; under ``"zb"`` a
``weight_fraction`` of the backward runs as the separate weight-gradient op.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..planning.arg_rules import Choice, Int, Real, check_args

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")


@dataclass(frozen=True)
class PipelineSim:
    makespan: float
    busy: np.ndarray  # per pipeline rank
    lower_bound: float  # certified: no order of these micro-batches finishes sooner (docs/planner.md)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the ranks' time: 1 - sum(busy) / (pp * makespan)."""
        return 0.0 if self.makespan <= 0 else float(1.0 - self.busy.sum() / (len(self.busy) * self.makespan))


def doc_costs(lengths: np.ndarray, cost) -> np.ndarray:
    """Per-document forward cost under ``cost`` (as packkit.plan's ``cost=``: 'tokens', 'attention', (a, b) or a
    callable)."""
    from ..planning.planner import _cost_model

    a, b, fn = _cost_model(cost)
    lengths = np.asarray(lengths, dtype=np.int64)
    if fn is not None:
        return fn(lengths)
    x = lengths.astype(np.float64)
    return a * x + b * x * x


def stage_weights(layer_cost, stages: int) -> list:
    if layer_cost is None:
        return []
    w = np.asarray(layer_cost, dtype=np.float64).reshape(-1) if not isinstance(layer_cost, (str, bytes)) else None
    if w is None or w.size != stages or not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"layer_cost must be {stages} finite weights >= 0 (one per stage, pp_size * virtual_stages),"
                         f" not all 0; got {layer_cost!r:.80}")
    return w.tolist()


def pp_simulate(microbatches=None, *, pp_size: int, schedule: str = "1f1b", virtual_stages: int = 1,
                forward=None, backward=None, cost="tokens", layer_cost=None, backward_ratio: float = 2.0,
                weight_fraction: float = 0.5, p2p: float = 0.0) -> PipelineSim:
    """Simulate one step. ``microbatches``: a list of micro-batches, each a list of document lengths (costed by
    ``cost``); or ``forward``: per-micro-batch forward costs. ``backward``: per-micro-batch backward costs (default
    ``backward_ratio`` x forward)."""
    pp, v, schedule = check_args(Int("pp_size", 1, 4096), Int("virtual_stages", 1, 4096),
                                 Choice("schedule", SCHEDULES), values=(pp_size, virtual_stages, schedule))
    ratio, wf, p2p = check_args(Real("backward_ratio", 0.0), Real("weight_fraction", 0.0, 1.0), Real("p2p", 0.0),
                                values=(backward_ratio, weight_fraction, p2p))
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"virtual_stages must be 1 under schedule {schedule!r} (one stage per rank), got {v}")
    if (microbatches is None) == (forward is None):
        raise ValueError("pass exactly one of microbatches (lists of document lengths) and forward (costs)")
    if forward is None:
        fwd = np.array([doc_costs(np.asarray(mb, dtype=np.int64), cost).sum() for mb in microbatches])
    else:
        fwd = np.asarray(forward, dtype=np.float64).reshape(-1)
    if fwd.size == 0 or not np.all(np.isfinite(fwd)) or (fwd < 0).any():
        raise ValueError("forward costs must be finite and >= 0, at least one micro-batch")
    stages = pp * v
    w = np.asarray(stage_weights(layer_cost, stages) or [1.0] * stages)
    share = w / w.sum()
    f = np.outer(fwd, share)
    if backward is not None:
        bwd = np.asarray(backward, dtype=np.float64).reshape(-1)
        if bwd.shape != fwd.shape or not np.all(np.isfinite(bwd)) or (bwd < 0).any():
            raise ValueError(f"backward must be {fwd.size} finite costs >= 0, one per micro-batch")
        b = np.outer(bwd, share)
    else:
        b = ratio * f
    wgt = b * wf if schedule == "zb" else np.zeros_like(b)
    if schedule == "zb":
        b = b - wgt
    from .. import _planner

    r = _planner.pp_simulate(f, b, wgt, schedule, pp, v, p2p)
    return PipelineSim(float(r["makespan"]), np.asarray(r["busy"]), float(r["lower_bound"]))
