"""``build_tree``: the prefix forest of any token sequences (multi-turn conversations, agent trajectories): their
longest shared token prefixes, multi-level, as a radix trie. The build is C++ (``csrc/planner/prefix_forest.cpp``:
the sequences inserted in input order, linear in their tokens); :func:`build_tree_reference` is the same forest
found in Python by sorting the sequences and comparing neighbours, kept as the reference the tests compare with.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .tree import PrefixForest, _refuse_negative, _score_from, _sequence, host_sequences

IGNORE = -100  # a label that is not scored (HF's ignore_index)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def build_tree(sequences, group_ids=None, *, score_from=None, labels=None, lengths=None) -> PrefixForest:
    """The prefix forest of ``sequences``: their longest shared token prefixes, multi-level.

    Args:
        sequences: token sequences (lists or tuples of ints, converted in one C pass; numpy arrays or CPU tensors),
            or one flat 1-D array / CPU tensor of all tokens with ``lengths`` (zero-copy when int64).
        group_ids: optional group of each sequence. Sequences share prefixes only within their group, and
            each group is one tree (a root holding the group's common prefix, possibly empty), so the
            planner keeps the group together. Without it, every set of sequences that shares a first token
            is one tree.
        score_from: optional first scored token of each sequence (e.g. the prompt length); default 1 (every
            token that has a predecessor).
        labels: optional per-token labels, one list per sequence (or flat, with ``lengths``), as HF's: ``-100``
            = not scored, else the token itself. An agent trajectory scores its assistant turns and not the tool
            output between them. Tokens that two sequences share (one node) must have the same labels in both,
            else ``ValueError`` naming both. Not with ``score_from`` (the labels say which tokens score).
        lengths: the sequence lengths when ``sequences`` (and ``labels``) are flat.

    Identical sequences end at the same node; a sequence that is a prefix of another ends at an inner node.
    Children keep the order in which their first sequence was given. The forest equals
    :func:`build_tree_reference`'s (tested); the build runs in C++ in time linear in the tokens.
    """
    flat, lens = host_sequences(sequences, lengths, "sequences")
    n = len(lens)
    groups = _group_ids(group_ids, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    flat_labels = None
    if labels is not None:
        if score_from is not None:
            raise ValueError("build_tree got labels and score_from: the labels say which tokens are scored (-100: "
                             "not scored); pass one of them")
        flat_labels = _scored_flags(labels, lengths, flat, lens, offsets)
    from .. import _planner

    raw = _planner.prefix_forest(flat, offsets, groups, flat_labels)
    first, second, at = (int(v) for v in raw["conflict"])
    if first >= 0:
        token = int(flat[offsets[first] + at])
        shown = [token if flat_labels[offsets[k] + at] else IGNORE for k in (first, second)]
        raise ValueError(f"sequences {first} and {second} share token {at} (one tree node) but their labels differ "
                         f"there ({shown[0]} vs {shown[1]}): a shared token is forwarded once and scored once, so the "
                         "labels of every sequence through it must agree")
    if flat_labels is not None:
        score = _first_scored(flat_labels, offsets, lens)
    else:
        score = _score_from(score_from, lens)
    seq_group = groups if groups is not None else raw["seq_root"]
    label_tensor = None
    if flat_labels is not None:
        label_tensor = torch.from_numpy(np.where(raw["scored"].astype(bool), raw["tokens"], IGNORE))
    return PrefixForest(raw["parent"], raw["length"], raw["src"], torch.from_numpy(raw["tokens"]), raw["seq_node"],
                        score, seq_group, label_tensor)


def _group_ids(group_ids, n: int):
    if group_ids is None:
        return None
    groups = np.asarray(group_ids)
    if groups.shape == (0,) == (n,):  # [] is float64 to numpy
        groups = groups.astype(np.int64)
    if groups.shape != (n,) or not np.issubdtype(groups.dtype, np.integer):
        raise ValueError(f"group_ids must be {n} integers (one per sequence), got {groups.dtype} {groups.shape}")
    return np.ascontiguousarray(groups, np.int64)


def _scored_flags(labels, lengths, flat: np.ndarray, lens: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """One uint8 flag per token of ``flat`` (1: scored): ``labels`` one list per sequence of its length (or flat, with
    ``lengths``), each label ``-100`` or the token itself. Label lists are read in one C pass, never copied to int64."""
    if lengths is None and (isinstance(labels, (str, bytes, torch.Tensor)) or not isinstance(labels, Sequence)):
        raise TypeError(f"labels must be a list of label sequences (one per sequence), got {type(labels).__name__}")
    if lengths is None and len(labels) != len(lens):
        raise ValueError(f"labels has {len(labels)} entries but there are {len(lens)} sequences: one label list per "
                         "sequence")
    from .. import _planner

    if lengths is None:
        flags = _planner.label_flags(labels, flat, offsets)
        if flags is not None:
            return flags
    lab, lab_lens = host_sequences(labels, lengths, "labels", token_ids=False)
    if len(lab_lens) != len(lens) or (lab_lens != lens).any():
        i = int(np.flatnonzero(lab_lens != lens)[0]) if len(lab_lens) == len(lens) else len(lens)
        have = int(lab_lens[i]) if i < len(lab_lens) else 0
        raise ValueError(f"labels[{i}] has {have} labels but sequences[{i}] has {int(lens[i]) if i < len(lens) else 0} "
                         "tokens: labels must be parallel to the tokens")
    scored = lab != IGNORE
    bad = np.flatnonzero(scored & (lab != flat))
    if len(bad):
        at = int(bad[0])
        i = int(np.searchsorted(offsets, at, side="right")) - 1
        k = at - int(offsets[i])
        raise ValueError(f"labels[{i}][{k}] is {int(lab[at])} but sequences[{i}][{k}] is token {int(flat[at])}: a "
                         "label is -100 (not scored) or the token itself")
    return scored.view(np.uint8)


def _first_scored(flags: np.ndarray, offsets: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Each sequence's first scored token (its length when none is), without a copy per token."""
    score = lens.copy()
    for s in range(len(lens)):
        piece = flags[offsets[s]:offsets[s + 1]]
        at = int(piece.argmax()) if len(piece) else 0
        if len(piece) and piece[at]:
            score[s] = at
    return score


def build_tree_reference(sequences, group_ids=None, *, score_from=None) -> PrefixForest:
    """The prefix forest of ``sequences`` (see :func:`build_tree`), found in Python by sorting the sequences and
    comparing neighbours: slow (it sorts tuples of whole sequences), kept as the reference :func:`build_tree` is
    tested against.

    Args:
        sequences: token sequences (lists, numpy arrays or 1-D tensors); compared token by token (no text).
        group_ids: optional group of each sequence. Sequences share prefixes only within their group, and
            each group is one tree (a root holding the group's common prefix, possibly empty), so the
            planner keeps the group together. Without it, every set of sequences that shares a first token
            is one tree.
        score_from: optional first scored token of each sequence (e.g. the prompt length); default 1 (every
            token that has a predecessor).

    Identical sequences end at the same node; a sequence that is a prefix of another ends at an inner node.
    Children keep the order in which their first sequence was given.
    """
    if isinstance(sequences, (str, bytes, torch.Tensor)) or not isinstance(sequences, Sequence):
        raise TypeError(f"sequences must be a list of token sequences, got {type(sequences).__name__}")
    n = len(sequences)
    seqs = []
    for i, s in enumerate(sequences):
        t = _sequence(s, f"sequences[{i}]")
        if t.device.type != "cpu":
            raise ValueError(f"sequences[{i}] is on {t.device}: build_tree compares tokens on the host (pass lists, "
                             "numpy or CPU tensors; reading a GPU tensor back would sync)")
        seqs.append(t.to(torch.int64).numpy())
        _refuse_negative(t, [t], lambda k: f"sequences[{i}]")
    if group_ids is None:
        groups = np.zeros(n, np.int64)
        grouped = False
    else:
        groups = np.asarray(group_ids)
        if groups.shape == (0,) == (n,):
            groups = groups.astype(np.int64)
        if groups.shape != (n,) or not np.issubdtype(groups.dtype, np.integer):
            raise ValueError(f"group_ids must be {n} integers (one per sequence), got {groups.dtype} {groups.shape}")
        groups = groups.astype(np.int64)
        grouped = True
    score = _score_from(score_from, np.array([len(s) for s in seqs], np.int64))

    # Sort (group, tokens); adjacent longest common prefixes then define the radix tree.
    order = sorted(range(n), key=lambda i: (int(groups[i]), tuple(seqs[i])))
    # Tree nodes: (depth at which the node ends, parent, first sequence index, min input index).
    node_end, node_parent, node_seq, node_first = [], [], [], []
    seq_node = np.zeros(n, np.int64)
    stack: list[int] = []  # path of open nodes (the last sequence's), deepest last

    def new_node(end, parent, seq):
        node_end.append(end)
        node_parent.append(parent)
        node_seq.append(seq)
        node_first.append(seq)
        return len(node_end) - 1

    prev = None
    for i in order:
        s = seqs[i]
        new_group = prev is None or groups[prev] != groups[i]
        if new_group:
            stack = []
            lcp = 0
            if grouped:
                stack.append(new_node(0, -1, i))  # the group's root; its depth grows below
        else:
            lcp = _common_prefix(seqs[prev], s)
        # Pop nodes that end beyond the shared prefix; split the one the prefix ends inside.
        last_popped = None
        while stack and node_end[stack[-1]] > lcp:
            last_popped = stack.pop()
        if not grouped and stack and node_end[stack[-1]] == 0 and len(s) > 0:
            stack = []  # an empty sequence is a tree of its own, not everyone's root
        parent_start = node_end[stack[-1]] if stack else 0
        if last_popped is not None and lcp > parent_start:
            # The shared prefix ends inside last_popped: split it at lcp.
            mid = new_node(lcp, node_parent[last_popped], node_seq[last_popped])
            node_first[mid] = node_first[last_popped]
            node_parent[last_popped] = mid
            stack.append(mid)
        elif grouped and not new_group and not stack:
            raise AssertionError("a grouped tree lost its root")
        if stack and node_end[stack[-1]] == len(s):
            seq_node[i] = stack[-1]  # s ends exactly at an existing node
            node_first[stack[-1]] = min(node_first[stack[-1]], i)
        else:
            leaf = new_node(len(s), stack[-1] if stack else -1, i)
            stack.append(leaf)
            seq_node[i] = leaf
        for k in stack:
            node_first[k] = min(node_first[k], i)
        prev = i

    m = len(node_end)
    children: list[list[int]] = [[] for _ in range(m)]
    for k in range(m):
        if node_parent[k] >= 0:
            children[node_parent[k]].append(k)
    # A group root is made empty; if no sequence ends there and it has one child, that child is the root.
    ends_here = np.zeros(m, bool)
    ends_here[seq_node] = True
    for k in range(m):
        if node_parent[k] < 0 and node_end[k] == 0 and not ends_here[k] and len(children[k]) == 1:
            node_parent[children[k][0]] = -1
            node_parent[k] = -2  # removed
    roots = [k for k in range(m) if node_parent[k] == -1]
    # Preorder with children by first input index (groups by their first sequence too).
    new_index = np.full(m, -1, np.int64)
    preorder = []
    todo = sorted(roots, key=lambda k: node_first[k])[::-1]
    while todo:
        k = todo.pop()
        new_index[k] = len(preorder)
        preorder.append(k)
        todo.extend(sorted(children[k], key=lambda c: node_first[c])[::-1])
    parent = np.array([-1 if node_parent[k] < 0 else new_index[node_parent[k]] for k in preorder], np.int64)
    start = np.array([0 if node_parent[k] < 0 else node_end[node_parent[k]] for k in preorder], np.int64)
    end = np.array([node_end[k] for k in preorder], np.int64)
    length = end - start
    pieces = [seqs[node_seq[k]][s:e] for k, s, e in zip(preorder, start, end)]
    tokens = torch.from_numpy(np.concatenate(pieces) if pieces else np.zeros(0, np.int64))
    src = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64) if m else np.zeros(0, np.int64)
    seq_group = groups if grouped else np.array([new_index[_root_of(node_parent, seq_node[i])] for i in range(n)],
                                                np.int64)
    return PrefixForest(parent, length, src, tokens, new_index[seq_node], score, seq_group)


def _root_of(node_parent, k) -> int:
    while node_parent[k] >= 0:
        k = node_parent[k]
    return k
