"""The execution model of :func:`packkit.plan_context_parallel`, in plain Python, for pass lists made anywhere:
packkit's own (``plan.passes``) or Megatron's ``BalancedCPScheduler`` output (:func:`megatron_passes`), so both are
timed under one model (``benchmarks/bench_long_context.py``)."""
from __future__ import annotations

import numpy as np

from .planner import _cost_model, as_lengths


def pass_time(lengths, costs, seqs, c: int, cp_comm: float, pass_overhead: float, speed: float) -> float:
    """``pass_overhead + sum(t(s, c)) / speed``, ``t(s, c) = cost(s) / c + cp_comm * (c - 1) / c * s`` (c > 1)."""
    seqs = np.asarray(seqs, dtype=np.int64)
    if c == 1:
        work = float(costs[seqs].sum())
    else:
        work = float((costs[seqs] / c + cp_comm * (c - 1) / c * lengths[seqs]).sum())
    return pass_overhead + work / speed


def simulate_passes(lengths, passes, world_size: int, *, cost="attention", cp_comm=0.0, pass_overhead=0.0,
                    rank_speed=None, steps=None) -> dict:
    """Makespan of ``passes`` (``[(ranks, seqs), ...]``, any rank lists) under the model: each rank runs its passes
    in list order, a pass starts when all its ranks are free. With ``steps`` (one step index per pass) every step
    is a global barrier instead: a step lasts its longest pass. Returns makespan, per-rank busy seconds, passes and
    CP communication's share of the busy rank-seconds and the peak local tokens per rank (zigzag: ``2 * ceil(len / (2c))`` per sequence at c > 1)."""
    lengths = as_lengths(lengths)
    a, b, item_costs = _cost_model(cost)
    as_float = lengths.astype(np.float64)
    costs = item_costs(lengths) if item_costs is not None else a * as_float + b * as_float * as_float
    from .context_parallel import MAX_WORLD, _per_rank, _real
    from .arg_rules import Int

    world_size = Int("world_size", 1, MAX_WORLD).check(world_size)  # the planner's rules: no bools, no 2.0
    cp_comm, pass_overhead = _real(cp_comm, "cp_comm"), _real(pass_overhead, "pass_overhead")
    speed = np.ones(world_size) if rank_speed is None else _per_rank(rank_speed, world_size, "rank_speed", "real")
    free = np.zeros(world_size)
    busy = np.zeros(world_size)
    step_len: dict[int, float] = {}
    peak = 0
    comm = 0.0
    for p, (ranks, seqs) in enumerate(passes):
        ranks = np.asarray(list(ranks), dtype=np.int64)
        c = len(ranks)
        seqs = np.asarray(seqs, dtype=np.int64)
        d = pass_time(lengths, costs, seqs, c, cp_comm, pass_overhead, float(speed[ranks].min()))
        local = lengths[seqs] if c == 1 else 2 * -(-lengths[seqs] // (2 * c))
        peak = max(peak, sum(local.tolist()))  # Python ints: lengths near 2**62 would wrap an int64 sum
        busy[ranks] += d
        if c > 1:  # CP communication's rank-seconds: cp_comm * (c - 1) / c * s on each of the c ranks
            comm += cp_comm * (c - 1) * float(lengths[seqs].sum()) / float(speed[ranks].min())
        if steps is None:
            free[ranks] = free[ranks].max() + d
        else:
            step_len[steps[p]] = max(step_len.get(steps[p], 0.0), d)
    makespan = float(free.max()) if steps is None else float(sum(step_len.values()))
    return {"makespan": makespan, "busy": busy, "passes": len(passes), "peak_local_tokens": peak,
            "communication_share": comm / float(busy.sum()) if busy.sum() > 0 else 0.0}


def megatron_passes(sample_id_groups) -> list:
    """Passes of Megatron's ``(groups, sample_id_groups)`` output at its best under the model: in each group the
    ranks listing the same ids are one CP set, running each id as its own pass in list order; no barrier between
    groups (Megatron's own schedule adds one at each group's end). Ids are the input indices."""
    passes = []
    for group in sample_id_groups:
        sets: dict[tuple, list] = {}
        for rank, ids in enumerate(group):
            if ids:
                sets.setdefault(tuple(ids), []).append(rank)
        for ids, ranks in sets.items():
            passes.extend((ranks, [i]) for i in ids)
    return passes
