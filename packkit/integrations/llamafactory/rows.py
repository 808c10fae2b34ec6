"""The rows of a LLaMA-Factory packed dataset: which examples share a row (one global packkit plan, ordered for
the ranks) and the row itself, built field for field as LLaMA-Factory 0.9.5's ``PackedSupervisedDatasetProcessor``
builds it. No LLaMA-Factory or ``datasets`` import: usable and tested without them."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ...planning.arg_rules import MAX_INT, MAX_RANKS, Int, check_args, check_rows_per_step
from ...planning.planner import _cost_model, as_lengths
from ...training.sampler.args import int_arg
from ...training.sampler.epoch import plan_epoch

LOG = logging.getLogger(__name__)
IGNORE_INDEX = -100  # llamafactory.extras.constants.IGNORE_INDEX
MAX_SUB_SEQ_IDX = 2**32  # llamafactory.data.processor.supervised.MAX_SU_SEQ_IDX: "no multimodal item" marker


@dataclass(frozen=True)
class RowPlan:
    """The packed dataset's rows in dataset order, and what the plan did.

    ``rows[i]``: int64 array of the source indices of packed row ``i`` (in row order). With ``dp_size`` ranks and
    ``rows_per_rank`` rows per device batch, row ``(s * dp_size + r) * rows_per_rank + j`` is rank ``r``'s
    ``j``-th row of step ``s``: the order in which a sequential sampler, a ``BatchSampler(rows_per_rank)`` and
    accelerate's round-robin ``BatchSamplerShard`` hand it to that rank. Empty rows (only the last step has
    any) are left out, so that step alone may be dealt otherwise. ``rank_costs[s, r]``: rank ``r``'s planned
    cost at step ``s`` (the sum of its rows).
    """

    rows: list
    dp_size: int
    rows_per_rank: int
    dropped: np.ndarray  # source indices longer than cutoff_len (LLaMA-Factory drops them too)
    zero_length: np.ndarray  # source indices with no tokens: nothing to train on, in no row
    rank_costs: np.ndarray
    efficiency: float

    @property
    def balance(self) -> float:
        """Sum over steps of the costliest rank / sum over steps of the mean rank (1.0 without steps)."""
        mean = float(self.rank_costs.mean(axis=1).sum()) if self.rank_costs.size else 0.0
        return float(self.rank_costs.max(axis=1).sum()) / mean if mean > 0 else 1.0


def plan_rows(lengths, cutoff_len: int, *, dp_size: int = 1, rows_per_rank: int = 1, cost="attention",
              seed: int = 0, shuffle: bool = True) -> RowPlan:
    """Plan all ``lengths`` at once into rows of at most ``cutoff_len`` tokens (LLaMA-Factory's knapsack
    capacity), ``dp_size * rows_per_rank`` rows per step balanced under ``cost`` (``ogbfd``; anything
    :func:`packkit.plan` takes), steps in a ``seed``-ed random order when ``shuffle``.

    Examples longer than ``cutoff_len`` are dropped and reported (LLaMA-Factory's rule), as are empty ones.
    """
    array = as_lengths(lengths)
    cutoff_len, dp_size, rows_per_rank = check_args(Int("cutoff_len", 1, MAX_INT), Int("dp_size", 1, MAX_RANKS),
                                                    Int("rows_per_rank", 1, MAX_RANKS),
                                                    values=(cutoff_len, dp_size, rows_per_rank))
    check_rows_per_step(dp_size * rows_per_rank, len(array), f"dp_size * rows_per_rank = {dp_size} * {rows_per_rank}")
    seed = check_args(Int("seed", 0, MAX_INT), values=(seed,))[0]  # numpy's generators take seeds >= 0
    if not isinstance(shuffle, bool):
        raise TypeError(f"shuffle must be a bool, got {type(shuffle).__name__} {shuffle!r}")
    _cost_model(cost)  # a bad cost is refused here, by name, before any planning
    ep = plan_epoch(array, cutoff_len, epoch=0, seed=seed, shuffle=shuffle, drop_last=False, algorithm="ogbfd",
                    cost=cost, overlong="drop", world_size=dp_size, rows_per_step=rows_per_rank)
    rows = _rows_in_rank_order(ep)
    dropped = np.sort(ep.permutation[ep.plan.dropped])
    zero = np.sort(ep.permutation[ep.plan.zero_length])
    if len(dropped):
        LOG.warning("packkit: dropped %d examples longer than cutoff_len=%d (first: index %d, %d tokens)",
                    len(dropped), cutoff_len, dropped[0], array[dropped[0]])
    if len(zero):
        LOG.warning("packkit: %d examples have no tokens and are in no row (first: index %d)", len(zero), zero[0])
    kept = int(array.sum() - array[dropped].sum())
    efficiency = kept / (len(rows) * cutoff_len) if rows else 1.0
    return RowPlan(rows, dp_size, rows_per_rank, dropped, zero, np.asarray(ep.rank_costs), efficiency)


def _rows_in_rank_order(ep) -> list:
    """The plan's non-empty rows as arrays of dataset indices, yielded step by yielded step, rank 0..W-1, each
    rank's rows in turn (``EpochPlan.row``'s order), gathered at once from the plan's CSR segments."""
    plan = ep.plan
    steps = np.asarray(ep.step_order, dtype=np.int64)
    bins = (steps[:, None, None] * plan.dp_size + ep.rank_rows[steps]).reshape(-1)
    offsets = plan.segments.bin_offsets
    starts, counts = offsets[bins], offsets[bins + 1] - offsets[bins]
    total = int(counts.sum())
    first = np.cumsum(counts) - counts  # where each row starts in the flat gather
    positions = np.repeat(starts - first, counts) + np.arange(total, dtype=np.int64)
    flat = ep.permutation[plan.segments.seq_index[positions]]
    ends = (first + counts).tolist()
    return [flat[a:b] for a, b in zip(first.tolist(), ends) if b > a]  # views; np.split is ~30x slower here


def build_rows(examples: dict, rows: list, *, cutoff_len: int, neat_packing: bool, pad_token_id: int) -> dict:
    """The columns of packed rows, as ``PackedSupervisedDatasetProcessor.preprocess_dataset`` writes them.

    ``examples``: columns of the unpacked examples (``SupervisedDatasetProcessor``'s output: ``input_ids``,
    ``labels``, ``images``, ``videos``, ``audios``); ``rows``: lists of positions in those columns. Every
    row is padded to ``cutoff_len + 1`` tokens, LLaMA-Factory's row length.
    """
    out = {k: [] for k in ("input_ids", "attention_mask", "position_ids", "labels", "images", "videos", "audios")}
    if neat_packing:
        out["packing_params"] = []
    media = ("images", "videos", "audios")
    for row in rows:
        ids, mask, pos, labels = [], [], [], []
        items = {m: [] for m in media}
        boundaries, subseq = [0], {m: [] for m in media}
        for i, index in enumerate(row):
            seq = examples["input_ids"][index]
            if len(examples["labels"][index]) != len(seq):
                raise ValueError(f"example {index}: labels ({len(examples['labels'][index])}) and input_ids "
                                 f"({len(seq)}) differ in length")
            ids += seq
            pos += range(len(seq))
            labels += examples["labels"][index]
            mask += [i + 1 if neat_packing else 1] * len(seq)
            boundaries.append(boundaries[-1] + len(seq))
            for m in media:
                found = examples[m][index] or []
                items[m] += found
                subseq[m] += [i] * len(found)
        if len(ids) > cutoff_len:
            raise ValueError(f"a planned row holds {len(ids)} tokens, more than cutoff_len={cutoff_len}")
        pad = cutoff_len + 1 - len(ids)  # LLaMA-Factory pads every row to cutoff_len + 1 ("avoid flash_attn
        ids += [pad_token_id] * pad      # drops attn mask"); pads are attended only without neat_packing
        pos += [0] * pad
        labels += [IGNORE_INDEX] * pad
        mask += [0 if neat_packing else 1] * pad
        boundaries.append(boundaries[-1] + pad)
        out["input_ids"].append(ids)
        out["attention_mask"].append(mask)
        out["position_ids"].append(pos)
        out["labels"].append(labels)
        for m in media:
            out[m].append(items[m] or None)
        if neat_packing:
            out["packing_params"].append({
                "sequence_boundaries": boundaries, "image_subseq_ids": subseq["images"] or [MAX_SUB_SEQ_IDX],
                "video_subseq_ids": subseq["videos"] or [MAX_SUB_SEQ_IDX],
                "audio_subseq_ids": subseq["audios"] or [MAX_SUB_SEQ_IDX], "right_padding_length": pad})
    return out
