"""Registration of the Megatron hybrid-CP drop-in (``packkit.integrations.megatron.PackkitCPScheduler``): its
constructor (Megatron's two arguments and packkit's cost flags) and ``get_groups_and_subsamples``, checked as
Megatron's consumers read the output (one group, every rank busy, every id once on one aligned block of a size
Megatron has a group for, within the cap)."""
from __future__ import annotations

from .core import Api, Variant

SAMPLES = [(10, 30000), (11, 2000), (12, 1500), (13, 9000), (14, 700), (15, 12000)]
WORLD, CAP = 8, 8192


class Group:  # what the scheduler reads of Megatron's dp_cp_group
    def __init__(self, n: int = WORLD):
        self.n = n

    def size(self):
        return self.n


def _check_ids(out, samples, world, cap):
    groups, ids = out
    lengths = dict(samples)
    if not samples:
        assert (groups, ids) == ([], [])
        return
    assert len(ids) == 1 and len(ids[0]) == world and all(ids[0]), "one group, every rank busy"
    assert groups[0] == [[lengths[i] for i in rank] for rank in ids[0]]
    where: dict = {}
    for rank, rank_ids in enumerate(ids[0]):
        assert len(set(rank_ids)) == len(rank_ids)
        for i in rank_ids:
            where.setdefault(i, []).append(rank)
    assert sorted(where) == sorted(lengths), "every sample once"
    for i, ranks in where.items():
        c = len(ranks)
        assert ranks == list(range(ranks[0], ranks[0] + c)) and (c == world or (ranks[0] % c == 0 and c & (c - 1) == 0))
        assert (lengths[i] if c == 1 else 2 * -(-lengths[i] // (2 * c))) <= cap


def scheduler_api() -> Api:
    from packkit.integrations import megatron

    def check(sched, kw):
        world = kw["dp_cp_group"].size()
        _check_ids(sched.get_groups_and_subsamples(SAMPLES, None), SAMPLES, world, kw["max_seq_len_per_rank"])

    return Api("packkit.integrations.megatron.PackkitCPScheduler", megatron.PackkitCPScheduler,
               lambda: dict(max_seq_len_per_rank=CAP, dp_cp_group=Group()), check, variants=[
                   Variant("degenerate", "dp_cp_group", "6 ranks (Megatron's groups: 2 and 6)", "accept",
                           lambda kw: {**kw, "dp_cp_group": Group(6)}),
                   Variant("degenerate", "dp_cp_group", "one rank", "accept",
                           lambda kw: {**kw, "dp_cp_group": Group(1), "max_seq_len_per_rank": 32768})])


def groups_api() -> Api:
    from packkit.integrations import megatron

    def call(sample_id_seqlens, config=None):
        return megatron.PackkitCPScheduler(CAP, Group()).get_groups_and_subsamples(sample_id_seqlens, config)

    return Api("packkit.integrations.megatron.PackkitCPScheduler.get_groups_and_subsamples",
               megatron.PackkitCPScheduler.get_groups_and_subsamples,
               lambda: dict(sample_id_seqlens=list(SAMPLES)),
               lambda out, kw: _check_ids(out, kw["sample_id_seqlens"], WORLD, CAP), call=call, skip=("config",),
               variants=[
                   Variant("degenerate", "sample_id_seqlens", "empty", "accept",
                           lambda kw: {**kw, "sample_id_seqlens": []}),
                   Variant("degenerate", "sample_id_seqlens", "fewer samples than ranks", "accept",
                           lambda kw: {**kw, "sample_id_seqlens": [(0, 100), (1, 5000)]}),
                   Variant("degenerate", "sample_id_seqlens", "a sample no group holds", "refuse",
                           lambda kw: {**kw, "sample_id_seqlens": [(0, WORLD * CAP * 2)]}),
                   Variant("stale", "sample_id_seqlens", "an id twice", "refuse",
                           lambda kw: {**kw, "sample_id_seqlens": [(0, 100), (0, 200)]})])


def register(reg: dict) -> None:
    try:
        apis = (scheduler_api(), groups_api())
    except ImportError:  # pragma: no cover - packkit.integrations.megatron needs torch only; kept for symmetry
        return
    for api in apis:
        reg[api.name] = api
