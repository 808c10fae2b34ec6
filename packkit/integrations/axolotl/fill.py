"""Filling the last step's empty rows, so a round-robin dealer hands every rank a non-empty row at every step.

The planner lays out whole steps of ``dp_size`` rows and leaves the rows of its last step it could not fill
empty. axolotl's collator cannot build a row from no samples, and accelerate (``drop_last=True``, as axolotl
sets it) would drop an incomplete step with every sample in it. A row holding two or more samples can give
some of them away and both rows still fit (a subset of a fitting row fits, and holds no more samples), so an
empty row is filled by splitting the costliest such row of the last step in two (largest first, each to the
lighter half); failing that, by the cheapest sample of the row holding the most samples in an earlier step.
Only when every row holds one sample is the last step dropped (the caller reports its samples).
"""
from __future__ import annotations

import numpy as np


def _split(row: list, lengths: np.ndarray, item_cost) -> tuple[list, list]:
    """Two non-empty halves of ``row`` (>= 2 samples), costs levelled greedily; each keeps the row's order."""
    costs = item_cost(lengths[np.asarray(row, dtype=np.int64)])
    sums, side = [0.0, 0.0], np.zeros(len(row), dtype=np.int64)
    for i in np.argsort(-costs, kind="stable"):
        s = 0 if sums[0] <= sums[1] else 1
        side[i] = s
        sums[s] += float(costs[i])
    keep = [p for p, s in zip(row, side) if s == 0]
    give = [p for p, s in zip(row, side) if s == 1]
    return keep, give


def fill_last_step(steps: list, lengths: np.ndarray, item_cost) -> tuple[list, list]:
    """``(steps, dropped)``: ``steps[s][r][j]`` is rank ``r``'s ``j``-th row (a list of positions into
    ``lengths``) at step ``s``; the returned steps have no empty row in the last step, or the last step is
    removed and its positions returned in ``dropped``. The input is not modified."""
    if not steps:
        return steps, []
    last = [[list(row) for row in item] for item in steps[-1]]
    empties = [(r, j) for r, item in enumerate(last) for j, row in enumerate(item) if not row]
    if not empties:
        return steps, []
    out = list(steps[:-1])
    cost = lambda row: float(item_cost(lengths[np.asarray(row, dtype=np.int64)]).sum())  # noqa: E731
    for r, j in empties:
        donors = [(cost(row), rr, jj) for rr, item in enumerate(last) for jj, row in enumerate(item) if len(row) >= 2]
        if donors:
            _, rr, jj = max(donors)
            last[rr][jj], last[r][j] = _split(last[rr][jj], lengths, item_cost)
            continue
        best = None  # (samples, step, rank, row) of the fullest earlier row, the latest step on ties
        for s in range(len(out) - 1, -1, -1):
            for rr, item in enumerate(out[s]):
                for jj, row in enumerate(item):
                    if len(row) >= 2 and (best is None or len(row) > best[0]):
                        best = (len(row), s, rr, jj)
        if best is None:  # every row holds one sample: nothing can be split
            dropped = [p for item in last for row in item for p in row]
            return out, dropped
        _, s, rr, jj = best
        row = list(out[s][rr][jj])
        cheapest = int(np.argmin(item_cost(lengths[np.asarray(row, dtype=np.int64)])))
        moved = row.pop(cheapest)
        out[s] = [[list(x) for x in item] for item in out[s]]
        out[s][rr][jj] = row
        last[r][j] = [moved]
    return out + [last], []


def split_in_order(rows: list, multiple: int) -> tuple[list, list]:
    """``(rows, dropped)`` for order-keeping (sequential) packing: rows split in two, the latest row holding two
    or more samples first (its first half stays, the rest becomes the next row), until the number of rows is a
    multiple of ``multiple``; the concatenated order never changes. If no row can be split, the trailing rows
    beyond the last whole multiple are removed and their positions returned."""
    rows = [list(r) for r in rows]
    while len(rows) % multiple:
        at = next((i for i in range(len(rows) - 1, -1, -1) if len(rows[i]) >= 2), None)
        if at is None:
            keep = len(rows) - len(rows) % multiple
            return rows[:keep], [p for r in rows[keep:] for p in r]
        half = len(rows[at]) // 2
        rows[at:at + 1] = [rows[at][:half], rows[at][half:]]
    return rows, []
