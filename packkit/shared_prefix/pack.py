"""``pack_groups`` / ``pack_tree``: planned trees -> a model batch, packed in one ``packkit::tree_pack`` launch.

The host computes every size and offset from node lengths (``layout.py``); the device gets one copy of the
node metadata and of the source tokens, then one op builds ``input_ids``, ``position_ids``, the per-token
``subtree_end`` the attention masks read and the ``cu_seqlens`` of every document. Nothing is read back.
"""
from __future__ import annotations

import numbers

from typing import NamedTuple, Optional

import numpy as np
import torch

from ..packing.backend_check import HOST, on_host
from ..packing.sequences import BACKENDS, _backend_for
from ..packing.tensors import host_tensor, to_device
from .attention_meta import ATTENTION_PATHS, SharedPrefixAttention
from .checks import check_allocation, check_choice, check_device, check_forest, check_pad_id, check_plan_args
from .layout import ScoreIndex, TreeLayout, expand_scores, score_index, tree_layout
from .planning import TreePlan, plan_trees
from .radix import build_tree
from .tree import PrefixForest, groups_forest
from .vision import VisionReport, check_text_tokens, group_sources, split_prompts, vision_batch

NEGATIVE_TOKEN = 4  # the status bit (checks.STATUS_ERRORS) of a negative token id found on the device


class SharedPrefixInfo(NamedTuple):
    """Where every token came from; what :func:`completion_logprobs` and the unpack helpers read.

    Attributes:
        forest: the planned forest (after splits); ``forest.seq_node[s]`` is sequence ``s``'s last node.
        layout: the packed node layout (host arrays); ``layout.seq_positions[s]`` are the flat packed
            positions of sequence ``s``'s tokens (prefix included).
        score: the scored tokens (host), sequence-major.
        index: the scored tokens on the device (:class:`ScoredTokens`, expanded from ``score``'s runs the first
            time they are read): ``info.pred``, ``info.target``, ``info.seq``, ``info.col`` are int64 tensors over
            scored tokens (predicting position, token position, sequence and column in the padded ``[N, R]`` form),
            ``info.valid`` bool (False: a first token with nothing before it, or a token labelled -100).
        plan: the :class:`TreePlan` (rows, split and truncation report).
        labels: packed per-token labels ``[rows, row_len]`` when labels were given (``-100`` on prompts and
            padding), else None.
        tokens_forwarded, tokens_unshared: tokens in the rows (no padding) vs the same sequences packed
            without sharing.
        input_ids: the packed ``input_ids`` (the log-prob targets).
        max_token_id: the largest id in ``input_ids`` (padding included) when the tokens were on the host,
            so :func:`completion_logprobs` can check the vocabulary without a sync; None for device tokens.
        status: None when every token was checked on the host; for device tokens a 0-d int32 device tensor,
            non-zero (``checks.STATUS_ERRORS`` bits) when a token id is negative: read it with
            :func:`packkit.shared_prefix.check_status` at a natural sync.
        attention: the batch's ``shared_prefix`` entry (it counts the attention calls made with it).
        vision: a :class:`packkit.shared_prefix.vision.VisionReport` for a vision-language batch (``mrope=``),
            else None.
    """

    forest: PrefixForest
    layout: TreeLayout
    score: ScoreIndex
    index: "ScoredTokens"
    plan: TreePlan
    labels: Optional[torch.Tensor]
    tokens_forwarded: int
    tokens_unshared: int
    input_ids: torch.Tensor
    max_token_id: Optional[int] = None
    status: Optional[torch.Tensor] = None
    attention: Optional[SharedPrefixAttention] = None
    vision: Optional[VisionReport] = None

    @property
    def num_sequences(self) -> int:
        return self.forest.num_sequences

    @property
    def dp_size(self) -> int:
        return self.plan.plan.dp_size if self.plan.plan is not None else 1

    def rank(self, r: int) -> np.ndarray:
        """Rank ``r``'s rows of the packed batch (int64 row indices, one per step, step order: row ``s * dp_size + r``
        is rank ``r``'s at step ``s``), as :meth:`packkit.rl.MicroBatches.rank`; e.g. ``batch["input_ids"][rows]``."""
        dp = self.dp_size
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 0 <= r < dp:
            raise ValueError(f"rank must be an int in [0, {dp}) (dp_size={dp}), got {r!r}")
        return np.arange(int(r), len(self.plan.rows), dp, dtype=np.int64)

    pred = property(lambda self: self.index.get("pred"))
    target = property(lambda self: self.index.get("target"))
    seq = property(lambda self: self.index.get("seq"))
    col = property(lambda self: self.index.get("col"))
    valid = property(lambda self: self.index.get("valid"))
    device = property(lambda self: self.index.device)


class ScoredTokens:
    """The per-token score index on the device, expanded from the host runs (:class:`ScoreIndex`) on first use and
    kept: a batch that is packed but never scored (or scored later) holds O(runs) host memory, not O(tokens)."""

    def __init__(self, score: ScoreIndex, device, labels: Optional[torch.Tensor]):
        self.score, self.device, self.labels, self._cache = score, device, labels, None

    def get(self, name: str) -> torch.Tensor:
        if self._cache is None:
            self._cache = expand_scores(self.score, self.device, self.labels)
        return self._cache[name]


def _tree_pack_op(backend: str):
    if backend == "triton":
        from ..triton_kernels import tree_pack as _triton  # noqa: F401  (registers packkit::triton_tree_pack)

        return torch.ops.packkit.triton_tree_pack
    if backend == HOST:  # backend="auto" on a GPU whose device paths failed their self-check
        return on_host(torch.ops.packkit.tree_pack)
    return torch.ops.packkit.tree_pack


def pack_forest(tree_plan: TreePlan, *, device=None, backend: str = "auto", attention: str = "auto",
                pad_id: int = 0) -> tuple[dict, SharedPrefixInfo]:
    """Pack a :class:`TreePlan` (see :func:`pack_groups`)."""
    check_choice(attention, "attention", ATTENTION_PATHS)
    device = check_device(device)
    if not isinstance(tree_plan, TreePlan):
        raise TypeError(f"tree_plan must be a TreePlan (from plan_trees), got {type(tree_plan).__name__}")
    forest = tree_plan.forest
    check_forest(forest, "tree_plan.forest")
    device = device if device is not None else forest.tokens.device
    backend = _backend_for(device, backend)
    pad_id = check_pad_id(pad_id, forest.tokens.dtype)
    capacity = None if tree_plan.plan is None else tree_plan.plan.capacity
    rows = _check_rows(tree_plan.rows, forest)
    tokens_total = int(forest.length.sum())
    check_allocation(len(rows) * (tokens_total if capacity is None else capacity), tokens_total,
                     f"{len(rows)} rows of {'the tree tokens' if capacity is None else f'capacity={capacity}'}",
                     rows=len(rows))
    max_token_id = _check_host_tokens(forest, pad_id)
    layout = tree_layout(forest, rows, capacity)
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
    attn = SharedPrefixAttention(layout, subtree_end, cu_seqlens, node_idx, attention, position_ids=position_ids)
    batch = {"input_ids": ids, "position_ids": position_ids, "shared_prefix": attn}
    unshared = int(forest.sequence_lengths().sum())
    # Device tokens were not read: a negative id sets a status bit, computed on the device (no sync).
    status = None if max_token_id is not None else (ids < 0).any().to(torch.int32) * NEGATIVE_TOKEN
    index = ScoredTokens(score, ids.device, packed_labels if labels is not None else None)
    info = SharedPrefixInfo(forest, layout, score, index, tree_plan, packed_labels if labels is not None else None,
                            int(layout.length.sum()), unshared, ids, max_token_id, status, attn)
    return batch, info


def _check_rows(rows, forest: PrefixForest) -> list:
    """``rows`` must name every root of ``forest`` exactly once (host ints): else a tree would be lost or twice."""
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__len__"):
        raise TypeError(f"tree_plan.rows must be a list of arrays of root nodes, got {type(rows).__name__}")
    out = []
    for r, row in enumerate(rows):
        a = np.asarray(row)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise TypeError(f"tree_plan.rows[{r}] must be a 1-D array of root node ids, got {a.dtype} {a.shape}")
        out.append(a.astype(np.int64))
    named = np.concatenate(out) if out else np.zeros(0, np.int64)
    roots = forest.roots()
    if len(named) != len(roots) or not np.array_equal(np.sort(named), roots):
        raise ValueError(f"tree_plan.rows must name each of the forest's {len(roots)} roots exactly once (got "
                         f"{len(named)} entries)")
    return out


def _check_host_tokens(forest: PrefixForest, pad_id: int) -> Optional[int]:
    """On the host: refuse a negative token id among the tokens the nodes use, and return the largest id
    (padding included); None for device tokens, which are checked on the device instead."""
    if forest.tokens.device.type != "cpu":
        return None
    length = forest.length
    total = int(length.sum())
    if total == 0:
        return pad_id
    ends = np.cumsum(length)
    starts = ends - length
    tokens = forest.tokens.numpy()  # numpy's int64 min / max are several times faster than torch's
    if total == len(tokens) and np.array_equal(forest.src, starts):
        index, used = None, tokens  # the nodes use every token in order (groups_forest, build_tree)
    else:
        index = np.repeat(forest.src - starts, length) + np.arange(total, dtype=np.int64)
        used = tokens[index]
    low, high = int(used.min()), int(used.max())
    if low < 0:
        at = int(np.flatnonzero(used < 0)[0])
        index = np.arange(total) if index is None else index
        node = int(np.searchsorted(ends, at, side="right"))
        raise ValueError(f"token id {int(used[at])} at tokens[{int(index[at])}] (node {node}): token ids index the "
                         "embedding and must be >= 0")
    return max(high, pad_id)


def pack_groups(prompts, completions, *, capacity: Optional[int] = None, labels=None, device=None,
                backend: str = "auto", attention: str = "auto", overlong: str = "error", algorithm: str = "obfd",
                dp_size: int = 1, cost="tokens", pad_id: int = 0, mrope=None) -> tuple[dict, SharedPrefixInfo]:
    """GRPO groups / DPO pairs -> one shared-prefix batch: each prompt once, then its completions.

    Args:
        prompts: ``prompts[g]``: group ``g``'s prompt (token list, numpy array or 1-D tensor; may be empty), or,
            with ``mrope``, one processor output for one sample: a dict of ``input_ids`` and any of
            ``pixel_values`` + ``image_grid_thw``, ``pixel_values_videos`` + ``video_grid_thw`` (+
            ``second_per_grid_ts``), ``mm_token_type_ids`` (``attention_mask``, all ones, is accepted).
        completions: ``completions[g]``: the list of group ``g``'s completions (each may be empty; G >= 1).
        capacity: tokens per row. None: one flat row ``[1, T]`` of exactly the tree tokens. Given: rows of
            ``capacity`` (``[R, capacity]``, padding at each row's end) planned over whole groups; a group over
            capacity is split into sub-groups that each re-carry the prompt (``info.plan.report``).
        labels: optional, parallel to ``completions``: per-token labels of each completion (``info.labels``).
        device, backend: where and with which kernels to pack (``"auto"``, ``"cpu"``, ``"cuda"``, ``"triton"``).
        attention: the attention path the batch asks for: ``"auto"`` (CUDA fp16/bf16: two-pass flash varlen;
            CUDA fp32: FlexAttention; CPU: the two-pass math), ``"varlen"``, ``"flex"`` or ``"dense"``.
        overlong: a prompt + one completion over ``capacity``: ``"error"`` or ``"truncate"`` (reported).
        algorithm, dp_size, cost: the row planner's (:func:`packkit.plan`), over trees; checked even without
            ``capacity`` (where ``dp_size`` must be 1: there is one row).
        pad_id: the token of padding (an int >= 0, fed to the model like any token).
        mrope: a Qwen2-VL / Qwen2.5-VL / Qwen3-VL config (or model), as ``PackingCollator(mrope=...)``: the batch
            then has ``position_ids`` ``[4, R, S]`` (row 0 the tree's text positions, rows 1-3 the model's mRoPE
            rows; a completion continues from its prompt exactly as ``get_rope_index`` on prompt + completion),
            ``mm_token_type_ids`` and each group's vision tensors once (``info.vision``; a split sub-group
            re-carries its prompt's images).

    Every argument is checked before anything is planned or allocated (``docs/shared_prefix.md``, "Argument
    rules"): token ids must be ints >= 0; a batch may not hold more than ``max(2**22, 4 x tokens)`` token
    slots (rows x row length) nor ``max(2**16, tokens)`` rows; ``prompts == completions == []`` gives an empty
    batch (``[1, 0]``; ``[0, capacity]`` with capacity).

    Returns ``(batch, info)``: ``batch`` has ``input_ids`` and ``position_ids`` ``[R, S]`` (a completion's
    positions continue from its prompt's length, exactly as it would have alone) and ``shared_prefix`` (the
    attention metadata); call the model as ``model(**batch, use_cache=False)`` after
    ``model.set_attn_implementation(packkit.shared_prefix.register_attention())``. ``info`` feeds
    :func:`completion_logprobs`.
    """
    _check_pack_args(capacity, algorithm, dp_size, cost, overlong, device, backend, attention, pad_id)
    prompts, vision = split_prompts(prompts, mrope)
    forest = groups_forest(prompts, completions, labels)
    if vision is not None:
        check_text_tokens(forest, vision.spec, pad_id)
        sources = group_sources(vision, forest)
    tree_plan = plan_trees(forest, capacity, algorithm=algorithm, dp_size=dp_size, cost=cost, overlong=overlong)
    batch, info = pack_forest(tree_plan, device=device, backend=backend, attention=attention, pad_id=pad_id)
    if vision is None:
        return batch, info
    return _with_vision(batch, info, sources)


def _with_vision(batch: dict, info: SharedPrefixInfo, sources: tuple) -> tuple[dict, SharedPrefixInfo]:
    extra, report = vision_batch(sources, info.forest, info.layout, batch["position_ids"], batch["input_ids"].device)
    batch.update(extra)
    info.attention.bind_positions(batch["position_ids"][0])  # Qwen-VL models hand their layers row 0
    return batch, info._replace(vision=report)


def _check_pack_args(capacity, algorithm, dp_size, cost, overlong, device, backend, attention, pad_id) -> None:
    """Every argument, before the inputs are read (the same rules whether or not ``capacity`` is given)."""
    check_plan_args(capacity, algorithm=algorithm, dp_size=dp_size, cost=cost, overlong=overlong)
    check_choice(attention, "attention", ATTENTION_PATHS)
    check_choice(backend, "backend", BACKENDS)
    dev = check_device(device)
    if dev is not None:
        _backend_for(dev, backend)  # e.g. backend='cuda' for a CPU device
    check_pad_id(pad_id, torch.int64)


def pack_tree(sequences, group_ids=None, *, score_from=None, labels=None, lengths=None, capacity: Optional[int] = None,
              device=None,
              backend: str = "auto", attention: str = "auto", overlong: str = "error", algorithm: str = "obfd",
              dp_size: int = 1, cost="tokens", pad_id: int = 0, mrope=None) -> tuple[dict, SharedPrefixInfo]:
    """Any sequences (multi-turn conversations, agent trajectories) -> their prefix forest
    (:func:`build_tree`), packed depth first like :func:`pack_groups`. A ``PrefixForest`` may be passed
    instead of sequences; it already holds its groups and scored tokens, so ``group_ids`` and ``score_from``
    are refused with it (pass them to :func:`build_tree`). No sequences: an empty batch, as :func:`pack_groups`.

    With ``mrope`` (a Qwen-VL config, as :func:`pack_groups`) a sequence may be a dict with its vision inputs (the
    keys of a :func:`pack_groups` prompt): prefixes are shared only where the tokens *and* the pictures are equal,
    each shared image is encoded once per packed copy of its node, and positions are the model's mRoPE rows.

    ``labels`` (one list per sequence, HF's: ``-100`` = not scored, else the token) score exactly the labelled tokens:
    an agent trajectory's assistant turns, not the tool output between them (:func:`build_tree`; sequences that share
    a node must agree on its labels). ``lengths``: the sequence lengths when ``sequences`` (and ``labels``) are one
    flat array / CPU tensor."""
    _check_pack_args(capacity, algorithm, dp_size, cost, overlong, device, backend, attention, pad_id)
    vision = None
    if isinstance(sequences, PrefixForest):
        if mrope is not None:
            raise ValueError("pack_tree got a PrefixForest and mrope=: a forest holds no images; pass the sequences "
                             "(dicts with their vision inputs) instead")
        given = [name for name, v in (("group_ids", group_ids), ("score_from", score_from), ("labels", labels),
                                      ("lengths", lengths)) if v is not None]
        if given:
            raise ValueError(f"pack_tree got a PrefixForest and {' and '.join(given)}: a forest already fixes its "
                             "groups and scored tokens; pass them to build_tree(sequences, group_ids, "
                             "score_from=...) instead")
        forest = sequences
    else:
        if lengths is None:  # a flat array with lengths holds no dicts
            sequences, vision = split_prompts(sequences, mrope, "sequences")
        elif mrope is not None:
            raise ValueError("pack_tree: lengths= (flat tokens) cannot carry images; pass dict sequences with mrope=")
        if vision is not None and labels is not None:
            raise ValueError("pack_tree: labels= with mrope= is not supported yet; use score_from")
        if vision is None:
            forest = build_tree(sequences, group_ids, score_from=score_from, labels=labels, lengths=lengths)
        else:
            from .vision_tree import tree_forest

            forest, sources = tree_forest(vision, sequences, group_ids, score_from)
            check_text_tokens(forest, vision.spec, pad_id, tree=True)
    tree_plan = plan_trees(forest, capacity, algorithm=algorithm, dp_size=dp_size, cost=cost, overlong=overlong)
    batch, info = pack_forest(tree_plan, device=device, backend=backend, attention=attention, pad_id=pad_id)
    if vision is None:
        return batch, info
    cut = [s for s in info.plan.report.truncated
           if sources[2].get(int(info.forest.src[info.forest.seq_node[s]]))]
    if cut:
        raise ValueError(f"sequence {cut[0]} would be truncated (overlong='truncate') inside a tree node that holds "
                         "images; raise capacity")
    return _with_vision(batch, info, sources)
