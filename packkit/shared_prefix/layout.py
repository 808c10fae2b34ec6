"""Host-side layout of planned trees: where every node lands, what each token sees, which tokens score.

Everything here is computed from node lengths alone (numpy, O(nodes + scored tokens)); the device gets it
in one host-to-device copy per micro-batch and never sends anything back.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .tree import PrefixForest


class TreeLayout(NamedTuple):
    """Packed nodes in row order (arrays over packed nodes unless noted)."""

    num_rows: int
    row_len: int
    order: np.ndarray  # forest node behind each packed node
    src: np.ndarray  # offset in forest.tokens
    dst: np.ndarray  # flat output offset (row * row_len + offset in row)
    length: np.ndarray
    pos: np.ndarray  # position id of the node's first token
    end: np.ndarray  # row-relative end of the node's subtree
    depth: np.ndarray
    row_offsets: np.ndarray  # [num_rows + 1] CSR over packed nodes
    seq_positions: list  # seq_positions[s]: flat packed position of each token of sequence s
    max_path: int  # longest root-to-node token path (what a sliding window must cover)


def tree_layout(forest: PrefixForest, rows: list, row_len: int | None = None) -> TreeLayout:
    """Lay ``rows`` (lists of root nodes of ``forest``) out depth first; ``row_len`` defaults to the
    fullest row (one flat row of exactly the tree tokens when there is one row)."""
    csum = np.concatenate([[0], np.cumsum(forest.length)])
    sub_end = forest.subtree_end()
    ranges = [[np.arange(r, sub_end[r]) for r in np.asarray(row, np.int64)] for row in rows]
    row_nodes = [np.concatenate(rr).astype(np.int64) if rr else np.zeros(0, np.int64) for rr in ranges]
    used = np.array([int(forest.length[nodes].sum()) for nodes in row_nodes], np.int64)
    if row_len is None:
        row_len = int(used.max()) if len(used) else 0
    if len(used) and used.max() > row_len:
        r = int(np.argmax(used))
        raise ValueError(f"row {r} needs {int(used[r])} tokens, more than row_len={row_len}")
    num_rows = len(rows)
    order = np.concatenate(row_nodes) if row_nodes else np.zeros(0, np.int64)
    length = forest.length[order]
    counts = np.array([len(n) for n in row_nodes], np.int64)
    row_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    row_of = np.repeat(np.arange(num_rows, dtype=np.int64), counts)
    excl = np.concatenate([[0], np.cumsum(length)]).astype(np.int64)
    in_row = excl[:-1] - np.repeat(excl[row_offsets[:-1]], counts)
    dst = row_of * row_len + in_row
    end = in_row + (csum[sub_end[order]] - csum[order])
    depth_all = forest.depth()
    packed_of = np.full(forest.num_nodes, -1, np.int64)
    packed_of[order] = np.arange(len(order))
    seq_positions = []
    for node in forest.seq_node:
        path = []
        k = int(node)
        while k >= 0:
            path.append(packed_of[k])
            k = int(forest.parent[k])
        if min(path) < 0:
            raise ValueError("a sequence's tree is in no row of the plan")
        parts = [np.arange(dst[p], dst[p] + length[p]) for p in reversed(path)]
        seq_positions.append(np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64))
    pos = forest.position()
    return TreeLayout(num_rows, int(row_len), order, forest.src[order], dst.astype(np.int64), length,
                      pos[order], end.astype(np.int64), depth_all[order], row_offsets, seq_positions,
                      int((pos + forest.length).max()) if forest.num_nodes else 0)


class ScoreIndex(NamedTuple):
    """Where each scored token's log-prob comes from (host arrays over all scored tokens, sequence-major)."""

    pred: np.ndarray  # flat packed position whose logits predict the token
    target: np.ndarray  # flat packed position of the token itself
    valid: np.ndarray  # False for a first token with nothing before it (an empty prompt)
    counts: np.ndarray  # scored tokens per sequence
    width: int  # the padded form's width (max count)


def score_index(forest: PrefixForest, layout: TreeLayout) -> ScoreIndex:
    """Tokens ``score_start .. end`` of every sequence; token ``j`` is predicted at token ``j - 1``'s
    position, so a branch's first token is predicted by its prefix's last position, which all siblings share."""
    preds, targets, valid, counts = [], [], [], []
    for s, positions in enumerate(layout.seq_positions):
        start = int(forest.score_start[s])
        n = len(positions) - start
        counts.append(n)
        if n <= 0:
            continue
        j = np.arange(start, len(positions))
        targets.append(positions[j])
        preds.append(positions[np.maximum(j - 1, 0)])
        valid.append(j >= 1)
    cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa: E731
    counts = np.maximum(np.array(counts, np.int64), 0)
    return ScoreIndex(cat(preds, np.int64), cat(targets, np.int64), cat(valid, bool), counts,
                      int(counts.max()) if len(counts) else 0)
