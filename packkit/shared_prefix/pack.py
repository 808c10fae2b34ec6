"""``pack_groups`` / ``pack_tree``: planned trees -> a model batch, packed in one ``packkit::tree_pack`` launch.

The host computes every size and offset from node lengths (``layout.py``); the device gets one copy of the
node metadata and of the source tokens, then one op builds ``input_ids``, ``position_ids``, the per-token
``subtree_end`` the attention masks read and the ``cu_seqlens`` of every document. Nothing is read back.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from ..packing.sequences import _backend_for
from ..packing.tensors import host_tensor, to_device
from .attention_meta import ATTENTION_PATHS, SharedPrefixAttention
from .layout import ScoreIndex, TreeLayout, score_index, tree_layout
from .planning import TreePlan, plan_trees
from .tree import PrefixForest, build_tree, groups_forest


class SharedPrefixInfo(NamedTuple):
    """Where every token came from; what :func:`completion_logprobs` and the unpack helpers read.

    Attributes:
        forest: the planned forest (after splits); ``forest.seq_node[s]`` is sequence ``s``'s last node.
        layout: the packed node layout (host arrays); ``layout.seq_positions[s]`` are the flat packed
            positions of sequence ``s``'s tokens (prefix included).
        score: the scored tokens (host), sequence-major.
        pred, target, seq, col: device int64 tensors over scored tokens: predicting position, token position,
            sequence and column in the padded ``[N, R]`` form; ``valid``: bool (False: a first token with
            nothing before it).
        plan: the :class:`TreePlan` (rows, split and truncation report).
        labels: packed per-token labels ``[rows, row_len]`` when labels were given (``-100`` on prompts and
            padding), else None.
        tokens_forwarded, tokens_unshared: tokens in the rows (no padding) vs the same sequences packed
            without sharing.
        input_ids: the packed ``input_ids`` (the log-prob targets).
    """

    forest: PrefixForest
    layout: TreeLayout
    score: ScoreIndex
    pred: torch.Tensor
    target: torch.Tensor
    seq: torch.Tensor
    col: torch.Tensor
    valid: torch.Tensor
    plan: TreePlan
    labels: Optional[torch.Tensor]
    tokens_forwarded: int
    tokens_unshared: int
    input_ids: torch.Tensor

    @property
    def num_sequences(self) -> int:
        return self.forest.num_sequences


def _tree_pack_op(backend: str):
    if backend == "triton":
        from ..triton_kernels import tree_pack as _triton  # noqa: F401  (registers packkit::triton_tree_pack)

        return torch.ops.packkit.triton_tree_pack
    return torch.ops.packkit.tree_pack


def pack_forest(tree_plan: TreePlan, *, device=None, backend: str = "auto", attention: str = "auto",
                pad_id: int = 0) -> tuple[dict, SharedPrefixInfo]:
    """Pack a :class:`TreePlan` (see :func:`pack_groups`)."""
    if attention not in ATTENTION_PATHS:
        raise ValueError(f"unknown attention {attention!r}; allowed: {', '.join(ATTENTION_PATHS)}")
    forest = tree_plan.forest
    capacity = None if tree_plan.plan is None else tree_plan.plan.capacity
    layout = tree_layout(forest, tree_plan.rows, capacity)
    device = torch.device(device) if device is not None else forest.tokens.device
    backend = _backend_for(device, backend)
    m = len(layout.order)
    host = np.concatenate([layout.src, layout.dst, layout.length, layout.pos, layout.end, layout.row_offsets])
    meta = to_device(host_tensor(host.astype(np.int64)), device)
    src, dst, length, pos, end = (meta[i * m:(i + 1) * m] for i in range(5))
    row_offsets = meta[5 * m:]
    tokens = to_device(forest.tokens, device)
    labels = None if forest.labels is None else to_device(forest.labels, device)
    ids, packed_labels, position_ids, node_idx, subtree_end, cu_seqlens = _tree_pack_op(backend)(
        tokens, labels, src, dst, length, pos, end, row_offsets, layout.num_rows, layout.row_len, pad_id, -100)
    score = score_index(forest, layout)
    seq = np.repeat(np.arange(forest.num_sequences, dtype=np.int64), score.counts)
    first = np.concatenate([[0], np.cumsum(score.counts)[:-1]]) if len(score.counts) else np.zeros(0, np.int64)
    col = np.arange(len(seq), dtype=np.int64) - np.repeat(first, score.counts)
    index = to_device(host_tensor(np.concatenate([score.pred, score.target, seq, col, score.valid.astype(np.int64)])),
                      device)
    k = len(seq)
    attn = SharedPrefixAttention(layout, subtree_end, cu_seqlens, node_idx, attention, position_ids=position_ids)
    batch = {"input_ids": ids, "position_ids": position_ids, "shared_prefix": attn}
    unshared = int(forest.sequence_lengths().sum())
    info = SharedPrefixInfo(forest, layout, score, index[:k], index[k:2 * k], index[2 * k:3 * k], index[3 * k:4 * k],
                            index[4 * k:] != 0, tree_plan, packed_labels if labels is not None else None,
                            int(layout.length.sum()), unshared, ids)
    return batch, info


def pack_groups(prompts, completions, *, capacity: Optional[int] = None, labels=None, device=None,
                backend: str = "auto", attention: str = "auto", overlong: str = "error", algorithm: str = "obfd",
                dp_size: int = 1, cost="tokens", pad_id: int = 0) -> tuple[dict, SharedPrefixInfo]:
    """GRPO groups / DPO pairs -> one shared-prefix batch: each prompt once, then its completions.

    Args:
        prompts: ``prompts[g]``: group ``g``'s prompt (token list, numpy array or 1-D tensor; may be empty).
        completions: ``completions[g]``: the list of group ``g``'s completions (each may be empty; G >= 1).
        capacity: tokens per row. None: one flat row ``[1, T]`` of exactly the tree tokens. Given: rows of
            ``capacity`` (``[R, capacity]``, padding at each row's end) planned over whole groups; a group over
            capacity is split into sub-groups that each re-carry the prompt (``info.plan.report``).
        labels: optional, parallel to ``completions``: per-token labels of each completion (``info.labels``).
        device, backend: where and with which kernels to pack (``"auto"``, ``"cpu"``, ``"cuda"``, ``"triton"``).
        attention: the attention path the batch asks for: ``"auto"`` (CUDA fp16/bf16: two-pass flash varlen;
            CUDA fp32: FlexAttention; CPU: the two-pass math), ``"varlen"``, ``"flex"`` or ``"dense"``.
        overlong: a prompt + one completion over ``capacity``: ``"error"`` or ``"truncate"`` (reported).
        algorithm, dp_size, cost: the row planner's (:func:`packkit.plan`), over trees.

    Returns ``(batch, info)``: ``batch`` has ``input_ids`` and ``position_ids`` ``[R, S]`` (a completion's
    positions continue from its prompt's length, exactly as it would have alone) and ``shared_prefix`` (the
    attention metadata); call the model as ``model(**batch, use_cache=False)`` after
    ``model.set_attn_implementation(packkit.shared_prefix.register_attention())``. ``info`` feeds
    :func:`completion_logprobs`.
    """
    forest = groups_forest(prompts, completions, labels)
    tree_plan = plan_trees(forest, capacity, algorithm=algorithm, dp_size=dp_size, cost=cost, overlong=overlong)
    return pack_forest(tree_plan, device=device, backend=backend, attention=attention, pad_id=pad_id)


def pack_tree(sequences, group_ids=None, *, score_from=None, capacity: Optional[int] = None, device=None,
              backend: str = "auto", attention: str = "auto", overlong: str = "error", algorithm: str = "obfd",
              dp_size: int = 1, cost="tokens", pad_id: int = 0) -> tuple[dict, SharedPrefixInfo]:
    """Any sequences (multi-turn conversations, agent trajectories) -> their prefix forest
    (:func:`build_tree`), packed depth first like :func:`pack_groups`. A ``PrefixForest`` may be passed
    instead of sequences."""
    forest = sequences if isinstance(sequences, PrefixForest) else build_tree(sequences, group_ids,
                                                                              score_from=score_from)
    tree_plan = plan_trees(forest, capacity, algorithm=algorithm, dp_size=dp_size, cost=cost, overlong=overlong)
    return pack_forest(tree_plan, device=device, backend=backend, attention=attention, pad_id=pad_id)
