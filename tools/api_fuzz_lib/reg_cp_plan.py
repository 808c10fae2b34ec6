"""Registration of ``packkit.plan_context_parallel`` (dynamic context parallelism): a valid baseline, its invariant
checker (every sequence once and whole, groups inside the world, each pass's local tokens within its ranks' cap, the
makespan at or above the certified bound) and the degenerate variants."""
from __future__ import annotations

import numpy as np

import packkit

from .core import Api, Variant

LENGTHS = [100, 5000, 20000, 300, 7000, 0, 64]
WORLD, CAP = 8, 8192


def _local_tokens(length: int, c: int) -> int:
    return length if c == 1 else 2 * -(-length // (2 * c))


def _check(plan, kw):
    lengths = np.asarray(kw["lengths"], np.int64)
    world = int(kw["world_size"])
    caps = np.broadcast_to(np.asarray(kw["max_tokens_per_rank"], np.int64), (world,))
    seen = np.zeros(len(lengths), np.int64)
    for ranks, seqs in plan.passes:
        ranks = list(ranks)
        assert ranks and 0 <= ranks[0] and ranks[-1] < world and ranks == list(range(ranks[0], ranks[-1] + 1))
        seen[np.asarray(seqs, np.int64)] += 1
        assert sum(_local_tokens(int(lengths[s]), len(ranks)) for s in seqs) <= caps[ranks].min()
    assert np.all(seen == 1), "a sequence missing or planned twice"
    assert plan.makespan >= plan.lower_bound * (1 - 1e-9)


def plan_context_parallel_api() -> Api:
    return Api("packkit.plan_context_parallel", packkit.plan_context_parallel,
               lambda: dict(lengths=list(LENGTHS), world_size=WORLD, max_tokens_per_rank=CAP), _check, variants=[
                   Variant("degenerate", "lengths", "empty", "either", lambda kw: {**kw, "lengths": []}),
                   Variant("degenerate", "lengths", "all zero", "either", lambda kw: {**kw, "lengths": [0, 0]}),
                   Variant("degenerate", "lengths", "longer than the whole world holds", "refuse",
                           lambda kw: {**kw, "lengths": [WORLD * CAP * 4]}),
                   Variant("degenerate", "max_tokens_per_rank", "one cap short", "refuse",
                           lambda kw: {**kw, "max_tokens_per_rank": [CAP] * (WORLD - 1)}),
                   Variant("degenerate", "rank_speed", "nan", "refuse",
                           lambda kw: {**kw, "rank_speed": [float("nan")] * WORLD}),
                   Variant("degenerate", "max_cp_size", "world not a multiple", "refuse",
                           lambda kw: {**kw, "world_size": 6, "max_cp_size": 4}),
                   Variant("degenerate", "max_tokens_per_rank", "a cap of 2**62 (work bounded by the data)", "either",
                           lambda kw: {**kw, "max_tokens_per_rank": 2**62})])


def register(reg: dict) -> None:
    api = plan_context_parallel_api()
    reg[api.name] = api
