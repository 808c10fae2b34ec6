"""``packkit.rl.micro_batches``: one RL step's rollouts -> token-capped micro-batches on every data-parallel rank.

RL trainers (verl, OpenRLHF) first balance rollouts across ranks, then let each rank cut its own
micro-batches, so micro-batch ``k`` of rank 0 and of rank 7 are never balanced against each other
although FSDP runs them in lock step. Here both decisions are one plan, made in C++
(``packkit._planner.rl_micro_batches``, ``csrc/planner/micro_batches.cpp``): K micro-batches per rank (the bound
``ceil(ceil(tokens / max_tokens) / dp_size)``, else K + 1), each within ``max_tokens`` by construction, steps of
``dp_size`` micro-batches of near-equal cost, ``equal_count`` and forced counts included, then (heavy tails) the
cross-step local search (``csrc/planner/step_search.cpp``; ``local_search.py`` is its Python reference, used by the
tests only), which stops at a goal derived from the certified balance bound (``SEARCH_MARGIN``). The older layouts below
(``ogbfd`` planner, capped longest-processing-time in numpy) run only when the C++ layout fits neither K nor K + 1.
"""
from __future__ import annotations

import heapq
import math
import numbers
from typing import Callable, Optional, Union

import numpy as np
import torch

from .. import _planner
from ..planning.arg_rules import callback_costs
from ..planning.planner import as_lengths, plan as make_plan

CostLike = Union[str, tuple, Callable, object]
# Most micro-batches (over all ranks) one call lays out: each is a numpy index array (about 100 bytes empty),
# so dp_size=10**9 would need ~100 GB before any sequence is placed. 2**20 is far beyond any real step
# (16,384 ranks x 64 micro-batches).
MAX_MICRO_BATCHES = 1 << 20
# ... and at most max(2**16, 8 per sequence): dp_size=2**20 for 5 rollouts took over 20 s laying out a million
# empty index arrays; the output is bounded by the data (65,536 ranks still get one micro-batch each).
MICRO_BATCHES_FLOOR, MICRO_BATCHES_PER_SEQUENCE = 1 << 16, 8
# The cross-step local search (C++, csrc/planner/step_search.cpp) runs where the layout's per-step balance is above
# SEARCH_ABOVE (heavy-tailed rollouts; typical batches come out of the layout within it), at most SEARCH_ROUNDS
# changes per layout.
SEARCH_ABOVE = 1.002
SEARCH_ROUNDS = 800
# Where every cost is a*l + b*l**2 (verl's workload, "tokens", (a, b), transformer_cost), the search stops as soon
# as the balance is within SEARCH_MARGIN of the certified lower bound at that K (planning/balance_bound.py, ported to
# C++), or at SEARCH_ABOVE if that is higher, instead of running to a local optimum: on heavy tails the last few
# hundred changes gain less than the margin and cost most of the time.
SEARCH_MARGIN = 0.001


class MicroBatches:
    """Result of :func:`micro_batches`.

    Attributes:
        indices: ``indices[rank][k]``: int64 numpy index array (into the global batch) of rank
            ``rank``'s micro-batch ``k``. Every rank has ``num_micro_batches`` of them.
        num_micro_batches: micro-batches per rank (the same on every rank).
        dp_size, max_tokens: as given.
        tokens, costs: ``[num_micro_batches, dp_size]`` tokens and cost of each micro-batch.
        balance: ``sum over k of the costliest rank's micro-batch k / sum over k of the mean`` (>= 1): the
            time synchronised steps wait for their slowest rank, relative to perfect balance.
        token_bound: ``ceil(total tokens / max_tokens)``, the fewest micro-batches any split of the
            whole batch into ``max_tokens`` pieces can have (over all ranks together).
        rank_bound: ``ceil(token_bound / dp_size)``, the fewest micro-batches per rank.
        empty_micro_batches: micro-batches holding no sequence (only when unavoidable: fewer
            sequences than micro-batches a rank must run, e.g. ``min_micro_batches`` or equal counts).
        method: ``"cpp"`` (the C++ layout, ``packkit._planner.rl_micro_batches``), or a fallback used only when
            it finds no layout at the lower bound K nor at K + 1: ``"ogbfd"`` or ``"lpt"``.
    """

    def __init__(self, indices, lengths, item_costs, max_tokens, dp_size, token_bound, method, tokens=None, costs=None,
                 empty=None):
        self.indices = indices
        self.dp_size = dp_size
        self.max_tokens = max_tokens
        self.num_micro_batches = len(indices[0]) if indices else 0
        k = self.num_micro_batches
        if tokens is not None:  # [k, dp_size], computed by the C++ layout
            self.tokens, self.costs = tokens, costs
        else:
            self.tokens = np.zeros((k, dp_size), np.int64)
            self.costs = np.zeros((k, dp_size), np.float64)
            for r in range(dp_size):
                for s in range(k):
                    idx = indices[r][s]
                    self.tokens[s, r] = int(lengths[idx].sum())
                    self.costs[s, r] = float(item_costs[idx].sum())
        mean = float(self.costs.mean(axis=1).sum()) if k else 0.0
        self.balance = float(self.costs.max(axis=1).sum()) / mean if mean > 0 else 1.0
        self.token_bound = token_bound
        self.rank_bound = -(-token_bound // dp_size)
        self.empty_micro_batches = int(sum(len(b) == 0 for rank in indices for b in rank)) if empty is None \
            else empty
        self.method = method

    def rank(self, r: int) -> list:
        """Rank ``r``'s micro-batches (a list of int64 index arrays)."""
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 0 <= r < self.dp_size:
            raise ValueError(f"rank must be an int in [0, {self.dp_size}) (dp_size={self.dp_size}), got {r!r}")
        return self.indices[r]

    def __repr__(self):
        return (f"MicroBatches(dp_size={self.dp_size}, num_micro_batches={self.num_micro_batches}, "
                f"rank_bound={self.rank_bound}, balance={self.balance:.5f}, max tokens={int(self.tokens.max(initial=0))}"
                f"/{self.max_tokens}, empty={self.empty_micro_batches}, method={self.method!r})")


def _count(value, name, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not minimum <= value <= 2**63 - 1:
        raise ValueError(f"{name} must be an int in [{minimum}, 2^63 - 1], got {value!r}")
    return int(value)


def _checked_costs(values, n: int, name: str) -> np.ndarray:
    """A cost callback's (or array's) values under the one rule every callback follows (``planning.arg_rules``)."""
    return callback_costs(values, n, name)


def item_costs(lengths: np.ndarray, cost) -> tuple:
    """``(per-item float64 costs, spec for packkit.plan)`` for a cost: ``"tokens"``, ``"attention"``, ``(a, b)``,
    a transformers config, or a callable on lengths (numpy int64 array or torch tensor, e.g. verl's
    ``calculate_workload``), evaluated once, vectorised."""
    if isinstance(cost, np.ndarray):  # explicit per-item costs (e.g. summed over forced groups)
        return _checked_costs(cost, len(lengths), "the cost array"), None
    if isinstance(cost, str) or isinstance(cost, (tuple, list)) or hasattr(cost, "hidden_size") \
            or hasattr(cost, "text_config"):
        from ..planning.planner import _cost_model

        a, b, _ = _cost_model(cost)
        x = lengths.astype(np.float64)
        return a * x + b * x * x, (a, b)
    if not callable(cost):
        raise TypeError(f"cost must be 'tokens', 'attention', (a, b), a transformers config or a callable; got {cost!r}")
    name = f"the cost callable {getattr(cost, '__qualname__', None) or repr(cost)}"
    try:
        values = cost(lengths.copy())
    except (TypeError, AttributeError):  # a callable on tensors only (torch ops)
        values = cost(torch.from_numpy(lengths.copy()))
    values = _checked_costs(values, len(lengths), name)
    table = []  # built on the first call (only the ogbfd fallback asks)

    def lookup(item_lengths):  # the planner asks per length (whole sequences only here)
        if not table:
            order = np.argsort(lengths, kind="stable")
            table.extend((lengths[order], values[order]))
        keys, per_length = table
        return per_length[np.minimum(np.searchsorted(keys, item_lengths), len(keys) - 1)]

    return values, lookup


def _capped_lpt(order, lengths, costs, num_bins, max_tokens):
    """Longest processing time first with a token cap: items (in ``order``, costliest first) each go to the
    cheapest bin that still has room. Returns a list of index lists, or None if an item fits nowhere."""
    bins = [[] for _ in range(num_bins)]
    room = np.full(num_bins, max_tokens, np.int64)
    heap = [(0.0, b) for b in range(num_bins)]
    for i in order:
        length = lengths[i]
        held = []
        while heap and room[heap[0][1]] < length:
            held.append(heapq.heappop(heap))
        if not heap:
            return None
        load, b = heapq.heappop(heap)
        bins[b].append(int(i))
        room[b] -= length
        heapq.heappush(heap, (load + costs[i], b))
        for entry in held:
            heapq.heappush(heap, entry)
    return bins


def _steps_from_bins(bins, costs, dp_size):
    """Deal ``num_steps * dp_size`` bins into steps: sorted by cost, consecutive bins share a step."""
    load = np.array([costs[b].sum() if b else 0.0 for b in bins])
    order = np.argsort(-load, kind="stable")
    steps = len(bins) // dp_size
    return [[bins[order[s * dp_size + r]] for s in range(steps)] for r in range(dp_size)]


def _ranks_equal_count(order, lengths, costs, dp_size):
    """Split items into ``dp_size`` ranks of equal count, balancing cost: rounds of ``dp_size`` items
    (costliest first), the costliest of a round to the cheapest rank so far."""
    ranks = [[] for _ in range(dp_size)]
    load = np.zeros(dp_size)
    tok = np.zeros(dp_size, np.int64)
    for start in range(0, len(order), dp_size):
        chunk = order[start:start + dp_size]
        targets = np.lexsort((tok, load))  # cheapest rank first
        for i, r in zip(chunk, targets):
            ranks[r].append(int(i))
            load[r] += costs[i]
            tok[r] += lengths[i]
    return ranks


def micro_batches(lengths, max_tokens: int, dp_size: int = 1, cost: CostLike = "tokens", *, equal_count: bool = False,
                  min_micro_batches: Optional[int] = None, divisible_by: Optional[int] = None) -> MicroBatches:
    """Split one global batch of rollouts into micro-batches for ``dp_size`` ranks.

    Args:
        lengths: tokens of each sequence (list, numpy array or 1-D tensor; e.g. ``attention_mask.sum(1)``
            copied to the host once).
        max_tokens: token cap of every micro-batch (verl's ``max_token_len``); never exceeded.
        dp_size: data-parallel ranks.
        cost: what to balance: ``"tokens"``, ``"attention"``, ``(a, b)`` for ``a*l + b*l**2`` (e.g.
            :func:`packkit.transformer_cost`), a transformers config, or a callable on an array of lengths
            (verl's ``calculate_workload`` works).
        equal_count: every rank gets the same number of sequences (needs ``len(lengths) % dp_size == 0``).
        min_micro_batches: at least this many micro-batches per rank.
        divisible_by: micro-batches per rank rounded up to a multiple of this (pipeline parallel).

    Guarantees: every sequence in exactly one micro-batch; no micro-batch over ``max_tokens`` (a sequence
    over it raises ValueError naming it); the same number of micro-batches on every rank; deterministic.
    """
    lengths = as_lengths(lengths)
    max_tokens = _count(max_tokens, "max_tokens")
    dp_size = _count(dp_size, "dp_size")
    if not isinstance(equal_count, (bool, np.bool_)):
        raise TypeError(f"equal_count must be True or False, got {equal_count!r}")
    n = len(lengths)
    low, high = (int(lengths.min()), int(lengths.max())) if n else (0, 0)
    if low < 0:
        i = int(np.flatnonzero(lengths < 0)[0])
        raise ValueError(f"sequence {i} has a negative length {int(lengths[i])}")
    if high > max_tokens:
        over = np.flatnonzero(lengths > max_tokens)
        i = int(over[np.argmax(lengths[over])])
        raise ValueError(f"sequence {i} has {int(lengths[i])} tokens, more than max_tokens={max_tokens} "
                         f"({len(over)} sequences are over it); raise max_tokens or truncate the rollouts")
    if equal_count and n % dp_size:
        raise ValueError(f"equal_count=True needs the batch size ({n}) to be a multiple of dp_size ({dp_size})")
    minimum = 1 if min_micro_batches is None else _count(min_micro_batches, "min_micro_batches")
    divisor = 1 if divisible_by is None else _count(divisible_by, "divisible_by")
    costs, spec = item_costs(lengths, cost)
    # Every length is <= max_tokens, so an int64 sum cannot wrap while n * max_tokens fits; else Python ints
    # (the object sum costs ~0.4 ms on 16k rollouts).
    total = (int(lengths.sum()) if n * max_tokens < 2**63 else int(lengths.sum(dtype=object))) if n else 0
    if total > 2**63 - 1:
        raise ValueError(f"the rollouts hold {total:,} tokens in all, more than 2^63 - 1")
    token_bound = -(-total // max_tokens)

    limit = min(MAX_MICRO_BATCHES, max(MICRO_BATCHES_FLOOR, MICRO_BATCHES_PER_SEQUENCE * n))

    def rounded(k):
        k = max(k, minimum, 1)
        k = -(-k // divisor) * divisor
        if k * dp_size > limit:  # every micro-batch is an index array: bound the output, not the RAM
            raise ValueError(f"dp_size={dp_size} ranks x {k} micro-batches each = {k * dp_size:,} micro-batches, more "
                             f"than the {limit:,} micro_batches lays out for {n} sequences (check dp_size, "
                             f"min_micro_batches={min_micro_batches}, divisible_by={divisible_by})")
        return k

    # The C++ layout at the lower bound K, else at K + 1; the older numpy / ogbfd layouts below only if neither fits.
    k = rounded(-(-token_bound // dp_size))
    # K + 1 micro-batches per rank (within the promised bound + 1) can give the search the room a long rollout needs
    # (heavy tails: 1.0223 -> 1.0106 on one such batch): the C++ call lays out both and searches the one that starts
    # lower first. With a forced count (min_micro_batches, divisible_by) only K, else the next allowed count.
    free = min_micro_batches is None and divisor == 1
    best = _cpp_layout(lengths, costs, max_tokens, dp_size, k, equal_count, token_bound, try_next=free)
    if best is None and not free:
        best = _cpp_layout(lengths, costs, max_tokens, dp_size, rounded(k + 1), equal_count, token_bound)
    if best is not None:
        return best
    order = np.lexsort((np.arange(n), -lengths, -costs))  # costliest first, ties by length then index
    if not equal_count and spec is None:  # per-item costs: no cost model for the planner
        k = rounded(-(-token_bound // dp_size))
    elif not equal_count:
        planned = make_plan(lengths, max_tokens, algorithm="ogbfd", dp_size=dp_size, cost=spec)
        steps = planned.num_steps
        if rounded(steps) == steps or n == 0:
            bins = planned.bins
            indices = [[np.array(bins[s * dp_size + r], np.int64) for s in range(steps)] for r in range(dp_size)]
            if steps == 0:
                indices = [[np.zeros(0, np.int64)] * rounded(0) for _ in range(dp_size)]
            _place_zero_length(indices, planned.zero_length)
            _refine_steps(indices, lengths, costs, max_tokens, moves=True)
            best = MicroBatches(indices, lengths, costs, max_tokens, dp_size, token_bound, "ogbfd")
            if dp_size > 1 and n >= dp_size and best.balance > 1.0005:  # the other layout may balance better
                other = _rank_lpt(order, lengths, costs, max_tokens, dp_size, token_bound, rounded)
                if (other.num_micro_batches, other.balance) < (best.num_micro_batches, best.balance):
                    best = other
            return best
        k = rounded(steps)
    if not equal_count:
        while True:  # more micro-batches than the plan needs: spread the items over all of them
            bins = _capped_lpt(order, lengths, costs, k * dp_size, max_tokens)
            if bins is not None:
                break
            k = rounded(k + 1)
        indices = _steps_from_bins([sorted(b) for b in bins], costs, dp_size)
        indices = [[np.asarray(b, np.int64) for b in rank] for rank in indices]
        return MicroBatches(indices, lengths, costs, max_tokens, dp_size, token_bound, "lpt")

    return _rank_lpt(order, lengths, costs, max_tokens, dp_size, token_bound, rounded)


def _cpp_layout(lengths, costs, max_tokens, dp_size, k, equal_count, token_bound, try_next=False):
    """The C++ layout with ``k`` (or, ``try_next``, ``k + 1``) micro-batches per rank
    (``csrc/planner/micro_batches.hpp``), or None if some sequence fits in none of them."""
    out = _planner.rl_micro_batches(lengths, costs, max_tokens, dp_size, k, equal_count, search_rounds=SEARCH_ROUNDS,
                                    search_above=SEARCH_ABOVE, goal_margin=SEARCH_MARGIN, try_next=try_next)
    if out is None:
        return None
    k = out["num_micro_batches"]
    order, offsets = out["order"], out["offsets"]
    bounds = offsets.tolist()
    pieces = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]  # micro-batch r * k + s
    indices = [pieces[r * k:(r + 1) * k] for r in range(dp_size)]
    tokens = out["tokens"].reshape(dp_size, k).T
    step_costs = out["costs"].reshape(dp_size, k).T
    empty = int(np.count_nonzero(offsets[1:] == offsets[:-1]))
    return MicroBatches(indices, lengths, costs, max_tokens, dp_size, token_bound, "cpp", tokens, step_costs, empty)


def _rank_lpt(order, lengths, costs, max_tokens, dp_size, token_bound, rounded):
    """Equal-count ranks (rounds of dp_size items), then each rank's items into the same number of micro-batches
    by capped LPT, micro-batch k of every rank the k-th costliest; then the in-step local search (swaps only)."""
    n = len(lengths)
    ranks = _ranks_equal_count(order, lengths, costs, dp_size)
    rank_tokens = max(int(lengths[r].sum()) for r in ranks) if n else 0
    k = rounded(-(-rank_tokens // max_tokens))
    while True:
        per_rank = []
        for items in ranks:
            rank_order = np.asarray(items, np.int64)  # already costliest first
            bins = _capped_lpt(rank_order, lengths, costs, k, max_tokens)
            if bins is None:
                break
            load = np.array([costs[b].sum() if b else 0.0 for b in bins])
            per_rank.append([np.asarray(sorted(bins[j]), np.int64) for j in np.argsort(-load, kind="stable")])
        if len(per_rank) == dp_size:
            break
        k = rounded(k + 1)
    _refine_steps(per_rank, lengths, costs, max_tokens, moves=False)
    return MicroBatches(per_rank, lengths, costs, max_tokens, dp_size, token_bound, "lpt")


def _place_zero_length(indices, zero_length):
    """Zero-length sequences hold no tokens; each goes to the micro-batch with the fewest sequences."""
    if not len(zero_length) or not indices or not indices[0]:
        return
    flat = [(r, s) for r in range(len(indices)) for s in range(len(indices[r]))]
    counts = [len(indices[r][s]) for r, s in flat]
    heap = [(c, j) for j, c in enumerate(counts)]
    heapq.heapify(heap)
    extra = {j: [] for j in range(len(flat))}
    for i in zero_length:
        c, j = heapq.heappop(heap)
        extra[j].append(int(i))
        heapq.heappush(heap, (c + 1, j))
    for j, items in extra.items():
        if items:
            r, s = flat[j]
            indices[r][s] = np.sort(np.concatenate((indices[r][s], np.asarray(items, np.int64))))


def _refine_steps(indices, lengths, costs, max_tokens, *, moves: bool, rounds: int = 24):
    """Local search inside each step: move (``moves=True``) or swap items between the step's costliest and
    cheapest ranks when that lowers the step's maximum and keeps both within ``max_tokens``. Swaps keep every
    rank's sequence count (equal_count). In place, deterministic."""
    dp = len(indices)
    if dp < 2:
        return
    for s in range(len(indices[0])):
        parts = [indices[r][s] for r in range(dp)]
        load = np.array([costs[p].sum() for p in parts])
        tok = np.array([lengths[p].sum() for p in parts], np.int64)
        for _ in range(rounds):
            hi, lo = int(np.argmax(load)), int(np.argmin(load))
            gap = load[hi] - load[lo]
            if gap <= 0 or not len(parts[hi]):
                break
            a, b = parts[hi], parts[lo]
            best, best_gain = None, 0.0
            if moves:  # move item i from hi to lo: new max of the pair = max(load_hi - c, load_lo + c)
                c = costs[a]
                ok = tok[lo] + lengths[a] <= max_tokens
                gain = np.where(ok, np.minimum(c, gap - c), -1.0)
                j = int(np.argmax(gain)) if len(gain) else 0
                if len(gain) and gain[j] > best_gain:
                    best, best_gain = ("move", j), float(gain[j])
            if len(b):  # swap i (hi) with k (lo): the pair's max drops by min(d, gap - d), d = c_i - c_k
                d = costs[a][:, None] - costs[b][None, :]
                dl = lengths[a][:, None] - lengths[b][None, :]
                ok = (tok[lo] + dl <= max_tokens) & (tok[hi] - dl <= max_tokens)
                gain = np.where(ok, np.minimum(d, gap - d), -1.0)
                j = int(np.argmax(gain))
                if gain.flat[j] > best_gain:
                    best, best_gain = ("swap", divmod(j, len(b))), float(gain.flat[j])
            if best is None or best_gain <= gap * 1e-9:
                break
            if best[0] == "move":
                i = best[1]
                item = a[i]
                parts[hi], parts[lo] = np.delete(a, i), np.sort(np.append(b, item))
                load[hi] -= costs[item]; load[lo] += costs[item]
                tok[hi] -= lengths[item]; tok[lo] += lengths[item]
            else:
                i, k = best[1]
                x, y = a[i], b[k]
                parts[hi], parts[lo] = np.sort(np.append(np.delete(a, i), y)), np.sort(np.append(np.delete(b, k), x))
                load[hi] += costs[y] - costs[x]; load[lo] += costs[x] - costs[y]
                tok[hi] += lengths[y] - lengths[x]; tok[lo] += lengths[x] - lengths[y]
        for r in range(dp):
            indices[r][s] = parts[r]
