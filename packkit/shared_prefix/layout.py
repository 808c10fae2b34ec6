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
    seq_positions = SequencePositions(forest, order, dst, length, depth_all)
    pos = forest.position()
    return TreeLayout(num_rows, int(row_len), order, forest.src[order], dst.astype(np.int64), length,
                      pos[order], end.astype(np.int64), depth_all[order], row_offsets, seq_positions,
                      int((pos + forest.length).max()) if forest.num_nodes else 0)


class SequencePositions:
    """``seq_positions[s]``: the flat packed position of each token of sequence ``s`` (prefix included), computed on
    demand from the runs of its root-to-node path (one run per path node): O(nodes on the paths) memory, not one
    array per sequence of its whole length."""

    def __init__(self, forest: PrefixForest, order: np.ndarray, dst: np.ndarray, length: np.ndarray,
                 depth: np.ndarray):
        n = forest.num_sequences
        packed_of = np.full(forest.num_nodes, -1, np.int64)
        packed_of[order] = np.arange(len(order), dtype=np.int64)
        seqs, nodes = [], []
        cur, who = np.asarray(forest.seq_node, np.int64), np.arange(n, dtype=np.int64)
        while len(cur):  # one level up per pass, only the sequences whose path goes on
            seqs.append(who)
            nodes.append(cur)
            up = forest.parent[cur]
            keep = up >= 0
            cur, who = up[keep], who[keep]
        seq = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
        node = np.concatenate(nodes) if nodes else np.zeros(0, np.int64)
        packed = packed_of[node]
        if (packed < 0).any():
            raise ValueError("a sequence's tree is in no row of the plan")
        by = np.lexsort((depth[node], seq))  # sequence-major, root first
        self.seq, self.packed = seq[by], packed[by]
        self.dst, self.length = dst[self.packed], length[self.packed]
        self.offsets = np.zeros(n + 1, np.int64)  # runs of sequence s: offsets[s] .. offsets[s + 1]
        np.cumsum(np.bincount(self.seq, minlength=n), out=self.offsets[1:])
        run_end = np.cumsum(self.length)  # tokens before a run within its sequence
        self.before = run_end - self.length - np.repeat(
            np.concatenate([[0], run_end])[self.offsets[:-1]], np.diff(self.offsets))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, s: int) -> np.ndarray:
        lo, hi = self.offsets[s], self.offsets[s + 1]
        parts = [np.arange(d, d + n, dtype=np.int64) for d, n in zip(self.dst[lo:hi], self.length[lo:hi])]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class ScoreIndex(NamedTuple):
    """Where each scored token's log-prob comes from, as runs (host arrays over runs, sequence-major): run ``r`` scores
    ``count[r]`` consecutive tokens of sequence ``seq[r]``, columns ``col[r] ..`` of the padded form, packed at flat
    positions ``target[r] ..``; each is predicted by the position before it, except the run's first token, predicted
    at ``pred[r]`` (``-1``: a first token with nothing before it). Expanded per token on the device
    (:func:`expand_scores`) only when log-probs are asked for."""

    seq: np.ndarray
    col: np.ndarray
    target: np.ndarray
    pred: np.ndarray
    count: np.ndarray
    counts: np.ndarray  # scored tokens per sequence
    width: int  # the padded form's width (max count)

    @property
    def num_scored(self) -> int:
        return int(self.count.sum())


def score_index(forest: PrefixForest, layout: TreeLayout) -> ScoreIndex:
    """Tokens ``score_start .. end`` of every sequence; token ``j`` is predicted at token ``j - 1``'s
    position, so a branch's first token is predicted by its prefix's last position, which all siblings share."""
    paths = layout.seq_positions
    n = forest.num_sequences
    lens = forest.sequence_lengths() if n else np.zeros(0, np.int64)
    start = np.asarray(forest.score_start, np.int64)
    counts = np.maximum(lens - start, 0)
    run_seq, before, length, dst = paths.seq, paths.before, paths.length, paths.dst
    first_run = paths.offsets[:-1][run_seq]
    # The last packed position before each run in its sequence (-1: none), skipping empty runs.
    idx = np.arange(len(run_seq), dtype=np.int64)
    last_nonempty = np.maximum.accumulate(np.where(length > 0, idx, -1)) if len(idx) else idx
    prev = np.concatenate([[-1], last_nonempty[:-1]]) if len(idx) else idx
    ok = prev >= first_run
    prev_pos = np.where(ok, dst[np.maximum(prev, 0)] + length[np.maximum(prev, 0)] - 1, -1)
    ss = start[run_seq]
    lo = np.maximum(before, ss)
    hi = before + length
    keep = hi > lo
    lo, hi, r = lo[keep], hi[keep], idx[keep]
    target = dst[r] + (lo - before[r])
    pred = np.where(lo == before[r], prev_pos[r], target - 1)
    return ScoreIndex(run_seq[r], lo - ss[r], target, pred, hi - lo, counts, int(counts.max()) if n else 0)


def expand_scores(score: ScoreIndex, device, labels=None) -> dict:
    """Per scored token, on ``device``: ``pred``, ``target``, ``seq``, ``col`` (int64) and ``valid`` (bool: has a
    predecessor and, when ``labels`` (the packed labels, flat) are given, is not labelled -100)."""
    import torch

    from ..packing.tensors import host_tensor, to_device

    runs = len(score.seq)
    meta = to_device(host_tensor(np.concatenate([score.seq, score.col, score.target, score.pred, score.count])
                                 .astype(np.int64)), device)
    seq, col, target, pred, count = (meta[i * runs:(i + 1) * runs] for i in range(5))
    total = score.num_scored
    run = torch.repeat_interleave(torch.arange(runs, device=device), count, output_size=total)
    first = torch.cumsum(count, 0) - count
    k = torch.arange(total, device=device) - first[run]
    tgt = target[run] + k
    prd = torch.where(k == 0, pred[run], tgt - 1)
    valid = prd >= 0
    prd = torch.where(valid, prd, tgt)
    if labels is not None:
        valid = valid & (labels.reshape(-1).index_select(0, tgt) != -100)
    return {"pred": prd, "target": tgt, "seq": seq[run], "col": col[run] + k, "valid": valid}
