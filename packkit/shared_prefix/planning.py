"""Trees as planning units: never split a tree that fits, split one that does not into the fewest sub-trees.

A tree's size in a row is its unique tokens (each shared prefix once); its cost under ``a*l + b*l**2`` is
``a * tokens + b * sum over nodes of ((pos + len)**2 - pos**2)``: every token attends to its position + 1
keys, so a chain costs exactly what the sequence alone costs and each branch adds only its own part.

A tree over ``capacity`` is split at its root: the root's child subtrees are bin-packed (the planner's
``ffd``) into bins of ``capacity - len(root)``, and each bin becomes a sub-tree that re-carries a copy of the
root (reported, never a drop); a child subtree that is itself too big is split the same way first. A
root-to-leaf path over capacity (a prompt + one completion) follows the over-long policy: ``"error"`` or
``"truncate"`` (the completion's tail is cut; reported per sequence).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np

from ..planning.planner import Plan, _as_count, _cost_model, plan as make_plan
from .checks import check_allocation, check_cost, check_forest, check_overlong, check_plan_args
from .tree import PrefixForest
from ..planning.arg_rules import callback_costs, read_only_call


class SplitReport(NamedTuple):
    forest: PrefixForest  # the forest after splits (copied roots are separate nodes) and truncation
    split_groups: dict  # group id -> number of sub-trees it was split into (only groups that were split)
    truncated: dict  # sequence -> (tokens kept, tokens it had)
    copied_tokens: int  # prompt tokens forwarded more than once because of splits


def _csum(forest: PrefixForest) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(forest.length)])


def tree_costs(forest: PrefixForest, cost="tokens") -> np.ndarray:
    """Cost of each tree (``forest.roots()`` order) under ``cost``: ``"tokens"``, ``"attention"``, ``(a, b)``,
    a transformers config, or a callable ``f`` on lengths (charged ``f(pos + len) - f(pos)`` per node, which
    telescopes to ``f(L)`` along a chain)."""
    check_forest(forest)
    check_cost(cost)
    return _tree_costs(forest, cost)


def _tree_costs(forest: PrefixForest, cost) -> np.ndarray:
    pos = forest.position().astype(np.float64)
    end = pos + forest.length
    if callable(cost) and not (hasattr(cost, "hidden_size") or hasattr(cost, "text_config")):
        node = _call_cost(cost, end.astype(np.int64)) - _call_cost(cost, pos.astype(np.int64))
        if len(node) and (not np.isfinite(node).all() or node.min() < 0):
            raise ValueError("cost callable must be finite and non-decreasing in the length (a node is charged "
                             "cost(pos + len) - cost(pos) >= 0)")
    else:
        a, b, _ = _cost_model(cost)
        node = a * forest.length + b * (end * end - pos * pos)
    csum = np.concatenate([[0.0], np.cumsum(node)])
    roots = forest.roots()
    return csum[forest.subtree_end()[roots]] - csum[roots]


def _call_cost(cost, lengths: np.ndarray) -> np.ndarray:
    """``cost(lengths)`` under the one callback rule (``planning.arg_rules.callback_costs``): real, finite, >= 0, one
    per length (a complex or string return was cast by ``np.asarray(..., float64)``, losing or inventing values)."""
    try:
        values = read_only_call(cost, lengths)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cost callable must map an int64 array of lengths to real costs ({exc})") from None
    return callback_costs(values, len(lengths), "the cost callable", "length")


def split_oversized(forest: PrefixForest, capacity: int, overlong: str = "error") -> SplitReport:
    """The forest with every tree over ``capacity`` split into the fewest sub-trees the planner finds."""
    check_forest(forest)
    capacity = _as_count(capacity, "capacity")
    check_overlong(overlong)
    return _split_oversized(forest, capacity, overlong)


def _split_oversized(forest: PrefixForest, capacity: int, overlong: str) -> SplitReport:
    csum = _csum(forest)
    sub_end = forest.subtree_end()
    tree_tokens = csum[sub_end] - csum[np.arange(forest.num_nodes)]
    children: list[list[int]] = [[] for _ in range(forest.num_nodes)]
    for i in range(forest.num_nodes):
        if forest.parent[i] >= 0:
            children[forest.parent[i]].append(i)
    length = forest.length.copy()
    seq_at = {}
    for s, node in enumerate(forest.seq_node):
        seq_at.setdefault(int(node), []).append(s)
    truncated = {}

    def whole(node):  # the subtree in preorder as (orig node, parent index in the unit)
        lo, hi = node, sub_end[node]
        return [(k, -1 if k == node else int(forest.parent[k]) - lo) for k in range(lo, hi)]

    def split(node, budget):  # list of units, each fitting budget
        if tree_tokens[node] <= budget and length[node] == forest.length[node]:
            return [whole(node)]
        if not children[node]:
            if length[node] <= budget:
                return [[(node, -1)]]
            if overlong == "error":
                seqs = seq_at.get(node, [])
                what = f"sequence {seqs[0]}" if seqs else f"node {node}"
                raise ValueError(f"{what} needs {int(forest.position()[node] + forest.length[node])} tokens with "
                                 f"its prefix, more than capacity={capacity}; raise capacity or pass "
                                 "overlong='truncate'")
            for s in seq_at.get(node, []):
                truncated[s] = (int(forest.position()[node]) + budget, int(forest.position()[node] + length[node]))
            length[node] = budget
            return [[(node, -1)]]
        inner = budget - int(length[node])
        if inner < 0 or (inner == 0 and any(tree_tokens[c] for c in children[node])):
            raise ValueError(f"a shared prefix of {int(forest.position()[node] + length[node])} tokens (node "
                             f"{node}) leaves no room for its continuations in capacity={capacity}; raise capacity")
        items = []
        for c in children[node]:
            items.extend(split(c, inner))
        sizes = np.array([sum(int(length[k]) for k, _ in unit) for unit in items], np.int64)
        bins = _bins(sizes, inner)
        units = []
        for b in bins:
            unit = [(node, -1)]
            for i in b:
                base = len(unit)
                unit.extend((k, 0 if p < 0 else base + p) for k, p in items[i])
            units.append(unit)
        return units

    units, split_groups, copied = [], {}, 0
    for root in forest.roots():
        made = split(int(root), capacity)
        if len(made) > 1:
            group = forest.seq_group[forest.seq_node >= root][0] if (forest.seq_node >= root).any() else int(root)
            split_groups[int(group)] = len(made)
        units.extend(made)
    # Rebuild a preorder forest from the units (a node's first copy keeps its sequences).
    parent, new_len, src, first_copy = [], [], [], {}
    for unit in units:
        base = len(parent)
        for k, p in unit:
            if k in first_copy:
                copied += int(length[k])
            else:
                first_copy[k] = len(parent)
            parent.append(-1 if p < 0 else base + p)
            new_len.append(int(length[k]))
            src.append(int(forest.src[k]))
    seq_node = np.array([first_copy[int(n)] for n in forest.seq_node], np.int64)
    labels = forest.labels
    out = PrefixForest(np.array(parent, np.int64), np.array(new_len, np.int64), np.array(src, np.int64),
                       forest.tokens, seq_node, np.minimum(forest.score_start, _seq_lengths(parent, new_len, seq_node)),
                       forest.seq_group, labels)
    return SplitReport(out, split_groups, truncated, copied)


def _seq_lengths(parent, length, seq_node) -> np.ndarray:
    pos = np.zeros(len(parent), np.int64)
    for i, p in enumerate(parent):
        if p >= 0:
            pos[i] = pos[p] + length[p]
    length = np.asarray(length, np.int64)
    return pos[seq_node] + length[seq_node]


def _bins(sizes: np.ndarray, capacity: int) -> list:
    """Bins of item indices (first-fit decreasing through the planner; empty items join the first bin)."""
    if capacity <= 0:
        return [list(range(len(sizes)))]
    nonzero = np.flatnonzero(sizes > 0)
    if len(nonzero) == 0:
        return [list(range(len(sizes)))]
    planned = make_plan(sizes[nonzero], capacity, algorithm="ffd")
    bins = [sorted(int(nonzero[i]) for i in b) for b in planned.bins]
    bins[0] = sorted(bins[0] + [int(i) for i in np.flatnonzero(sizes == 0)])
    return bins


class TreePlan(NamedTuple):
    forest: PrefixForest  # after splits
    rows: list  # rows[r]: int64 array of root nodes (of ``forest``) packed in row r, in order
    plan: Optional[Plan]  # the row plan over trees (None without capacity: one row)
    report: SplitReport


def plan_trees(forest: PrefixForest, capacity: Optional[int] = None, *, algorithm: str = "obfd", dp_size: int = 1,
               cost="tokens", overlong: str = "error") -> TreePlan:
    """Rows of whole trees: each tree (after :func:`split_oversized`) is one unit of :func:`packkit.plan`,
    sized by its unique tokens. Without ``capacity``: one row holding every tree in order."""
    check_forest(forest)
    capacity = check_plan_args(capacity, algorithm=algorithm, dp_size=dp_size, cost=cost, overlong=overlong)
    if capacity is None:
        report = SplitReport(forest, {}, {}, 0)
        return TreePlan(forest, [forest.roots()], None, report)
    # Before planning: dp_size rows of capacity is the least a plan with tokens allocates.
    check_allocation(capacity * dp_size, int(forest.length.sum()), f"capacity={capacity} x dp_size={dp_size}",
                     rows=dp_size)
    report = _split_oversized(forest, capacity, overlong)
    f = report.forest
    roots = f.roots()
    tokens = f.tree_tokens()
    spec = cost
    if not (isinstance(cost, str) and cost == "tokens"):
        per_tree = _tree_costs(f, cost)
        keys = np.unique(tokens)
        mean = np.array([per_tree[tokens == k].mean() for k in keys])
        spec = _lookup(keys, mean)
    planned = make_plan(tokens, capacity, algorithm=algorithm, dp_size=dp_size, cost=spec)
    if planned.zero_length is not None and len(planned.zero_length):
        zero = np.asarray(planned.zero_length, np.int64)
    else:
        zero = np.zeros(0, np.int64)
    rows = [roots[np.asarray(b, np.int64)] for b in planned.bins]
    if len(zero):  # empty trees (empty prompt, empty completions) ride in the first row
        if not rows:
            rows = [np.zeros(0, np.int64)]
        rows[0] = np.concatenate([rows[0], roots[zero]])
    check_allocation(len(rows) * capacity, int(f.length.sum()), f"the plan's {len(rows)} rows of capacity={capacity}",
                     rows=len(rows))
    return TreePlan(f, rows, planned, report)


def _lookup(keys: np.ndarray, values: np.ndarray) -> Callable:
    """A cost callable for the planner: the tree cost of each length (the mean over trees of that length)."""
    def cost(item_lengths):
        idx = np.minimum(np.searchsorted(keys, item_lengths), len(keys) - 1)
        return values[idx]
    return cost


def tree_micro_batches(forest: PrefixForest, max_tokens: int, dp_size: int = 1, cost="tokens", **kwargs):
    """:func:`packkit.rl.micro_batches` over whole trees (unique tokens, tree costs); returns
    ``(MicroBatches over tree indices, the forest after splits)``."""
    from ..rl.micro_batches import micro_batches

    check_forest(forest)
    max_tokens = _as_count(max_tokens, "max_tokens")
    overlong = kwargs.pop("overlong", "error")
    check_overlong(overlong)
    check_cost(cost)
    report = _split_oversized(forest, max_tokens, overlong)
    f = report.forest
    return micro_batches(f.tree_tokens(), max_tokens, dp_size, cost=_tree_costs(f, cost), **kwargs), f


__all__ = ["tree_costs", "split_oversized", "plan_trees", "tree_micro_batches", "TreePlan", "SplitReport"]
