"""PackkitCPScheduler's output on many worlds (powers of two and not), checked against the groups megatron-core
0.16.1 builds (``parallel_state.create_hybrid_dp_cp_groups``, its communicators stubbed to their rank lists): one
group, every rank busy, every id once, each CP set exactly Megatron's group of that size holding its first rank (or
all ranks), within the cap, and the lists free of deadlock."""
from __future__ import annotations

import numpy as np
import pytest

from packkit.integrations.megatron_cp import PackkitCPScheduler, megatron_max_cp, schedule_passes

pytestmark = pytest.mark.full

parallel_state = pytest.importorskip("megatron.core.parallel_state")


class Group:
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


def local(length, c):
    return length if c == 1 else 2 * -(-length // (2 * c))


@pytest.mark.parametrize("world", [1, 2, 4, 6, 8, 10, 12, 16, 24, 32])
def test_layout_is_megatrons_groups(monkeypatch, world):
    monkeypatch.setattr(parallel_state, "create_group", lambda ranks, **_: tuple(ranks))
    hybrid = {r: parallel_state.create_hybrid_dp_cp_groups(r, list(range(world)), None) for r in range(world)}
    rng = np.random.default_rng(world)
    for _ in range(30):
        cap = int(rng.choice([1024, 4096, 8192]))
        pairs = [(3 * i + 1, int(x)) for i, x in enumerate(rng.integers(1, cap * min(world, 4) + 1,
                                                                         int(rng.integers(1, 40))))]
        if any(local(n, world) > cap for _, n in pairs):
            with pytest.raises(ValueError, match="sample_id_seqlens: sample"):
                PackkitCPScheduler(cap, Group(world)).get_groups_and_subsamples(pairs)
            continue
        groups, ids = PackkitCPScheduler(cap, Group(world)).get_groups_and_subsamples(pairs)
        assert len(ids) == 1 and all(ids[0]), "one group, every rank at least one sample"
        lengths, where = dict(pairs), {}
        assert groups[0] == [[lengths[i] for i in rank] for rank in ids[0]]
        for rank, rank_ids in enumerate(ids[0]):
            for i in rank_ids:
                where.setdefault(i, []).append(rank)
        assert sorted(where) == sorted(lengths) and all(len(set(r)) == len(r) for r in where.values())
        for i, ranks in where.items():
            c = len(ranks)
            assert local(lengths[i], c) <= cap
            if c > 1:
                assert tuple(ranks) == (tuple(range(world)) if c == world else hybrid[ranks[0]].get(c)), (c, ranks)
                assert c == world or c <= megatron_max_cp(world)
        schedule_passes(ids[0])  # raises on a deadlock


def test_megatron_max_cp():
    assert [megatron_max_cp(n) for n in (1, 2, 3, 6, 8, 10, 12, 24, 40)] == [1, 2, 1, 2, 8, 2, 4, 8, 8]
    with pytest.raises(ValueError, match="world_size"):
        megatron_max_cp(0)
