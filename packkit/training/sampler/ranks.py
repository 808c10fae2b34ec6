"""Distributed dealing: which data-parallel rank this process is, how a step's rows are dealt to ranks,
and the collective check that every rank computed the same plan."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .args import int_arg


def dist_rank_world(group) -> Optional[tuple[int, int]]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    if group is not None:
        raise ValueError("group was given but torch.distributed is not initialised")
    return None


def resolve_rank(rank, world_size, group) -> tuple[int, int]:
    """(rank, world_size): the given ones, else from ``torch.distributed`` (``group``), else 0 and 1."""
    if rank is None or world_size is None:
        from_dist = dist_rank_world(group)
        if from_dist is not None:
            rank = from_dist[0] if rank is None else rank
            world_size = from_dist[1] if world_size is None else world_size
        elif world_size is None and rank is None:
            rank, world_size = 0, 1
        elif world_size is None:
            raise ValueError(f"rank={rank!r} was given without world_size and torch.distributed is not "
                             "initialised; pass both")
        elif int_arg(world_size, "world_size") == 1:
            rank = 0
        else:
            raise ValueError(f"world_size={world_size!r} was given without rank and torch.distributed is not "
                             "initialised; pass both")
    rank, world_size = int_arg(rank, "rank"), int_arg(world_size, "world_size")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}) for world_size={world_size}, got {rank}")
    return rank, world_size


def cp_data_parallel_rank(group, cp_size: int):
    """(data-parallel rank, size) from torch.distributed with CP groups of consecutive ranks; (None, None)
    without torch.distributed."""
    from_dist = dist_rank_world(group)
    if from_dist is None:
        return None, None
    rank, world = from_dist
    if world % cp_size:
        raise ValueError(f"world size {world} is not a multiple of cp_size {cp_size}")
    return rank // cp_size, world // cp_size


def deal_rows(row_costs: np.ndarray, world_size: int, k: int) -> np.ndarray:
    """[steps, world_size, k] row positions: each step's world_size*k rows dealt k per rank, costliest
    row first to the rank with the least cost so far in the step (LPT), so ranks' sums are level."""
    steps = row_costs.shape[0]
    if k == 1:  # the planner already placed one row per rank, levelling per-rank totals over steps
        return np.broadcast_to(np.arange(world_size)[None, :, None], (steps, world_size, 1))
    out = np.empty((steps, world_size, k), dtype=np.int64)
    for s in range(steps):
        sums = np.zeros(world_size)
        filled = np.zeros(world_size, dtype=np.int64)
        for pos in np.argsort(-row_costs[s], kind="stable"):
            open_ranks = np.flatnonzero(filled < k)
            r = open_ranks[np.argmin(sums[open_ranks])]
            out[s, r, filled[r]] = pos
            filled[r] += 1
            sums[r] += row_costs[s, pos]
    return out


def verify_same_plan(rank: int, world_size: int, epoch: int, digest: str, group=None) -> None:
    """Collective: RuntimeError unless every rank of ``group`` has the same plan digest and epoch and
    the ranks cover ``range(world_size)`` once."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("verify() needs an initialised torch.distributed process group")
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (rank, world_size, epoch, digest), group=group)
    ranks = sorted(g[0] for g in gathered)
    if ranks != list(range(world_size)) or len(gathered) != world_size:
        raise RuntimeError(f"PackedBatchSampler ranks {ranks} over {len(gathered)} processes do not cover "
                           f"world_size={world_size} exactly once")
    if len({g[1:] for g in gathered}) != 1:
        raise RuntimeError("PackedBatchSampler plans differ across ranks (different lengths, config, seed or "
                           f"epoch): {gathered}")
