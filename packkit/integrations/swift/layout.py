"""The packed-index layout ms-swift's ``PackingDataset`` reads, planned by packkit (no ms-swift import).

ms-swift's ``PackingDataset.__getitem__(i)`` returns the samples ``packed_idx[i]`` (one packed row) and its
trainer hands rows to ranks with ``BatchSamplerShard``. :func:`plan_packed_idx` makes ``packed_idx`` from one
global packkit plan laid out **step-major**: row ``s * dp_size + r`` is rank ``r``'s row at planned step ``s``.
That is the order in which ``BatchSamplerShard(shuffle=False)`` deals rows (rank ``r`` reads ``r, r + W, ...``,
``batch_size`` at a time), and the order :class:`~packkit.integrations.swift.sampler.PlannedBatchSamplerShard`
keeps when it shuffles (it permutes whole steps). So every rank's row of a step comes from the same balanced step.
"""
from __future__ import annotations

import heapq
import numbers
from typing import NamedTuple

import numpy as np

from ...planning import step_order
from ...planning.arg_rules import MAX_INT, MAX_RANKS, Bool, Choice, Int, check_args
from ...planning.planner import as_lengths, plan

ALGORITHMS = ("obfd", "ogbfd")


class PackedIndex(NamedTuple):
    """What ``PackingDataset`` stores: ``packed_idx[i]`` lists the dataset indices of row ``i``."""

    packed_idx: list  # list[list[int]], step-major: row s * dp_size + r is rank r's row at step s
    packed_length: list  # list[int]: tokens of each row
    dp_size: int
    dropped: list  # dataset indices in no row (only when fewer samples than ranks are left; see plan_packed_idx)
    balance: float  # sum over steps of the max rank cost / sum of the mean (1.0 = perfect); tokens for a callable cost


def _sample_lengths(lengths) -> np.ndarray:
    """ms-swift's ``lengths`` column: an int per sample, or a list of ints (summed, as ms-swift does)."""
    if isinstance(lengths, np.ndarray) or hasattr(lengths, "dim"):  # an array or a tensor
        return as_lengths(lengths)
    if not isinstance(lengths, (list, tuple)):
        if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
            raise TypeError(f"lengths must be a sequence of ints (or of lists of ints), got {type(lengths).__name__}")
        lengths = list(lengths)  # a datasets Column, a generator
    if not lengths:
        return np.zeros(0, np.int64)
    try:  # the common case, one int per sample, without a Python loop
        array = np.asarray(lengths)
    except ValueError:  # ragged lists of ints
        array = None
    if array is not None and array.ndim == 1 and array.dtype != object:
        return as_lengths(array)
    return as_lengths([sum(x) if isinstance(x, (list, tuple)) else x for x in lengths])


def _check_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def plan_packed_idx(lengths, packing_length: int, *, dp_size: int = 1, cost="attention",
                    algorithm: str | None = None) -> PackedIndex:
    """Plan ``packed_idx`` for ms-swift: one global plan over all samples, step-major for ``dp_size`` ranks.

    Args:
        lengths: the dataset's ``lengths`` column (ints, or lists of ints that ms-swift sums).
        packing_length: tokens per packed row (ms-swift's ``packing_length``, default its ``max_length``).
        dp_size: data-parallel ranks that ``BatchSamplerShard`` deals rows to (world size / tp size).
        cost: the per-rank step cost to balance (:func:`packkit.plan`'s ``cost``: ``"attention"``, ``(a, b)``
            e.g. from :func:`packkit.transformer_cost`, or a transformers config).
        algorithm: ``"obfd"`` (fewest rows, no balancing) or ``"ogbfd"`` (steps balanced under ``cost``);
            default ``"ogbfd"`` when ``dp_size > 1``.

    Every row holds at least one sample, so no rank ever receives an empty row: a planned step with more ranks
    than rows is refilled by moving samples out of its fuller rows, then out of other steps' rows that hold
    several; only when every row holds one sample does a step short of samples place them into rows with room,
    and a sample that fits nowhere is ``dropped`` (fewer than ``dp_size`` of them; ms-swift's own sampler drops
    the ``len % world_size`` trailing rows in the same situation). A sample longer than
    ``packing_length`` is refused (ValueError): ms-swift truncates or drops those at encoding when
    ``packing_length`` >= ``max_length``.
    """
    packing_length, dp_size = check_args(Int("packing_length", 1, MAX_INT), Int("dp_size", 1, MAX_RANKS),
                                         values=(packing_length, dp_size))
    if algorithm is None:
        algorithm = "ogbfd" if dp_size > 1 else "obfd"
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    array = _sample_lengths(lengths)
    if (array < 0).any():
        i = int(np.flatnonzero(array < 0)[0])
        raise ValueError(f"lengths must be >= 0; sample {i} has {int(array[i])}")
    over = np.flatnonzero(array > packing_length)
    if len(over):
        i = int(over[0])
        raise ValueError(f"{len(over)} samples are longer than packing_length={packing_length} (first: sample {i}, "
                         f"{int(array[i])} tokens); set packing_length >= max_length so ms-swift's encoding bounds "
                         "them")
    # Zero-length samples occupy no tokens; ms-swift keeps them, so they ride in the shortest rows below.
    p = plan(array, packing_length, algorithm=algorithm, dp_size=dp_size, cost=cost)
    seq, offsets = p.segments.seq_index.tolist(), p.segments.bin_offsets.tolist()
    rows = [seq[offsets[k]:offsets[k + 1]] for k in range(p.num_bins)]
    a, b = p.cost_ab if p.cost_ab is not None else (1.0, 0.0)
    dropped = _fill_empty_rows(rows, array, packing_length, dp_size, a, b)
    for i in p.zero_length.tolist():  # no tokens: each rides in the row with the fewest samples (ms-swift keeps them)
        if rows:
            min(rows, key=len).append(i)
        else:
            dropped.append(i)
    rows = _source_ordered(rows, array, dp_size)
    loads, rank_costs = _row_costs(rows, array, a, b)
    rank_costs = rank_costs.reshape(-1, dp_size)
    mean = rank_costs.mean(axis=1).sum()
    balance = float(rank_costs.max(axis=1).sum() / mean) if len(rank_costs) and mean > 0 else 1.0
    return PackedIndex(rows, loads.tolist(), dp_size, sorted(dropped), balance)


def _source_ordered(rows: list, lengths: np.ndarray, dp_size: int) -> list:
    """The steps (``dp_size`` rows each) in the dataset order of their longest sample, not the planner's order
    (longest samples first): what ``BatchSamplerShard(shuffle=False)`` then deals. A shuffling sampler permutes
    them anyway."""
    steps = [rows[s:s + dp_size] for s in range(0, len(rows), dp_size)]
    keys = step_order.bins_keys(rows, lengths.__getitem__, int, dp_size)
    return [row for k in step_order.order_steps(len(steps), shuffle=False, keys=keys).tolist() for row in steps[k]]


def _row_costs(rows: list, lengths: np.ndarray, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """Tokens (int64) and ``a * tokens + b * sum(l**2)`` (float64) of every row, vectorised."""
    counts = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=int(counts.sum()))
    x = lengths[flat]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])) if len(rows) else np.zeros(0, np.int64)
    tokens = np.add.reduceat(x, starts) if len(flat) else np.zeros(len(rows), np.int64)
    squares = np.add.reduceat(x.astype(np.float64) ** 2, starts) if len(flat) else np.zeros(len(rows))
    tokens[counts == 0], squares[counts == 0] = 0, 0.0  # reduceat gives the next value for an empty slice
    return tokens, a * tokens + b * squares


def _fill_empty_rows(rows: list, lengths: np.ndarray, capacity: int, dp_size: int, a: float, b: float) -> list:
    """Make every row non-empty in place (see :func:`plan_packed_idx`); return the dropped sample indices."""
    def cost(row):
        x = lengths[row].astype(np.float64)
        return a * x.sum() + b * (x ** 2).sum()

    dropped = []
    for s in range(len(rows) // dp_size):
        step = rows[s * dp_size:(s + 1) * dp_size]
        while any(not r for r in step) and any(len(r) > 1 for r in step):
            donor = max((r for r in step if len(r) > 1), key=cost)
            item = max(donor, key=lambda i: lengths[i])  # moving the longest item evens the costs most
            donor.remove(item)
            next(r for r in step if not r).append(item)
    # Empty rows left: take the smallest sample of a row of another step that has several (it fits: the row is
    # empty), smallest first, so the costs move least.
    empties = [k for k, r in enumerate(rows) if not r]
    if empties:
        smallest = lengths.__getitem__
        heap = [(int(lengths[m]), k, m) for k, r in enumerate(rows) if len(r) > 1 for m in (min(r, key=smallest),)]
        heapq.heapify(heap)
        for e in empties:
            if not heap:
                break
            _, k, m = heapq.heappop(heap)
            rows[k].remove(m)
            rows[e].append(m)
            if len(rows[k]) > 1:
                m = min(rows[k], key=smallest)
                heapq.heappush(heap, (int(lengths[m]), k, m))
    # Steps that still have an empty row (every row holds one sample): place their samples in rows with room.
    short = [s for s in range(len(rows) // dp_size) if any(not r for r in rows[s * dp_size:(s + 1) * dp_size])]
    orphans = [i for s in short for r in rows[s * dp_size:(s + 1) * dp_size] for i in r]
    for s in reversed(short):
        del rows[s * dp_size:(s + 1) * dp_size]
    loads = _row_costs(rows, lengths, 1.0, 0.0)[0] if orphans else np.zeros(0, np.int64)
    for i in sorted(orphans, key=lambda i: -int(lengths[i])):
        room = capacity - loads - int(lengths[i])
        fits = np.flatnonzero(room >= 0)
        if not len(fits):
            dropped.append(i)
            continue
        k = int(fits[np.argmin(room[fits])])  # best fit
        rows[k].append(i)
        loads[k] += int(lengths[i])
    return dropped


def plan_buffer(data: list, packing_length: int, finished: bool, *, dp_size: int, batch_size: int, cost,
                algorithm: str, shuffle: bool = True, seed=0) -> tuple[list, list]:
    """Plan a buffer of ``(sample, length)`` pairs into rows; return (rows to yield, pairs carried over).

    Rows are yielded a group of ``batch_size`` planned steps at a time, ordered rank 0's ``batch_size`` rows, then
    rank 1's, ... (the order ``DataLoaderDispatcher`` scatters). Unless ``finished``, the rows of an incomplete
    group and the emptiest row of the buffer are carried over, so later samples can fill them. The steps yielded
    are in a random order from ``numpy.random.default_rng(seed)`` (``seed``: an int or a tuple of ints), or with
    ``shuffle=False`` in the buffer order of each step's longest sample; never the planner's (longest first). A
    step with an empty row (only in a ``finished`` buffer) stays last.
    """
    packing_length, finished, dp_size, batch_size, algorithm, shuffle = check_args(
        Int("packing_length", 1, MAX_INT), Bool("finished"), Int("dp_size", 1, MAX_RANKS),
        Int("batch_size", 1, MAX_RANKS), Choice("algorithm", ALGORITHMS), Bool("shuffle"),
        values=(packing_length, finished, dp_size, batch_size, algorithm, shuffle))
    if dp_size * batch_size > MAX_RANKS:
        raise ValueError(f"dp_size * batch_size = {dp_size} * {batch_size} rows per group; at most {MAX_RANKS}")
    if not isinstance(data, (list, tuple)):
        raise TypeError(f"data must be a list of (sample, length) pairs, got {type(data).__name__}")
    if not data:
        return [], []
    try:
        lengths = [length for _, length in data]
    except (TypeError, ValueError):
        raise TypeError("data must be a list of (sample, length) pairs") from None
    too_long = [i for i, x in enumerate(lengths) if x > packing_length]
    if too_long:
        raise ValueError(f"a sample of {lengths[too_long[0]]} tokens is longer than packing_length={packing_length}")
    p = plan(lengths, packing_length, algorithm=algorithm, dp_size=dp_size, cost=cost)
    bins = [b.tolist() for b in p.bins]
    group = dp_size * batch_size
    whole = len(bins) // group * group
    if finished:
        whole = len(bins)
    elif whole == len(bins) and whole:  # keep at least the emptiest row open for the next buffer
        whole -= group
    steps = [bins[s:s + dp_size] for s in range(0, whole, dp_size)]  # the carry stays the planner's last rows
    full = [st for st in steps if all(st)]
    keys = None if shuffle else step_order.bins_keys([b for st in full for b in st], lengths.__getitem__, int, dp_size)
    order = step_order.order_steps(len(full), shuffle=shuffle, rng=np.random.default_rng(seed), keys=keys)
    bins[:whole] = [b for k in order.tolist() for b in full[k]] + [b for st in steps if not all(st) for b in st]
    rows = [[data[i] for i in b] for b in bins]
    out = []
    for g in range(0, whole, group):
        steps = rows[g:g + group]  # planned steps g/dp_size ..., each dp_size rows
        per_rank = min(batch_size, -(-len(steps) // dp_size))  # the rows there are, not batch_size's loop
        out += [steps[j * dp_size + r] for r in range(dp_size) for j in range(per_rank)
                if j * dp_size + r < len(steps)]
    out = [row for row in out if row]
    carry = [item for row in rows[whole:] for item in row]
    return out, carry
