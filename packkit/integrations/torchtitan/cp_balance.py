"""Document order within a row for torchtitan's static context parallelism (no torchtitan import).

torchtitan 0.3 fixes the CP degree when it builds its device mesh (``ParallelDims(cp=context_parallel_degree)``)
and shards every batch over that one ``cp`` mesh (``Trainer.post_dataloading_process`` ->
``prepare_context_parallel_input`` -> ``cp_shard``, head-tail balancer by default): rank r keeps chunks r and
``2*cp-1-r`` of each row (``L / (2*cp)`` tokens each). That balances one causal sequence; a row of packed documents
is balanced only if its documents fall well on the chunks, since a token's attention work grows with its position
in its document. The row's documents are ours to order (positions restart per document, so torchtitan's masks
and RoPE do not depend on it): :func:`headtail_order` picks the order whose busiest CP rank does the least work.
"""
from __future__ import annotations

import itertools

import numpy as np

from ...packing.checks import check_int
from ...planning.planner import _cost_model

MAX_SWAP_DOCS = 16  # rows of more documents try the fixed candidate orders only (swaps cost O(n^2) evaluations)


def check_cp_degree(cp_degree, seq_len: int) -> int:
    """``cp_degree`` as an int >= 1 with ``seq_len`` a multiple of ``2 * cp_degree`` (head-tail's chunks)."""
    cp = check_int(cp_degree, "cp_degree", 1)
    if cp > 1 and seq_len % (2 * cp):
        raise ValueError(f"seq_len ({seq_len}) must be a multiple of 2 * cp_degree ({2 * cp}): torchtitan's "
                         "head-tail CP sharding cuts each row in 2 * cp chunks")
    return cp


def token_work(cost) -> tuple[float, float]:
    """``(a, b)``: a token at position p of its document costs ``a + b * (2p + 1)`` (a document of length l:
    ``a*l + b*l**2``, as ``packkit.plan(cost=)``). A callable cost counts attention only (its split is unknown)."""
    a, b, item_costs = _cost_model(cost)
    return (0.0, 1.0) if item_costs is not None else (float(a), float(b))


def rank_work(lengths, seq_len: int, cp: int, a: float, b: float) -> np.ndarray:
    """Each CP rank's work for documents of ``lengths`` back to back in a row of ``seq_len`` (the rest padding,
    one more document), under head-tail sharding: chunk k of ``2*cp`` goes to rank ``min(k, 2*cp-1-k)``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    if ends.size and ends[-1] < seq_len:
        lengths, ends = np.append(lengths, seq_len - ends[-1]), np.append(ends, seq_len)
    elif not ends.size:
        lengths, ends = np.array([seq_len]), np.array([seq_len])
    starts = (ends - lengths).astype(np.float64)[:, None]
    chunk = seq_len // (2 * cp)
    lo = np.arange(2 * cp, dtype=np.float64)[None, :] * chunk
    x0 = np.maximum(starts, lo)
    x1 = np.minimum(ends.astype(np.float64)[:, None], lo + chunk)
    n = np.clip(x1 - x0, 0, None)
    work = (n * a + b * np.where(n > 0, (x1 - starts) ** 2 - (x0 - starts) ** 2, 0.0)).sum(axis=0)
    ranks = np.minimum(np.arange(2 * cp), 2 * cp - 1 - np.arange(2 * cp))
    return np.bincount(ranks, weights=work, minlength=cp)


def headtail_order(lengths, seq_len: int, cp: int, a: float, b: float) -> list[int]:
    """An order of the documents (indices into ``lengths``) minimising the busiest CP rank's :func:`rank_work`:
    the best of the given, longest-first, shortest-first and longest-at-both-ends orders, then (up to
    ``MAX_SWAP_DOCS`` documents) up to four sweeps of pairwise swaps. The given order wins ties."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if cp == 1 or n < 2 or b == 0:
        return list(range(n))

    def peak(order):
        return float(rank_work(lengths[list(order)], seq_len, cp, a, b).max())

    down = sorted(range(n), key=lambda i: -lengths[i])
    ends = down[0::2] + down[1::2][::-1]
    best = list(range(n))
    best_peak = peak(best)
    for order in (down, down[::-1], ends):
        p = peak(order)
        if p < best_peak * (1 - 1e-12):
            best, best_peak = list(order), p
    improved, rounds = n <= MAX_SWAP_DOCS, 0
    while improved and rounds < 4:  # each round a full sweep; the peak falls strictly, four bound the time
        improved, rounds = False, rounds + 1
        for i, j in itertools.combinations(range(n), 2):
            trial = best.copy()
            trial[i], trial[j] = trial[j], trial[i]
            p = peak(trial)
            if p < best_peak * (1 - 1e-12):
                best, best_peak, improved = trial, p, True
    return best
