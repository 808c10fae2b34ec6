"""``pack_context_parallel_pass``: one rank's batch for one pass of a dynamic CP plan
(:func:`packkit.plan_context_parallel`), and ``iter_context_parallel``: all of a rank's passes in order.

A pass ``(ranks, seqs)`` is one packed row of the documents ``seqs``, every one CP-sharded over all of ``ranks``.
So a rank's batch for it is the static CP shard of that row with ``cp_size = len(ranks)`` and ``cp_rank`` the
rank's index in the group: the fused :func:`packkit.pack_context_parallel` (one ``packkit::cp_shard`` launch on
CPU / CUDA / Triton, sizes from the plan's host lengths, no host sync) does exactly that. Padding follows the
plan's token accounting: zigzag (each document to a multiple of ``2 * cp``) at ``cp > 1``, none at ``cp = 1``, so
the local length is ``plan.pass_local_tokens[pass_index]``.
"""
from __future__ import annotations

from typing import Iterator, Optional

import numpy as np
import torch

from ..packing.checks import check_int
from ..planning.context_parallel import ContextParallelPlan
from .fused import pack_context_parallel


def _pass_sources(sources, plan: ContextParallelPlan, seqs: np.ndarray, name: str) -> list:
    """The pass's documents (in ``seqs`` order) of ``sources``: the list the plan was made from, or all its
    tokens as one flat tensor / array. Lengths are checked against the plan on the host (shapes, no device read)."""
    lengths = plan.lengths
    if isinstance(sources, (torch.Tensor, np.ndarray)):
        if sources.ndim != 1 or sources.shape[0] != int(lengths.sum()):
            raise ValueError(f"{name}: a flat source must be 1-D with the plan's {int(lengths.sum())} tokens, got "
                             f"shape {tuple(sources.shape)}")
        starts = np.concatenate(([0], np.cumsum(lengths)))
        return [sources[int(starts[i]):int(starts[i + 1])] for i in seqs.tolist()]
    if not isinstance(sources, (list, tuple)):
        raise TypeError(f"{name} must be the list of sequences the plan was made from (or their tokens as one flat "
                        f"tensor), got {type(sources).__name__}")
    if len(sources) != len(lengths):
        raise ValueError(f"{name} has {len(sources)} sequences but the plan is for {len(lengths)}")
    picked = [sources[i] for i in seqs.tolist()]
    for i, s in zip(seqs.tolist(), picked):
        n = len(s) if not isinstance(s, (torch.Tensor, np.ndarray)) else (s.shape[0] if s.ndim else -1)
        if n != int(lengths[i]):
            raise ValueError(f"{name}[{i}] has {n} tokens but the plan has lengths[{i}] = {int(lengths[i])}")
    return picked


def _check_plan(plan) -> ContextParallelPlan:
    if not isinstance(plan, ContextParallelPlan):
        raise TypeError(f"plan must be a packkit.ContextParallelPlan (packkit.plan_context_parallel), got "
                        f"{type(plan).__name__}")
    return plan


def _check_rank(plan: ContextParallelPlan, rank) -> int:
    rank = check_int(rank, "rank", 0)
    if rank >= plan.world_size:
        raise ValueError(f"rank must be < the plan's world_size ({plan.world_size}), got {rank}")
    return rank


def pack_context_parallel_pass(sequences, plan: ContextParallelPlan, pass_index: int, rank: int, *, labels=None,
                               pad_token_id: int = 0, ignore_index: int = -100, mask_first_label: bool = True,
                               separator_id: Optional[int] = None, device=None, backend: str = "auto",
                               return_info: bool = False):
    """Rank ``rank``'s batch for pass ``pass_index`` of ``plan``: the pass's documents packed into one row and
    CP-sharded over the pass's group, in one ``packkit::cp_shard`` launch, no host sync.

    Args:
        sequences: what the plan was made from: a list of 1-D sequences (lists, arrays or tensors; only the
            pass's documents are read), or all tokens as one flat 1-D tensor in the plan's order.
        plan, pass_index: a :class:`packkit.ContextParallelPlan` and one of its passes (``plan.passes``).
        rank: a global rank the pass names (``rank in plan.passes[pass_index][0]``); ValueError otherwise.
        labels: like ``sequences`` (default: the ids). pad_token_id, ignore_index, mask_first_label,
            separator_id, device, backend: as :func:`packkit.pack_context_parallel`.
        return_info: also return the :class:`packkit.context_parallel.CPShardInfo` of the pass's row:
            :func:`packkit.unshard_context_parallel` of the group's outputs gives them in the row's order,
            which is the documents of ``plan.passes[pass_index][1]`` one after another.

    Returns the dict of :func:`packkit.pack_context_parallel` (``[1, local_len]`` ``input_ids``, ``labels``,
    ``shift_labels`` (next label of the same document, ``ignore_index`` at its end and on padding),
    ``position_ids`` (global: the position in the document), ``seq_idx`` (the document's segment in the row:
    its index among the pass's non-empty documents; an empty one has no segment), local ``cu_seq_lens_q`` /
    ``cu_seq_lens_k``, host-int
    ``max_length_q`` / ``max_length_k``, the global padded ``cu_seqlens_padded``) plus host ints
    ``local_cp_size`` (the group's size) and ``cp_rank`` (the rank's index in it). ``local_len`` is
    ``plan.pass_local_tokens[pass_index]``: zigzag padding at ``local_cp_size > 1``, none at 1 (then
    ``cu_seqlens_padded`` is ``cu_seq_lens_q``).
    """
    plan = _check_plan(plan)
    index = check_int(pass_index, "pass_index", 0)
    if index >= plan.num_passes:
        raise ValueError(f"pass_index must be < the plan's {plan.num_passes} passes, got {index}")
    rank = _check_rank(plan, rank)
    ranks, seqs = plan.passes[index]
    if rank not in ranks:
        raise ValueError(f"rank {rank} is not in pass {index}'s ranks {ranks.start}..{ranks.stop - 1} "
                         f"(plan.rank_passes(rank) lists its passes)")
    cp_size, cp_rank = len(ranks), rank - ranks.start
    docs = _pass_sources(sequences, plan, seqs, "sequences")
    labs = None if labels is None else _pass_sources(labels, plan, seqs, "labels")
    # At cp 1 the plan counts no padding; contiguous mode at cp 1 is the row itself.
    mode = "zigzag" if cp_size > 1 else "contiguous"
    got = pack_context_parallel(docs, cp_size, cp_rank, mode, labels=labs, pad_token_id=pad_token_id,
                                ignore_index=ignore_index, mask_first_label=mask_first_label,
                                separator_id=separator_id, device=device, backend=backend, return_info=return_info)
    out = got[0] if return_info else got
    if cp_size == 1:  # unpadded: the padded cu_seqlens are the row's, so every pass has the same keys
        out["cu_seqlens_padded"] = out["cu_seq_lens_q"]
    out["local_cp_size"], out["cp_rank"] = cp_size, cp_rank
    return got


def iter_context_parallel(sequences, plan: ContextParallelPlan, rank: int, **kwargs) -> Iterator[tuple]:
    """``(pass_index, batch)`` for every pass naming ``rank``, in the order the rank runs them (as
    ``plan.rank_passes(rank)``); ``batch`` is :func:`pack_context_parallel_pass`'s (``kwargs``: its options).
    ``plan`` and ``rank`` are checked here, not at the first ``next()``."""
    plan = _check_plan(plan)
    rank = _check_rank(plan, rank)
    start, size = plan.pass_rank_start, plan.pass_group_size
    mine = np.flatnonzero((start <= rank) & (rank < start + size)).tolist()
    return ((index, pack_context_parallel_pass(sequences, plan, index, rank, **kwargs)) for index in mine)
