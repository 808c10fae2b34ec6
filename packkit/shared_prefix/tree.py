"""Prefix forests: sequences that share token prefixes, stored once per shared prefix.

A :class:`PrefixForest` holds its nodes in preorder (a node, then its children's subtrees), so every
node's subtree is a contiguous range of nodes and, once packed, of tokens. Node ``i`` owns the tokens
``tokens[src[i] : src[i] + length[i]]``; a sequence is the concatenation of the nodes on its root-to-node
path. Two constructors: :func:`groups_forest` (GRPO groups and DPO pairs: one prompt, its completions) and
:func:`build_tree` (``radix.py``: the longest shared token prefixes of any sequences, multi-level, found by
comparing tokens).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from ..packing.checks import check_uint64_ids, int64_message, outside_int64, refuse_meta
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

    def _metrics(self) -> tuple:
        """(depth, position, subtree_end) of every node, in one C++ pass (``packkit._planner.forest_metrics``)."""
        from .. import _planner

        return _planner.forest_metrics(self.parent, self.length)

    def depth(self) -> np.ndarray:
        return self._metrics()[0]

    def position(self) -> np.ndarray:
        """Position id of each node's first token: the tokens of its ancestors."""
        return self._metrics()[1]

    def subtree_end(self) -> np.ndarray:
        """One past the last node of each node's subtree (preorder)."""
        return self._metrics()[2]

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


def _sequence(value, name: str) -> torch.Tensor:
    """One sequence as a 1-D integer tensor (int32 kept, narrower ints widened to int64); bools and floats
    are refused, never cast. Values are checked by :func:`_refuse_negative` (token ids, not labels)."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") \
            or (isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0):
        raise TypeError(f"{name} must be a token sequence (a list, numpy array or 1-D tensor of ints), got "
                        f"{type(value).__name__} {value!r:.40}")
    if isinstance(value, (list, tuple)) and bool in set(map(type, value)):
        raise TypeError(f"{name} holds a bool; token ids must be ints")
    refuse_meta(value, name)
    try:
        flat, _ = flatten_sequences([value], name=name)
    except ValueError:
        big = outside_int64([value])  # flatten named it name[0][k]: one sequence here
        if big:
            raise ValueError(int64_message(f"{name}[{big[1]}]", *big[2:])) from None
        raise
    if flat.is_floating_point() or flat.is_complex() or flat.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {flat.dtype}")
    if flat.dim() != 1:
        raise ValueError(f"{name} must be a 1-D token sequence, got shape {tuple(flat.shape)}")
    if flat.dtype not in TOKEN_DTYPES:  # uint8 / int16 ...: exact in int64, which the pack op reads
        flat = flat.to(torch.int64)
    return flat


def _refuse_negative(tokens: torch.Tensor, pieces: list, name_of) -> None:
    """Token ids index the embedding: refuse a negative one on the host, naming ``name_of(k)[i]`` of the piece it is
    in. One vectorised pass over all tokens (numpy: torch's int64 min is slower); a GPU tensor is not read back
    (pack_forest checks it on the device: ``info.status``)."""
    if tokens.device.type != "cpu" or tokens.numel() == 0 or int(tokens.numpy().min()) >= 0:
        return
    for k, piece in enumerate(pieces):
        if piece.numel() and int(piece.min()) < 0:
            i = int(torch.nonzero(piece < 0)[0, 0])
            raise ValueError(f"{name_of(k)}[{i}] is {int(piece[i])}: token ids index the embedding and must be >= 0")


def host_sequences(sequences, lengths=None, name: str = "sequences", *, token_ids: bool = True) -> tuple:
    """``(flat int64 numpy, int64 lengths)`` of host token sequences, converted once: lists / tuples of ints in one C
    pass (``packkit._planner.flatten_token_lists``: a bool or a float refused, naming ``name[i][k]``), numpy arrays or
    CPU tensors per item, or a flat 1-D array / tensor with ``lengths`` (zero-copy when it is int64). With
    ``token_ids`` a negative value is refused, naming it (labels may be negative). A GPU tensor is refused: the
    tree is built on the host."""
    if lengths is not None:
        if isinstance(sequences, torch.Tensor):
            refuse_meta(sequences, name)
            if sequences.device.type != "cpu":
                raise ValueError(f"{name} is on {sequences.device}: the tree is built on the host (reading a GPU "
                                 "tensor back would sync); pass host tokens")
            sequences = sequences.numpy()
        flat = check_uint64_ids(np.asarray(sequences), name)
        if flat.ndim != 1:
            raise ValueError(f"{name}: with lengths=, pass all tokens as one flat 1-D array, got shape {flat.shape}")
        if flat.size and flat.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integer token ids, got dtype {flat.dtype}")
        flat = np.ascontiguousarray(flat, np.int64)
        lens = np.asarray(lengths)
        if lens.ndim != 1 or (lens.size and lens.dtype.kind not in "iu"):
            raise ValueError(f"lengths must be a 1-D array of ints (one per sequence), got {lens.dtype} {lens.shape}")
        lens = lens.astype(np.int64)
        if len(lens) and int(lens.min()) < 0:
            i = int(np.argmin(lens))
            raise ValueError(f"lengths[{i}] is {int(lens[i])}: lengths must be >= 0")
        if int(lens.sum()) != len(flat):
            raise ValueError(f"lengths sum to {int(lens.sum())} but {name} has {len(flat)} tokens")
        if token_ids and len(flat) and int(flat.min()) < 0:
            at = int(np.flatnonzero(flat < 0)[0])
            i = int(np.searchsorted(np.cumsum(lens), at, side="right"))
            raise ValueError(f"{name}[{at}] (sequence {i}) is {int(flat[at])}: token ids index the embedding and "
                             "must be >= 0")
        return flat, lens
    if isinstance(sequences, (str, bytes, torch.Tensor)) or not isinstance(sequences, Sequence):
        raise TypeError(f"{name} must be a list of token sequences, got {type(sequences).__name__}")
    from .. import _planner

    fast = _planner.flatten_token_lists(sequences, name, token_ids)
    if fast is not None:
        return fast
    pieces = []
    for i, item in enumerate(sequences):
        t = _sequence(item, f"{name}[{i}]")
        if t.device.type != "cpu":
            raise ValueError(f"{name}[{i}] is on {t.device}: the tree is built on the host (pass lists, numpy or "
                             "CPU tensors; reading a GPU tensor back would sync)")
        pieces.append(t.numpy())
    flat = np.concatenate(pieces).astype(np.int64, copy=False) if pieces else np.zeros(0, np.int64)
    lens = np.array([len(t) for t in pieces], np.int64)
    if token_ids and len(flat) and int(flat.min()) < 0:
        at = int(np.flatnonzero(flat < 0)[0])
        i = int(np.searchsorted(np.cumsum(lens), at, side="right"))
        k = at - int(np.cumsum(lens)[i] - lens[i])
        raise ValueError(f"{name}[{i}][{k}] is {int(flat[at])}: token ids index the embedding and must be >= 0")
    return flat, lens


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
    if labels is None:
        fast = _groups_forest_from_lists(prompts, completions)
        if fast is not None:
            return fast
    pieces, label_pieces, parent, length, score_start, seq_node, seq_group, names = [], [], [], [], [], [], [], []
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
        names.append(f"prompts[{g}]")
        label_pieces.append(torch.full((len(p),), -100, dtype=torch.int64))
        for j, completion in enumerate(group):
            c = _sequence(completion, f"completions[{g}][{j}]")
            seq_node.append(len(parent))
            parent.append(root)
            length.append(len(c))
            pieces.append(c)
            names.append(f"completions[{g}][{j}]")
            score_start.append(len(p))
            seq_group.append(g)
            if labels is not None:
                lab = _sequence(labels[g][j], f"labels[{g}][{j}]")  # labels may be negative (-100)
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
    _refuse_negative(tokens, pieces, lambda k: names[k])
    length = np.array(length, np.int64)
    src = (np.cumsum(length) - length).astype(np.int64)
    return PrefixForest(np.array(parent, np.int64), length, src, tokens, np.array(seq_node, np.int64),
                        np.array(score_start, np.int64), np.array(seq_group, np.int64),
                        torch.cat(label_pieces) if labels is not None and label_pieces else
                        (torch.zeros(0, dtype=torch.int64) if labels is not None else None))


def _groups_forest_from_lists(prompts, completions):
    """:func:`groups_forest` when every prompt and completion is a host list / tuple of ints: each list converted
    once, in C (``flatten_token_lists``), the node arrays built per group; None when something else is given (the
    general path handles arrays, tensors and every error of shape)."""
    from .. import _planner

    if not isinstance(prompts, (list, tuple)) or not isinstance(completions, (list, tuple)):
        return None
    if any(not isinstance(group, (list, tuple)) or len(group) == 0 for group in completions):
        return None
    converted = _planner.flatten_token_lists(prompts, "prompts", True)
    if converted is None:
        return None
    p_flat, p_lens = converted
    groups = []
    for g, group in enumerate(completions):
        c = _planner.flatten_token_lists(group, f"completions[{g}]", True)
        if c is None:
            return None
        groups.append(c)
    sizes = np.array([len(c_lens) for _, c_lens in groups], np.int64)
    p_off = np.concatenate([[0], np.cumsum(p_lens)])
    pieces, length = [], []
    for g, (c_flat, c_lens) in enumerate(groups):
        pieces.append(p_flat[p_off[g]:p_off[g + 1]])
        pieces.append(c_flat)
        length.append(p_lens[g:g + 1])
        length.append(c_lens)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    length = np.concatenate(length) if length else np.zeros(0, np.int64)
    num_groups = len(groups)
    root = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]]).astype(np.int64) if num_groups else np.zeros(0, np.int64)
    parent = np.repeat(root, sizes + 1)
    parent[root] = -1
    is_child = parent >= 0
    seq_node = np.flatnonzero(is_child).astype(np.int64)
    seq_group = np.repeat(np.arange(num_groups, dtype=np.int64), sizes)
    src = (np.cumsum(length) - length).astype(np.int64)
    return PrefixForest(parent.astype(np.int64), length.astype(np.int64), src, torch.from_numpy(tokens), seq_node,
                        p_lens[seq_group].astype(np.int64), seq_group)


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
    _refuse_negative(flat, pieces, lambda k: f"sequences[{k}]")
    lengths = np.array([len(t) for t in pieces], np.int64)
    n = len(lengths)
    score = _score_from(score_from, lengths)
    src = (np.cumsum(lengths) - lengths).astype(np.int64)
    return PrefixForest(np.full(n, -1, np.int64), lengths.astype(np.int64), src, flat, np.arange(n, dtype=np.int64),
                        score, np.arange(n, dtype=np.int64))
