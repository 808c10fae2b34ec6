"""Plan bins as rows of positions, and per-item costs: the vectorised pieces of the axolotl sampler's epoch."""
from __future__ import annotations

import numpy as np

from ...planning.arg_rules import callback_costs
from ...planning.planner import _cost_model


def rows_of(plan, bins: np.ndarray, permutation) -> list[list[int]]:
    """The positions in each of ``plan``'s ``bins`` (an int array of bin ids), mapped through ``permutation``."""
    offsets = plan.segments.bin_offsets
    counts = offsets[1:][bins] - offsets[:-1][bins]
    ends = np.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    gather = np.arange(total, dtype=np.int64) + np.repeat(offsets[:-1][bins] - (ends - counts), counts)
    seq = plan.segments.seq_index[gather]
    as_list = (seq if permutation is None else permutation[seq]).tolist()
    return [as_list[e - c:e] for c, e in zip(counts.tolist(), ends.tolist())]


def item_cost_fn(cost):
    """Per-item cost of an int64 length array under ``cost`` (as :func:`packkit.plan` reads it)."""
    a, b, fn = _cost_model(cost)
    if fn is not None:
        return lambda lengths: callback_costs(fn(lengths), len(lengths), "the cost callable")
    return lambda lengths: a * lengths.astype(np.float64) + b * lengths.astype(np.float64) ** 2
