"""Dynamic context parallelism: each sequence's CP size and CP group, and the order ranks run them in
(:func:`plan_context_parallel`; the algorithm is C++, ``csrc/planner/context_parallel_plan.cpp``).

Execution model: a plan is a list of passes ``(ranks, seqs)``, one forward/backward of a packed row with every
sequence CP-sharded (zigzag) over all of ``ranks``. Each rank runs the passes naming it in list order; a pass starts
when all its ranks are free and lasts ``pass_overhead + sum(t(s, c)) / min(speed of its ranks)`` with
``t(s, c) = cost(s) / c + cp_comm * (c - 1) / c * s`` (``cost(s)`` at c = 1). Under ``barrier="pass"`` every rank
runs one pass per step and each step is a global barrier (FSDP / ZeRO-3)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .arg_rules import MAX_INT, Int, Real
from .planner import _cost_model, as_lengths

CP_SIZES = ("pow2", "any")
MAX_WORLD = 1 << 20  # ranks; per-rank state is O(world_size), so the bound keeps memory by the data's scale
BARRIERS = ("none", "pass")


def _real(value, name: str) -> float:
    """A finite real >= 0 under the declared rule (arg_rules.Real: bools, strings and ints beyond float64 refused)."""
    return Real(name, 0.0).check(value)


def _int(value, name: str, low: int = 1) -> int:
    """An int in ``[low, 2**63 - 1]`` under the declared rule (arg_rules.Int: bools and floats refused)."""
    return Int(name, low, MAX_INT).check(value)


def _per_rank(value, world: int, name: str, kind: str) -> np.ndarray:
    """One value per rank from a scalar or a sequence of ``world`` values (ints in [1, 2**63 - 1] or finite reals
    > 0), under the declared rules: a bool anywhere is refused (``[True, 3]`` as ``True``), so is an int beyond
    int64 (2**63 wrapped to a negative cap) or float64."""
    scalar = isinstance(value, numbers.Number) or (isinstance(value, np.ndarray) and value.ndim == 0)
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number or one per rank, got bool")
    if not scalar and not isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"{name} must be a number or one per rank, got {type(value).__name__}")
    rule = Int(name, 1, MAX_INT) if kind == "int" else Real(name, 0.0)
    if isinstance(value, numbers.Number):
        rule.check(value)
    if isinstance(value, (list, tuple)):  # each entry under the rule (numpy would make [True, 3] ints, [2**63] uint64)
        for r, v in enumerate(value):
            try:
                rule.check(v)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{name}[{r}]: {exc}") from None
    array = np.asarray(value)
    if array.dtype.kind == "b" or array.dtype.kind not in ("iu" if kind == "int" else "iuf"):
        raise TypeError(f"{name} must hold {'ints' if kind == 'int' else 'real numbers'}, got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.size and int(array.max()) > MAX_INT:
        raise ValueError(f"{name} must be <= 2**63 - 1 (int64) for every rank; got {int(array.max())}")
    if array.ndim == 0:
        array = np.full(world, array)
    if array.ndim != 1 or len(array) != world:
        raise ValueError(f"{name} must be one value or {world} values (one per rank), got shape {array.shape}")
    if not np.all(np.isfinite(array)) or (array <= 0).any():
        bad = int(np.flatnonzero(~np.isfinite(array) | (array <= 0))[0])
        raise ValueError(f"{name} must be finite and > 0 for every rank; rank {bad} has {array[bad]!r}")
    return array.astype(np.int64 if kind == "int" else np.float64)


def plan_context_parallel(lengths, world_size, max_tokens_per_rank, *, cost="attention", cp_comm=0.0,
                          pass_overhead=0.0, cp_sizes="pow2", min_cp_size=1, max_cp_size=None, rank_speed=None,
                          barrier="none") -> "ContextParallelPlan":
    """Plans which ranks run each sequence, at which CP size, in which order (module docstring: the model).

    ``cost`` is what :func:`packkit.plan` takes. ``max_tokens_per_rank``: local tokens per rank and pass (zigzag
    padded: ``2 * ceil(len / (2c))`` per sequence at c > 1), an int or one per rank. ``cp_sizes="pow2"``: groups
    are aligned blocks ``[j*c, (j+1)*c)`` of power-of-two size; ``"any"``: contiguous blocks of any size.
    Zero-length sequences are allowed: without cost they join an existing pass (no tokens, no time)."""
    from .. import _planner

    lengths = as_lengths(lengths)
    if lengths.size and lengths.min() < 0:
        bad = int(np.argmin(lengths))
        raise ValueError(f"lengths must be >= 0; index {bad} is {int(lengths[bad])}")
    world = Int("world_size", 1, MAX_WORLD).check(world_size)
    caps = _per_rank(max_tokens_per_rank, world, "max_tokens_per_rank", "int")
    speed = np.ones(world) if rank_speed is None else _per_rank(rank_speed, world, "rank_speed", "real")
    cp_comm, pass_overhead = _real(cp_comm, "cp_comm"), _real(pass_overhead, "pass_overhead")
    if cp_sizes not in CP_SIZES:
        raise ValueError(f"cp_sizes must be one of {CP_SIZES}, got {cp_sizes!r}")
    if barrier not in BARRIERS:
        raise ValueError(f"barrier must be one of {BARRIERS}, got {barrier!r}")
    pow2 = cp_sizes == "pow2"
    min_cp = _int(min_cp_size, "min_cp_size")
    if max_cp_size is None:
        max_cp = 1 << (world.bit_length() - 1) if pow2 else world
    else:
        max_cp = _int(max_cp_size, "max_cp_size")
        if max_cp > world or world % max_cp:
            raise ValueError(f"world_size ({world}) must be a multiple of max_cp_size ({max_cp})")
    for name, value in (("min_cp_size", min_cp), ("max_cp_size", max_cp)):
        if pow2 and value & (value - 1):
            raise ValueError(f"{name} must be a power of two with cp_sizes='pow2', got {value}")
    if min_cp > max_cp:
        raise ValueError(f"min_cp_size ({min_cp}) must be <= max_cp_size ({max_cp})")
    a, b, item_costs = _cost_model(cost)
    as_float = lengths.astype(np.float64)
    costs = item_costs(lengths) if item_costs is not None else a * as_float + b * as_float * as_float
    if not np.all(np.isfinite(costs)):
        raise ValueError("cost overflows float64 for these lengths")
    # Every pass time the planner forms is at most this (all sequences in one pass on the slowest rank): finite,
    # or the simulated times are inf / NaN and no plan is comparable.
    with np.errstate(over="ignore", invalid="ignore"):
        work = float(np.sum(costs)) + cp_comm * float(np.sum(as_float)) + pass_overhead * (lengths.size + 1)
        worst = work / float(speed.min())
    if not math.isfinite(work):
        raise ValueError("cost, cp_comm and pass_overhead give pass times that overflow float64 "
                         f"(cp_comm={cp_comm!r}, pass_overhead={pass_overhead!r}); scale them down")
    if not math.isfinite(worst):  # the work is finite: the slowest speed's division overflows
        r = int(np.argmin(speed))
        raise ValueError(f"rank_speed gives pass times (work / rank_speed) that overflow float64: rank {r} has speed "
                         f"{float(speed[r])!r}; rank_speed must be > 0 and large enough that the work divided by it "
                         "fits float64 (e.g. relative speeds near 1)")
    raw = _planner.plan_context_parallel(lengths, np.ascontiguousarray(costs, dtype=np.float64), world,
                                         np.ascontiguousarray(caps, dtype=np.int64),
                                         np.ascontiguousarray(speed, dtype=np.float64), cp_comm, pass_overhead, pow2,
                                         min_cp, max_cp, barrier == "pass")
    return ContextParallelPlan(raw, lengths, costs, world, caps, speed, cp_comm, pass_overhead, barrier)


class ContextParallelPlan:
    """The result of :func:`plan_context_parallel`. Arrays per pass (execution order): ``pass_rank_start``,
    ``pass_group_size``, ``pass_start`` / ``pass_duration`` (seconds, simulated), ``pass_local_tokens``
    (per rank), ``pass_step`` ("pass" barrier); ``cp_size`` per sequence; ``makespan`` and its certified
    ``lower_bound`` (no plan of these sequences under this model finishes earlier)."""

    def __init__(self, raw: dict, lengths, costs, world, caps, speed, cp_comm, pass_overhead, barrier):
        self.lengths, self.costs, self.world_size = lengths, costs, world
        self.max_tokens_per_rank, self.rank_speed = caps, speed
        self.cp_comm, self.pass_overhead, self.barrier = cp_comm, pass_overhead, barrier
        self.pass_rank_start, self.pass_group_size = raw["rank_start"], raw["group_size"]
        self.pass_offsets, self.pass_seqs = raw["offsets"], raw["seqs"]
        self.pass_step, self.pass_local_tokens = raw["step"], raw["local_tokens"]
        self.pass_start, self.pass_duration = raw["start"], raw["duration"]
        self.cp_size = raw["cp_size"]
        self.makespan, self.lower_bound = float(raw["makespan"]), float(raw["lower_bound"])
        self.num_steps = int(raw["num_steps"]) if barrier == "pass" else None
        self.candidates = int(raw["candidates"])
        self._passes = None

    @property
    def num_passes(self) -> int:
        return len(self.pass_rank_start)

    @property
    def passes(self) -> list:
        """``[(ranks, seqs), ...]`` in execution order: ``ranks`` a ``range``, ``seqs`` an int64 array of input
        indices (sorted), each sharded over all of ``ranks``."""
        if self._passes is None:
            starts, sizes, offsets = self.pass_rank_start.tolist(), self.pass_group_size.tolist(), self.pass_offsets
            self._passes = [(range(s, s + c), self.pass_seqs[offsets[p]:offsets[p + 1]])
                            for p, (s, c) in enumerate(zip(starts, sizes))]
        return self._passes

    @property
    def steps(self) -> list | None:
        """``barrier="pass"``: one list per step of its passes ``(ranks, seqs)``, a partition of all ranks (idle
        ranks run an empty pass); None without barrier."""
        if self.barrier != "pass":
            return None
        steps = [[] for _ in range(self.num_steps)]
        for step, entry in zip(self.pass_step.tolist(), self.passes):
            steps[step].append(entry)
        return steps

    def rank_passes(self, rank: int) -> list:
        """Rank ``rank``'s passes in the order it runs them: ``(group, cp_rank, seqs)``."""
        rank = _int(rank, "rank", 0)
        if rank >= self.world_size:
            raise ValueError(f"rank must be < world_size ({self.world_size}), got {rank}")
        mine = np.flatnonzero((self.pass_rank_start <= rank) & (rank < self.pass_rank_start + self.pass_group_size))
        return [(self.passes[p][0], rank - int(self.pass_rank_start[p]), self.passes[p][1]) for p in mine.tolist()]

    def to_megatron(self) -> tuple[list, list]:
        """``(groups, sample_id_groups)`` as ``BalancedCPScheduler.get_groups_and_subsamples`` returns them: per
        group, per rank, the lengths / sample ids it runs, in order; ranks listing the same id are its CP set. One
        group without barrier (the list order is deadlock-free: every rank follows one global order), one per step
        under ``barrier="pass"``. Megatron runs each id as its own micro-batch: a pass's packing is lost there."""
        num_groups = self.num_steps if self.barrier == "pass" else 1
        ids = [[[] for _ in range(self.world_size)] for _ in range(num_groups)]
        steps = self.pass_step.tolist() if self.barrier == "pass" else [0] * self.num_passes
        for (ranks, seqs), g in zip(self.passes, steps):
            seqs = seqs.tolist()
            for r in ranks:
                ids[g][r].extend(seqs)
        lengths = self.lengths.tolist()
        groups = [[[lengths[i] for i in rank_ids] for rank_ids in group] for group in ids]
        return groups, ids

    def summary(self) -> dict:
        """Makespan vs bound, balance (makespan / mean rank busy time), communication share (CP communication's
        part of all busy rank-seconds), passes, steps, peak local tokens, sequences per CP size."""
        sizes = self.pass_group_size.astype(np.float64)
        busy = float((sizes * self.pass_duration).sum())
        comm = comm_seconds(self)
        sizes_used, counts = np.unique(self.cp_size, return_counts=True)
        return {"makespan": self.makespan, "lower_bound": self.lower_bound,
                "ratio": self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0,
                "balance": self.makespan * self.world_size / busy if busy > 0 else 1.0,
                "communication_share": comm / busy if busy > 0 else 0.0,
                "passes": self.num_passes, "steps": self.num_steps,
                "peak_local_tokens": int(self.pass_local_tokens.max()) if self.num_passes else 0,
                "cp_sizes": {int(c): int(k) for c, k in zip(sizes_used, counts)}}

    def __repr__(self) -> str:
        return (f"ContextParallelPlan({len(self.lengths)} sequences, {self.world_size} ranks, {self.num_passes} passes, "
                f"makespan {self.makespan:.4g} s, bound {self.lower_bound:.4g} s)")


def comm_seconds(plan: ContextParallelPlan) -> float:
    """Rank-seconds of CP communication in ``plan``: ``cp_comm * (c - 1) / c * s`` per sequence and rank of its
    group, at the group's slowest speed."""
    group = np.repeat(np.arange(plan.num_passes), np.diff(plan.pass_offsets))
    c = plan.pass_group_size[group].astype(np.float64)
    if (plan.rank_speed == plan.rank_speed[0]).all():
        speed = np.full(plan.num_passes, plan.rank_speed[0])
    else:
        speed = np.array([plan.rank_speed[s:s + k].min() for s, k in zip(plan.pass_rank_start, plan.pass_group_size)])
    per_seq = plan.cp_comm * (c - 1) / c * plan.lengths[plan.pass_seqs] / speed[group] if len(group) else c
    return float((per_seq * c).sum())
