"""Prefix forests: sequences that share token prefixes, stored once per shared prefix.

A :class:`PrefixForest` holds its nodes in preorder (a node, then its children's subtrees), so every
node's subtree is a contiguous range of nodes and, once packed, of tokens. Node ``i`` owns the tokens
``tokens[src[i] : src[i] + length[i]]``; a sequence is the concatenation of the nodes on its root-to-node
path. Two constructors: :func:`groups_forest` (GRPO groups and DPO pairs: one prompt, its completions) and
:func:`build_tree` (the longest shared token prefixes of any sequences, multi-level, found by comparing
tokens).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from ..packing.sequences import flatten_sequences


class PrefixForest(NamedTuple):
    """Nodes in preorder (``parent[i] < i``; a subtree is a contiguous node range).

    Attributes:
        parent: int64 ``[M]``, ``-1`` for a root.
        length: int64 ``[M]`` tokens of each node (``0`` is valid: an empty prompt).
        src: int64 ``[M]``: where the node's tokens start in ``tokens``.
        tokens: 1-D tensor (host) holding every node's tokens once.
        seq_node: int64 ``[N]``: the node at which sequence ``s`` ends.
        score_start: int64 ``[N]``: the first token of sequence ``s`` whose log-prob is asked for (a
            completion's first token; ``completion_logprobs`` returns tokens ``score_start .. end``).
        seq_group: int64 ``[N]``: the group (tree) each sequence came from, as the caller numbered it.
        labels: optional 1-D tensor parallel to ``tokens`` (per-token training labels), or None.
    """

    parent: np.ndarray
    length: np.ndarray
    src: np.ndarray
    tokens: torch.Tensor
    seq_node: np.ndarray
    score_start: np.ndarray
    seq_group: np.ndarray
    labels: Optional[torch.Tensor] = None

    @property
    def num_nodes(self) -> int:
        return len(self.parent)

    @property
    def num_sequences(self) -> int:
        return len(self.seq_node)

    def depth(self) -> np.ndarray:
        depth = np.zeros(self.num_nodes, np.int64)
        for i in range(self.num_nodes):  # preorder: the parent is already done
            p = self.parent[i]
            depth[i] = 0 if p < 0 else depth[p] + 1
        return depth

    def position(self) -> np.ndarray:
        """Position id of each node's first token: the tokens of its ancestors."""
        pos = np.zeros(self.num_nodes, np.int64)
        for i in range(self.num_nodes):
            p = self.parent[i]
            if p >= 0:
                pos[i] = pos[p] + self.length[p]
        return pos

    def subtree_end(self) -> np.ndarray:
        """One past the last node of each node's subtree (preorder)."""
        m = self.num_nodes
        end = np.arange(1, m + 1, dtype=np.int64)
        for i in range(m - 1, -1, -1):  # children come after parents: fold ends upwards
            p = self.parent[i]
            if p >= 0:
                end[p] = max(end[p], end[i])
        return end

    def roots(self) -> np.ndarray:
        return np.flatnonzero(self.parent < 0)

    def sequence_lengths(self) -> np.ndarray:
        return self.position()[self.seq_node] + self.length[self.seq_node]

    def tree_tokens(self) -> np.ndarray:
        """Tokens of each tree (in ``roots()`` order): what one packed copy of the tree costs in a row."""
        roots = self.roots()
        csum = np.concatenate([[0], np.cumsum(self.length)])
        return csum[self.subtree_end()[roots]] - csum[roots]

    def sequence_tokens(self, s: int) -> torch.Tensor:
        path = []
        node = int(self.seq_node[s])
        while node >= 0:
            path.append(node)
            node = int(self.parent[node])
        return torch.cat([self.tokens[self.src[n]:self.src[n] + self.length[n]] for n in reversed(path)])


TOKEN_DTYPES = (torch.int64, torch.int32)


def _sequence(value, name: str, *, token_ids: bool = True) -> torch.Tensor:
    """One sequence as a 1-D integer tensor. Token ids (``token_ids=True``) on the host must be >= 0; a GPU
    tensor is not read here (its values are checked on the device: ``info.status``). Labels may be negative
    (-100). Bools and floats are refused, never cast."""
    if isinstance(value, (list, tuple)) and bool in set(map(type, value)):
        raise TypeError(f"{name} holds a bool; token ids must be ints")
    flat, _ = flatten_sequences([value], name=name)
    if flat.is_floating_point() or flat.is_complex() or flat.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {flat.dtype}")
    if flat.dim() != 1:
        raise ValueError(f"{name} must be a 1-D token sequence, got shape {tuple(flat.shape)}")
    if flat.dtype not in TOKEN_DTYPES:  # uint8 / int16 ...: exact in int64, which the pack op reads
        flat = flat.to(torch.int64)
    if token_ids and flat.device.type == "cpu" and flat.numel():
        low = int(flat.min())
        if low < 0:
            i = int(torch.nonzero(flat < 0)[0, 0])
            raise ValueError(f"{name}[{i}] is {low}: token ids index the embedding and must be >= 0")
    return flat


def groups_forest(prompts, completions, labels=None) -> PrefixForest:
    """One tree per group: the prompt (root) and each completion as its child, in the order given.

    ``labels`` (optional) is parallel to ``completions``: per-token labels of each completion (prompts get
    ``-100``)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token sequences (one per group), got {type(prompts).__name__}")
    if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
        raise TypeError(f"completions must be a list (one per group) of lists of token sequences, got "
                        f"{type(completions).__name__}")
    if len(prompts) != len(completions):
        raise ValueError(f"prompts has {len(prompts)} groups but completions has {len(completions)}; "
                         "completions[g] must list the completions of prompts[g]")
    if labels is not None:
        if isinstance(labels, (str, bytes, torch.Tensor)) or not isinstance(labels, Sequence):
            raise TypeError(f"labels must be None or a list (one per group) of lists of label sequences, got "
                            f"{type(labels).__name__}")
        if len(labels) != len(completions):
            raise ValueError(f"labels has {len(labels)} groups but completions has {len(completions)}")
    pieces, label_pieces, parent, length, score_start, seq_node, seq_group = [], [], [], [], [], [], []
    for g, (prompt, group) in enumerate(zip(prompts, completions)):
        p = _sequence(prompt, f"prompts[{g}]")
        if isinstance(group, (str, bytes, torch.Tensor)) or not isinstance(group, Sequence):
            raise TypeError(f"completions[{g}] must be a list of token sequences, got {type(group).__name__}")
        if len(group) == 0:
            raise ValueError(f"group {g} has no completions; a group needs at least one (G >= 1)")
        if labels is not None and (isinstance(labels[g], (str, bytes, torch.Tensor))
                                   or not isinstance(labels[g], Sequence)):
            raise TypeError(f"labels[{g}] must be a list of label sequences, got {type(labels[g]).__name__}")
        if labels is not None and len(labels[g]) != len(group):
            raise ValueError(f"labels[{g}] has {len(labels[g])} entries but group {g} has {len(group)} completions")
        root = len(parent)
        parent.append(-1)
        length.append(len(p))
        pieces.append(p)
        label_pieces.append(torch.full((len(p),), -100, dtype=torch.int64))
        for j, completion in enumerate(group):
            c = _sequence(completion, f"completions[{g}][{j}]")
            seq_node.append(len(parent))
            parent.append(root)
            length.append(len(c))
            pieces.append(c)
            score_start.append(len(p))
            seq_group.append(g)
            if labels is not None:
                lab = _sequence(labels[g][j], f"labels[{g}][{j}]", token_ids=False)
                if lab.shape != c.shape:
                    raise ValueError(f"labels[{g}][{j}] has {lab.shape[0]} tokens but completions[{g}][{j}] has "
                                     f"{c.shape[0]}")
                label_pieces.append(lab.to(torch.int64))
            else:
                label_pieces.append(c.to(torch.int64))
    devices = {t.device for t in pieces}
    if len(devices) > 1:
        raise ValueError(f"the prompts and completions are on different devices ({sorted(map(str, devices))}); "
                         "pass them all on one device (host lists are best: the pack copies them once)")
    dtypes = {t.dtype for t in pieces}
    if not pieces:  # no groups: an empty forest, packed as an empty batch (as pack_tree([]) and pack_sequences([]))
        tokens = torch.zeros(0, dtype=torch.int64)
    else:
        tokens = torch.cat([t.to(torch.int64) for t in pieces]) if len(dtypes) > 1 else torch.cat(pieces)
    length = np.array(length, np.int64)
    src = (np.cumsum(length) - length).astype(np.int64)
    return PrefixForest(np.array(parent, np.int64), length, src, tokens, np.array(seq_node, np.int64),
                        np.array(score_start, np.int64), np.array(seq_group, np.int64),
                        torch.cat(label_pieces) if labels is not None and label_pieces else
                        (torch.zeros(0, dtype=torch.int64) if labels is not None else None))


def _score_from(score_from, lens: np.ndarray) -> np.ndarray:
    """The first scored token of each sequence: default 1; else one int per sequence within it."""
    n = len(lens)
    if score_from is None:  # every token with a predecessor (an empty sequence scores nothing)
        return np.minimum(lens, 1).astype(np.int64)
    score = np.asarray(score_from)
    if score.shape != (n,) or not np.issubdtype(score.dtype, np.integer):
        raise ValueError(f"score_from must be {n} integers (one per sequence), got {score.dtype} {score.shape}")
    bad = np.flatnonzero((score < 0) | (score > lens))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"score_from[{i}] = {int(score[i])} is outside sequence {i} of {int(lens[i])} tokens")
    return score.astype(np.int64)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def build_tree(sequences, group_ids=None, *, score_from=None) -> PrefixForest:
    """The prefix forest of ``sequences``: their longest shared token prefixes, multi-level.

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
    if group_ids is None:
        groups = np.zeros(n, np.int64)
        grouped = False
    else:
        groups = np.asarray(group_ids)
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


def sequences_forest(sequences, score_from=None) -> PrefixForest:
    """Every sequence its own one-node tree: plain packing in the forest form (nothing shared), e.g. the
    baseline a shared-prefix batch is compared with."""
    if isinstance(sequences, (str, bytes, torch.Tensor)) or not isinstance(sequences, Sequence):
        raise TypeError(f"sequences must be a list of token sequences, got {type(sequences).__name__}")
    pieces = [_sequence(s, f"sequences[{i}]") for i, s in enumerate(sequences)]
    if len({t.device for t in pieces}) > 1:
        raise ValueError("sequences are on different devices; pass them all on one device")
    if len({t.dtype for t in pieces}) > 1:
        pieces = [t.to(torch.int64) for t in pieces]
    flat = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
    lengths = np.array([len(t) for t in pieces], np.int64)
    n = len(lengths)
    score = _score_from(score_from, lengths)
    src = (np.cumsum(lengths) - lengths).astype(np.int64)
    return PrefixForest(np.full(n, -1, np.int64), lengths.astype(np.int64), src, flat, np.arange(n, dtype=np.int64),
                        score, np.arange(n, dtype=np.int64))
