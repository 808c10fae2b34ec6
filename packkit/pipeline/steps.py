"""``packkit.PipelineStepPlanner``: consecutive pipeline steps planned with a bounded outlier delay (WLB-LLM's idea).

One step's documents can carry much more work than the next (a 32k rollout costs 70x a 1k one under attention's
``len**2``), so a fixed batch per step gives step times that swing with the data. The planner may hold a document
back for at most ``max_delay`` steps: each step trains the documents that waited ``max_delay`` steps, then the rest
(oldest first), holding back the heaviest ones while the step's work stays at or above the mean work per step that
has arrived so far; only outliers wait (a cost over ``outlier_factor`` x the mean document's), and the lightest few
when what waits would be too few documents to make a step of its own. The held-back documents join the next step. Nothing is dropped: ``flush()`` plans what is left,
and ``step(..., last=True)`` holds nothing back. The same inputs always give the same steps.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from ..planning.arg_rules import Int, Real, check_args
from .plan import PipelinePlan, plan_pipeline
from .simulate import doc_costs


@dataclass(frozen=True)
class PipelineStep:
    plan: PipelinePlan  # its micro-batches index into ``documents``
    documents: np.ndarray  # (k, 2) int64: (the step the document arrived in, its index in that step's lengths)
    lengths: np.ndarray  # (k,) the documents' lengths
    held_back: int  # documents carried to a later step

    def microbatch_documents(self) -> list:
        """Per DP rank, in schedule order: micro-batches as lists of (arrival step, index) pairs."""
        return [[[tuple(int(v) for v in self.documents[d]) for d in row] for row in rank]
                for rank in self.plan.microbatches]


class PipelineStepPlanner:
    """Plan a stream of steps for ``plan_pipeline`` with a bounded delay. A document may wait when its cost is over
    ``outlier_factor`` x the mean document cost of the step's pool. ``plan_kwargs`` go to ``plan_pipeline``
    (``pp_size`` required; ``dp_size``, ``num_microbatches``, ``schedule``, ``cost``, ...)."""

    def __init__(self, capacity: int, *, max_delay: int = 1, outlier_factor: float = 4.0, **plan_kwargs):
        self.capacity, self.max_delay, self._factor = check_args(
            Int("capacity", 1, 2**62), Int("max_delay", 0, 1024), Real("outlier_factor", 0.0),
            values=(capacity, max_delay, outlier_factor))
        if "pp_size" not in plan_kwargs:
            raise TypeError("PipelineStepPlanner needs pp_size= (passed on to plan_pipeline)")
        try:  # names checked now; values by plan_pipeline's rules at the first step, before any state changes
            inspect.signature(plan_pipeline).bind([1], capacity, **plan_kwargs)
        except TypeError as err:
            raise TypeError(f"PipelineStepPlanner: {err} (plan_kwargs go to plan_pipeline)") from None
        self._kw = dict(plan_kwargs)
        self._cost = self._kw.get("cost", "tokens")
        self._least = None  # documents in the smallest step the schedule accepts (set at the first step)
        self._steps = 0
        self._arrived_work = 0.0
        self._held = np.zeros((0, 4), dtype=np.int64)  # arrival step, index, length, age

    @property
    def pending(self) -> np.ndarray:
        """The held-back documents: (arrival step, index, length) rows."""
        return self._held[:, :3].copy()

    def step(self, lengths, *, last: bool = False) -> PipelineStep:
        """Plan one step: the held-back documents plus this step's ``lengths``. ``last=True`` holds nothing back."""
        from ..planning.planner import as_lengths

        new = as_lengths(lengths)
        if self._least is None:
            self._least = self._fewest_documents()
        arrived = np.stack([np.full(new.size, self._steps), np.arange(new.size), new, np.zeros(new.size)],
                           axis=1).astype(np.int64)
        pool = np.concatenate([self._advance(self._held), arrived])
        work = doc_costs(new, self._cost).sum()
        target = (self._arrived_work + work) / (self._steps + 1)
        keep = self._choose(pool, target, final=last)
        step = self._plan(pool, keep, final=last)
        self._steps += 1
        self._arrived_work += work
        self._held = pool[~keep]
        return step

    def flush(self) -> list:
        """Plan every held-back document (one step, nothing held back); [] when none is left."""
        if len(self._held) == 0:
            return []
        pool = self._advance(self._held)
        step = self._plan(pool, np.ones(len(pool), dtype=bool), final=True, grow=True)
        self._held = self._held[:0]
        return [step]

    def _fewest_documents(self) -> int:
        from .. import _planner

        kw = self._kw
        check_args(Int("pp_size", 1, 4096), Int("dp_size", 1, 2**31), Int("virtual_stages", 1, 4096),
                   Int("microbatch_group", 1, 2**31),
                   values=(kw["pp_size"], kw.get("dp_size", 1), kw.get("virtual_stages", 1),
                           kw.get("microbatch_group", 1)))
        m = _planner.valid_microbatches(str(kw.get("schedule", "1f1b")), int(kw["pp_size"]),
                                        int(kw.get("virtual_stages", 1)), int(kw.get("microbatch_group", 1)), 1)
        return int(kw.get("dp_size", 1)) * int(m)

    @staticmethod
    def _advance(held: np.ndarray) -> np.ndarray:
        held = held.copy()
        held[:, 3] += 1
        return held

    def _choose(self, pool: np.ndarray, target: float, final: bool) -> np.ndarray:
        """Which of ``pool`` train now: every document when ``final`` or when ``max_delay`` is 0; else all but the
        heaviest outliers that may still wait, held back while the rest still reach ``target``."""
        keep = np.ones(len(pool), dtype=bool)
        if final or self.max_delay == 0 or len(pool) == 0:
            return keep
        cost = doc_costs(pool[:, 2], self._cost)
        work = float(cost.sum())
        m = self._kw.get("num_microbatches")
        least = int(self._kw.get("dp_size", 1)) * int(m) if m else self._least  # a document per micro-batch
        waiting = pool[:, 3] < self.max_delay  # may still wait
        # heaviest first; ties by arrival (the older trains, so the later is held)
        by_cost = np.lexsort((-pool[:, 1], -pool[:, 0], -cost))
        count = len(pool)
        for i in by_cost:  # outliers only (WLB-LLM): the rest never wait
            if cost[i] <= self._factor * target / len(pool) or count - 1 < least:
                break
            if waiting[i] and work - cost[i] >= target:
                keep[i] = False
                work -= cost[i]
                count -= 1
        # What is held must make a step of its own should the stream end (flush): nothing, or at least the smallest
        # step's documents (topped up with the lightest that may wait) that plan_pipeline can plan alone.
        held = int((~keep).sum())
        if 0 < held < self._least:
            lightest = [i for i in by_cost[::-1] if keep[i] and waiting[i]][: self._least - held]
            if held + len(lightest) < self._least or count - len(lightest) < least:
                keep[:] = True
            else:
                keep[lightest] = False
        if not keep.all() and not self._plannable(pool[~keep]):
            keep[:] = True  # e.g. too long to share rows: as many rows as documents would not be a valid step
        return keep

    def _plannable(self, held: np.ndarray) -> bool:
        try:
            plan_pipeline(held[:, 2], self.capacity, **{**self._kw, "num_microbatches": None})
        except ValueError:
            return False
        return True

    def _plan(self, pool: np.ndarray, keep: np.ndarray, final: bool, grow: bool = False) -> PipelineStep:
        kw = {**self._kw, "num_microbatches": None} if grow else self._kw  # flush: as few micro-batches as fit
        chosen = pool[keep]
        for _ in range(len(pool) + 1):  # a step whose documents do not fit its rows takes one fewer (lightest held)
            try:
                plan = plan_pipeline(chosen[:, 2], self.capacity, **kw)
                break
            except ValueError as err:
                if "cannot hold" not in str(err):
                    raise
                optional = np.flatnonzero(keep & (pool[:, 3] < self.max_delay))
                if final or len(optional) == 0 or len(chosen) <= 1:
                    raise ValueError(f"PipelineStepPlanner: the documents that must train at this step (the last "
                                     f"step, or held max_delay={self.max_delay} steps) do not fit its micro-batches "
                                     f"(pass num_microbatches=None to let the step grow): {err}") from err
                heaviest = optional[np.argmax(pool[optional, 2])]
                keep[heaviest] = False
                chosen = pool[keep]
        return PipelineStep(plan, chosen[:, :2].copy(), chosen[:, 2].copy(), int((~keep).sum()))
