"""Random prefix forests and the ``packkit::tree_pack`` arguments of their packed layout: the one sample-input
generator of the shared-prefix op and attention tests."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from packkit.shared_prefix.layout import tree_layout
from packkit.shared_prefix.tree import PrefixForest


def random_forest(draw_parent, lengths, tokens=None) -> PrefixForest:
    """A preorder forest: node i's parent is -1 or a node on the path to node i - 1 (so subtrees stay contiguous)."""
    parent, path = [], []
    for i, choice in enumerate(draw_parent):
        options = [-1] + path
        p = options[choice % len(options)]
        parent.append(p)
        path = (path[:path.index(p) + 1] if p >= 0 else []) + [i]
    length = np.array(lengths, np.int64)
    src = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
    leaves = np.array([i for i in range(len(parent)) if i + 1 == len(parent) or parent[i + 1] != i], np.int64)
    tokens = torch.arange(1, int(length.sum()) + 1) if tokens is None else tokens
    return PrefixForest(np.array(parent, np.int64), length, src, tokens, leaves,
                        np.ones(len(leaves), np.int64), np.zeros(len(leaves), np.int64))


forests = st.integers(1, 12).flatmap(lambda m: st.tuples(st.lists(st.integers(0, 20), min_size=m, max_size=m),
                                                         st.lists(st.integers(0, 4), min_size=m, max_size=m)))


def laid_out(spec, rows: int, slack: int | None = None):
    """(forest, layout) with the trees dealt round-robin into ``rows`` rows; ``slack`` padding tokens per row
    (default: rows - 1, so some rows fill exactly and others have a tail)."""
    forest = random_forest(*spec)
    roots = forest.roots()
    tokens = forest.tree_tokens()
    groups = [roots[i::rows] for i in range(rows)]
    row_len = max(int(tokens[i::rows].sum()) for i in range(rows)) + (rows - 1 if slack is None else slack)
    return forest, tree_layout(forest, groups, max(row_len, 1))


def op_args(forest, layout, *, id_dtype=torch.int64, labels: bool = False, device="cpu"):
    """The positional arguments of packkit::tree_pack for a layout."""
    ids = forest.tokens.to(id_dtype)
    lab = (ids * 3 + 1).to(torch.int32 if id_dtype == torch.int64 else torch.int64) if labels else None
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, np.int64)).to(device)  # noqa: E731
    return (ids.to(device), None if lab is None else lab.to(device), t(layout.src), t(layout.dst), t(layout.length),
            t(layout.pos), t(layout.end), t(layout.row_offsets), layout.num_rows, layout.row_len)


def make_case(seed: int, rows: int = 2):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 10))
    spec = (rng.integers(0, 20, m).tolist(), rng.integers(0, 5, m).tolist())
    return laid_out(spec, rows)
