"""Cross-step local search for rollout micro-batches: lower ``sum over steps of the costliest rank``.

The reference (numpy) version of the search ``micro_batches`` runs in C++ (``csrc/planner/step_search.cpp``);
nothing in packkit calls it. ``tests/test_rl_search.py`` checks that the C++ result is a local optimum of it.

The C++ layout deals micro-batches into steps and balances inside each step; what it cannot fix is a step whose
costliest micro-batch holds an item no partner in the same step can offset. Here an item of a step's costliest
micro-batch moves (or swaps with a cheaper item) into a micro-batch of *another* step, when that micro-batch has
room under its step's maximum and under ``max_tokens``: the first step's maximum falls, the other step's stays.
Each accepted change strictly lowers the objective; the token cap holds by construction; deterministic.
"""
from __future__ import annotations

import numpy as np


def refine_across_steps(indices, lengths: np.ndarray, costs: np.ndarray, max_tokens: int, *, swaps_only: bool,
                        rounds: int = 400) -> bool:
    """Improve ``indices[rank][step]`` in place; returns whether anything changed. ``swaps_only`` keeps every
    rank's sequence count (verl's equal-count dispatch)."""
    dp = len(indices)
    k = len(indices[0]) if dp else 0
    if dp < 2 or k < 2:
        return False
    n = len(lengths)
    where = np.full(n, -1, np.int64)  # micro-batch (step * dp + rank) of each item
    for r in range(dp):
        for s in range(k):
            where[np.asarray(indices[r][s], np.int64)] = s * dp + r
    placed = where >= 0
    load = np.bincount(where[placed], weights=costs[placed], minlength=k * dp).reshape(k, dp)
    tok = np.bincount(where[placed], weights=lengths[placed].astype(np.float64), minlength=k * dp).reshape(k, dp)
    changed = False
    eps = 1e-12 * max(float(load.sum()), 1.0)
    for _ in range(rounds):
        top = np.sort(load, axis=1)
        step_max, second = top[:, -1], top[:, -2]
        slack = (step_max[:, None] - load).reshape(-1)  # room under each step's maximum
        room = max_tokens - tok.reshape(-1)
        best = None
        for s in np.argsort(second - step_max, kind="stable"):  # steps whose maximum stands out most first
            hi = int(np.argmax(load[s]))
            if step_max[s] - second[s] <= eps:
                continue
            src = s * dp + hi
            mine = np.flatnonzero(where == src)
            if not len(mine):
                continue
            other = np.arange(k * dp)
            other = other[other // dp != s]
            if not swaps_only:  # move item i to micro-batch m: gain = drop of step s's max - rise of m's step max
                c = costs[mine][:, None]
                gain = step_max[s] - np.maximum(load[s, hi] - c, second[s])
                loss = np.maximum(0.0, c - slack[other][None, :])
                net = np.where(lengths[mine][:, None] <= room[other][None, :], gain - loss, -np.inf)
                j = int(np.argmax(net))
                if net.flat[j] > eps:
                    i, m = divmod(j, len(other))
                    best = (float(net.flat[j]), "move", int(mine[i]), int(other[m]), -1)
            cand = np.flatnonzero((where >= 0) & (where // dp != s))
            if len(cand):  # swap item i (in src) with item j (elsewhere, cheaper)
                d = costs[mine][:, None] - costs[cand][None, :]  # what src sheds
                dl = lengths[mine][:, None] - lengths[cand][None, :]
                dst = where[cand][None, :]
                gain = step_max[s] - np.maximum(load[s, hi] - d, second[s])
                loss = np.maximum(0.0, d - slack[dst])
                ok = (d > 0) & (dl <= room[dst]) & (-dl <= room[src])
                net = np.where(ok, gain - loss, -np.inf)
                j = int(np.argmax(net))
                if net.flat[j] > eps and (best is None or net.flat[j] > best[0]):
                    i, m = divmod(j, len(cand))
                    best = (float(net.flat[j]), "swap", int(mine[i]), int(where[cand[m]]), int(cand[m]))
            if best is not None:
                break
        if best is None:
            break
        _, kind, item, target, other_item = best
        src = int(where[item])
        moves = [(item, src, target)] + ([(other_item, target, src)] if kind == "swap" else [])
        for it, a, b in moves:
            where[it] = b
            load.flat[a] -= costs[it]
            load.flat[b] += costs[it]
            tok.flat[a] -= lengths[it]
            tok.flat[b] += lengths[it]
        changed = True
    if changed:
        for r in range(dp):
            for s in range(k):
                indices[r][s] = np.flatnonzero(where == s * dp + r).astype(np.int64)
    return changed
