"""Rows planned once, collated as they are: ``PackingCollator(planned_rows=True)``'s input.

Each feature is one row some planner already made (``packkit.plan``, ``PackedBatchSampler``, ``pack_dataset``), in
one of two forms: a list of the row's sample features (``[ds[i] for i in row]``), or a pre-packed row, a dict whose
per-token lists are the row's documents one after another with their lengths in ``seq_lengths``
(``packkit.pack_dataset`` / ``trl.pack_dataset``). Re-planning such rows per batch (issue 42: 8 rows of 2,048
re-planned by obfd into 9-10) undoes the plan; here each feature becomes exactly one row.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..planning.planner import Plan

# Keys of a pre-packed row that are not cut at seq_lengths: the lengths themselves, and position ids, which the
# collator writes afresh (restarting in every document, as the ones pack_dataset stores do).
ROW_ONLY_KEYS = ("seq_lengths", "position_ids")


def split_planned_rows(features, input_key: str) -> tuple[list, list[list[int]]]:
    """(the rows' sample features one after another, each row's positions in that list)."""
    if not isinstance(features, (list, tuple)):
        raise TypeError(f"PackingCollator expects a list of features, got {type(features).__name__}")
    samples, rows = [], []
    for i, row in enumerate(features):
        start = len(samples)
        if isinstance(row, (list, tuple)):
            samples.extend(row)
        elif isinstance(row, Mapping) and "seq_lengths" in row:
            samples.extend(_cut_packed_row(row, i))
        else:
            raise TypeError(f"planned_rows=True takes one planned row per feature: a list of the row's sample "
                            f"features, or a pre-packed row (a dict with 'seq_lengths', as pack_dataset writes); "
                            f"feature {i} is a {type(row).__name__}"
                            + (f" without 'seq_lengths' (keys: {sorted(row)})" if isinstance(row, Mapping) else "")
                            + (f" (with remove_unused_columns=True the Trainer drops 'seq_lengths')"
                               if isinstance(row, Mapping) and input_key in row else ""))
        rows.append(list(range(start, len(samples))))
    return samples, rows


def _cut_packed_row(row: Mapping, i: int) -> list[dict]:
    lengths = np.asarray(row["seq_lengths"]).reshape(-1)
    if lengths.dtype.kind not in "iu" or (lengths < 0).any():
        raise ValueError(f"feature {i}: seq_lengths must be non-negative integers, got {row['seq_lengths']!r}")
    cuts = np.cumsum(lengths.astype(np.int64))
    total = int(cuts[-1]) if len(cuts) else 0
    keys = [k for k in row if k not in ROW_ONLY_KEYS]
    values = {}
    for k in keys:
        if row[k] is None:
            continue
        array = np.asarray(row[k])
        if array.ndim != 1 or len(array) != total:
            raise ValueError(f"feature {i}: {k!r} has {len(array) if array.ndim else 0} values but its seq_lengths "
                             f"sum to {total}; every per-token key of a pre-packed row must")
        values[k] = np.split(array, cuts[:-1]) if len(cuts) else []
    return [{k: parts[j] for k, parts in values.items()} for j in range(len(lengths)) if lengths[j] > 0]


def planned_row_plan(lengths, rows: list[list[int]], capacity) -> Plan:
    """The plan that puts row ``i``'s samples in row ``i``: refuses a row over ``capacity`` by number (a planned
    row is emitted whole or not at all)."""
    lengths = np.asarray(lengths, np.int64)
    tokens = [int(lengths[row].sum()) for row in rows]
    if capacity is not None:
        over = [i for i, t in enumerate(tokens) if t > capacity]
        if over:
            raise ValueError(f"planned row {over[0]} holds {tokens[over[0]]} tokens, more than capacity={capacity}; "
                             "planned_rows=True emits rows as they are (plan them with this capacity)")
    return Plan.from_bins(lengths, rows, capacity or max(tokens, default=1) or 1)
