"""Registration of ``packkit.plan_context_parallel`` (dynamic context parallelism): a valid baseline, its invariant
checker (every sequence once and whole, groups inside the world, each pass's local tokens within its ranks' cap, the
makespan at or above the certified bound) and the degenerate variants; and of a pass's batches
(``pack_context_parallel_pass`` / ``iter_context_parallel``): the whole group's tokens, each once."""
from __future__ import annotations

import numpy as np

import packkit

from .checks import check_tokens, sources
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


PASS_LENGTHS = [40, 3, 9, 0, 5, 7, 11, 6]  # on 4 ranks at 12 local tokens: passes of cp 4 (the 40), 2 and 1


def _pass_plan():
    return packkit.plan_context_parallel(PASS_LENGTHS, 4, 12, cp_comm=5.0, pass_overhead=1.0)


def _check_group(kw, index, batch_of):
    """The pass's documents' tokens, each once, across its group's batches (``batch_of(rank)``)."""
    plan = kw["plan"]
    ranks, docs = plan.passes[index]
    parts = [batch_of(r)["input_ids"].reshape(-1) for r in ranks]
    src = sources(PASS_LENGTHS)
    check_tokens(np.concatenate([p.cpu().numpy() for p in parts]), [src[i] for i in docs.tolist()],
                 kw.get("pad_token_id", 0))


def pass_batch_api() -> Api:
    def check(out, kw):
        batch = out[0] if isinstance(out, tuple) else out
        ranks, _ = kw["plan"].passes[kw["pass_index"]]
        assert batch["local_cp_size"] == len(ranks) and batch["cp_rank"] == kw["rank"] - ranks.start
        _check_group(kw, kw["pass_index"], lambda r: packkit.pack_context_parallel_pass(
            **{**kw, "rank": r, "return_info": False}))

    return Api("packkit.pack_context_parallel_pass", packkit.pack_context_parallel_pass,
               lambda: dict(sequences=sources(PASS_LENGTHS), plan=_pass_plan(), pass_index=0, rank=1), check,
               variants=[Variant("degenerate", "rank", "a rank the pass does not name", "refuse",
                                 lambda kw: {**kw, "pass_index": kw["plan"].num_passes - 1,
                                             "rank": next(r for r in range(4) if r not in kw["plan"].passes[-1][0])}),
                         Variant("stale", "sequences", "one sequence short", "refuse",
                                 lambda kw: {**kw, "sequences": kw["sequences"][:-1]})])


def iter_pass_api() -> Api:
    def check(out, kw):
        got = list(out)
        assert [i for i, _ in got] == [i for i, (r, _) in enumerate(kw["plan"].passes) if kw["rank"] in r]
        for index, batch in got:
            assert batch["cp_rank"] == kw["rank"] - kw["plan"].passes[index][0].start

    return Api("packkit.iter_context_parallel", packkit.iter_context_parallel,
               lambda: dict(sequences=sources(PASS_LENGTHS), plan=_pass_plan(), rank=2), check,
               variants=[Variant("stale", "plan", "a packing plan, not a CP plan", "refuse",
                                 lambda kw: {**kw, "plan": packkit.plan(PASS_LENGTHS, 64)})])


def register(reg: dict) -> None:
    for api in (plan_context_parallel_api(), pass_batch_api(), iter_pass_api()):
        reg[api.name] = api
