"""``pack_rollout_groups``: verl's ``[B, S]`` GRPO rollouts -> one shared-prefix micro-batch, with no host sync.

verl's rows are a left-padded prompt (``prompt_length`` columns) followed by a right-padded response; rows
with the same ``uid`` come from the same prompt. Each group's prompt is packed once (read from its first row),
then each row's response. Where the runs are comes from :func:`packkit.rl.rollout_layout` (one device-to-host
copy per global batch); the tokens are read in place from the flat ``[B * S]`` tensor by the same
``packkit::tree_pack`` launch as :func:`pack_groups`. That rows of one ``uid`` really share their prompt tokens
is checked on the device without a sync, and so are the values of ``attention_mask`` (0 and 1 only) and the
token ids (>= 0): ``info.status`` is 0 or the OR of ``checks.STATUS_ERRORS`` bits (the
``check_plan(sync=False)`` contract); :func:`check_rollout_groups` raises at a point of your choosing.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from ..packing.tensors import host_tensor, to_device
from ..rl.rollouts import RolloutLayout, _indices, _off_layout, rollout_layout
from .checks import STATUS_ERRORS, check_status, check_temperature
from .logprobs import CompletionLogprobs, completion_logprobs
from .pack import SharedPrefixInfo, pack_forest
from .planning import plan_trees
from .tree import PrefixForest


class RolloutGroupsInfo(NamedTuple):
    info: SharedPrefixInfo  # for completion_logprobs (sequences in group order)
    rows: np.ndarray  # the micro-batch's rows, in ``indices`` order
    seq_of_row: np.ndarray  # sequence (in ``info``) of each of ``rows``
    response_width: int  # S - prompt_length: verl's response columns
    status: Optional[torch.Tensor]  # device 0-d int32: 0, or the OR of checks.STATUS_ERRORS bits (PROMPT_DIFFERS...)


PROMPT_DIFFERS, MASK_NOT_BINARY = 1, 2  # bits of ``status`` (checks.STATUS_ERRORS); 4: a negative token id
MASK_NOT_LAYOUT = 16
assert PROMPT_DIFFERS in STATUS_ERRORS and MASK_NOT_BINARY in STATUS_ERRORS


def _group_keys(group_ids, batch: int) -> np.ndarray:
    if isinstance(group_ids, torch.Tensor):
        if group_ids.device.type != "cpu":
            raise ValueError("group_ids must be on the host (verl's uid array, a list or a CPU tensor)")
        group_ids = group_ids.numpy()
    keys = np.asarray(group_ids)
    if keys.shape != (batch,):
        raise ValueError(f"group_ids must hold one id per rollout row ({batch}), got shape {keys.shape}")
    _, inverse = np.unique(keys.astype(str) if keys.dtype == object else keys, return_inverse=True)
    return inverse.astype(np.int64)


def pack_rollout_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, group_ids, indices: Sequence[int],
                        layout: Optional[RolloutLayout] = None, *, prompt_length: int, device=None,
                        backend: str = "auto", attention: str = "auto", check: bool = True, position_ids=None,
                        multi_modal_inputs=None, mrope=None):
    """Pack rows ``indices`` of verl rollouts with each group's prompt once.

    Args:
        input_ids, attention_mask: ``[B, S]``; columns ``[0, prompt_length)`` hold the left-padded prompt.
        group_ids: one id per row of the global batch (verl's ``uid``: strings or ints); rows with equal ids
            share a prompt.
        indices: the micro-batch's rows (host ints).
        layout: :func:`packkit.rl.rollout_layout` of ``attention_mask`` (once per global batch; computed here,
            with one sync, if None).
        prompt_length: prompt columns (verl's ``prompts.shape[1]``).
        check: compare every row's prompt tokens with its group's first row on the device (``info.status``).
        position_ids, multi_modal_inputs, mrope: verl's Qwen-VL rollouts: ``position_ids`` ``[B, 3, S]`` or
            ``[B, 4, S]`` as verl builds them (the model's ``get_rope_index`` per row), ``multi_modal_inputs`` one
            dict (or None) per row of the global batch (``pixel_values``, ``image_grid_thw``, ...) and the model's
            config. The batch then has ``[4, 1, T]`` positions and each uid's vision inputs once (from its first
            row; other rows' pixels are compared on the device: ``info.status`` bit 8, no sync).

    Returns ``(batch, info)``; :func:`rollout_logprobs` turns the model's logits into verl's ``[b, response]``.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise TypeError(f"input_ids must be a [batch, seq_len] tensor, got {_what(input_ids)}")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dtype not in (torch.int64, torch.int32):  # uint8 / int16 ids: exact in int64, which the op reads
        input_ids = input_ids.to(torch.int64)
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a [batch, seq_len] tensor of 0 and 1, got {_what(attention_mask)}")
    if attention_mask.is_complex():
        raise TypeError(f"attention_mask must hold 0 and 1, got dtype {attention_mask.dtype}")
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} and input_ids {tuple(input_ids.shape)} differ")
    if attention_mask.device != input_ids.device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but input_ids on {input_ids.device}")
    if not isinstance(check, (bool, np.bool_)):
        raise TypeError(f"check must be True or False, got {type(check).__name__} {check!r}")
    given = [n for n, v in (("position_ids", position_ids), ("multi_modal_inputs", multi_modal_inputs),
                            ("mrope", mrope)) if v is not None]
    if given and len(given) < 3:
        missing = sorted({"position_ids", "multi_modal_inputs", "mrope"} - set(given))
        raise ValueError(f"vision-language rollouts need position_ids, multi_modal_inputs and mrope together; got "
                         f"{', '.join(given)} without {', '.join(missing)}")
    b, s = input_ids.shape
    if isinstance(prompt_length, bool) or not isinstance(prompt_length, (int, np.integer)) \
            or not 0 <= prompt_length <= s:
        raise ValueError(f"prompt_length must be an int in [0, {s}] (the prompt columns), got {prompt_length!r}")
    given_layout = layout is not None
    layout = rollout_layout(attention_mask) if layout is None else layout
    if not isinstance(layout, RolloutLayout) or len(layout.start) != b or layout.seq_len != s \
            or len(layout.length) != b:
        raise ValueError("layout must be packkit.rl.rollout_layout(attention_mask) of this batch")
    rows = _indices(indices, b)
    keys = _group_keys(group_ids, b)
    start, length = layout.start[rows], layout.length[rows]
    empty = length == 0
    start = np.where(empty, prompt_length, start)
    if ((start > prompt_length) | (start + length < prompt_length) & ~empty).any():
        r = int(rows[np.flatnonzero((start > prompt_length) | (start + length < prompt_length) & ~empty)[0]])
        raise ValueError(f"row {r}'s valid tokens do not cross column prompt_length={prompt_length}: rollouts must be a "
                         "left-padded prompt followed by a right-padded response")
    # Groups in order of first appearance; the first row of a group holds the prompt everyone shares.
    _, first_pos, group_of = np.unique(keys[rows], return_index=True, return_inverse=True)
    order = np.argsort(first_pos, kind="stable")
    group_first = first_pos[order]  # position in rows of each group's first row, in appearance order
    group_rank = np.empty(len(order), np.int64)
    group_rank[order] = np.arange(len(order))
    rank_of_row = group_rank[group_of.reshape(-1)]
    prompt_len = prompt_length - start
    first_row = group_first[rank_of_row]
    bad = np.flatnonzero(prompt_len != prompt_len[first_row])
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"rows {int(rows[first_row[i]])} and {int(rows[i])} share group id {group_ids[rows[i]]!r} but "
                         f"their prompts have {int(prompt_len[first_row[i]])} and {int(prompt_len[i])} tokens")
    parent, node_len, src, seq_node, seq_rows = [], [], [], [], []
    for g, first in enumerate(group_first):
        members = np.flatnonzero(rank_of_row == g)
        root = len(parent)
        parent.append(-1)
        node_len.append(int(prompt_len[first]))
        src.append(int(rows[first]) * s + int(start[first]))
        for i in members:
            seq_node.append(len(parent))
            seq_rows.append(i)
            parent.append(root)
            node_len.append(int(length[i]) - int(prompt_len[i]) if not empty[i] else 0)
            src.append(int(rows[i]) * s + prompt_length)
    seq_rows = np.array(seq_rows, np.int64)
    node_len = np.array(node_len, np.int64)
    score = np.array([node_len[parent[n]] for n in seq_node], np.int64)
    flat = input_ids.reshape(-1)
    forest = PrefixForest(np.array(parent, np.int64), node_len, np.array(src, np.int64), flat,
                          np.array(seq_node, np.int64), score, rank_of_row[seq_rows])
    batch, info = pack_forest(plan_trees(forest), device=device if device is not None else input_ids.device,
                              backend=backend, attention=attention)
    seq_of_row = np.empty(len(rows), np.int64)
    seq_of_row[seq_rows] = np.arange(len(seq_rows))
    status = None
    if check:  # on the device, no sync: prompts of one uid, mask values; pack_forest's status has the token ids
        status = _prompt_status(input_ids, rows, first_row, start, prompt_length, input_ids.device)
        status = status | _mask_values_status(attention_mask, rows)
        if given_layout:  # a layout of another mask of the same shape would pack masked tokens (as rl.pack_rollouts)
            off = _off_layout(attention_mask, rows, layout, attention_mask.device)[0]
            status = status | off.any().to(torch.int32) * MASK_NOT_LAYOUT
        if info.status is not None:
            status = status | info.status.to(status.device)
    if multi_modal_inputs is not None:
        from .rollouts_vision import rollout_vision

        extra, report, pixels = rollout_vision(batch, info, rows, first_row, group_first, position_ids,
                                               multi_modal_inputs, mrope, s, check)
        batch.update(extra)
        info.attention.bind_positions(batch["position_ids"][0])
        info = info._replace(vision=report)
        if pixels is not None:
            status = pixels.to(status.device) if status is None else status | pixels.to(status.device)
    return batch, RolloutGroupsInfo(info, rows, seq_of_row, s - prompt_length, status)


def _what(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dim()}-d tensor"
    hint = " (convert it with torch.as_tensor)" if isinstance(value, (list, np.ndarray)) else ""
    return type(value).__name__ + hint


def _mask_values_status(attention_mask: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """0-d int32 on the device: MASK_NOT_BINARY when a row of ``rows`` holds a mask value other than 0 and 1."""
    if attention_mask.dtype == torch.bool:
        return torch.zeros((), dtype=torch.int32, device=attention_mask.device)
    index = to_device(host_tensor(rows), attention_mask.device)
    m = attention_mask.index_select(0, index)
    return ((m != 0) & (m != 1)).any().to(torch.int32) * MASK_NOT_BINARY


def _prompt_status(input_ids, rows, first_row, start, prompt_length, device):
    """0-d int32 on the device: rows whose prompt tokens differ from their group's first row (no sync)."""
    others = np.flatnonzero(first_row != np.arange(len(rows)))
    meta = np.stack((rows[others], rows[first_row[others]], start[others])) if len(others) else np.zeros((3, 0), np.int64)
    meta = to_device(host_tensor(np.ascontiguousarray(meta, np.int64)), device)
    cols = torch.arange(prompt_length, device=device)
    in_prompt = cols >= meta[2].unsqueeze(1)
    mine = input_ids[:, :prompt_length].index_select(0, meta[0])
    theirs = input_ids[:, :prompt_length].index_select(0, meta[1])
    return ((mine != theirs) & in_prompt).any().to(torch.int32) * PROMPT_DIFFERS


def check_rollout_groups(info: RolloutGroupsInfo) -> None:
    """Raise ValueError naming what the device found (reads ``info.status``: one sync): rows of one group id
    with different prompt tokens, an ``attention_mask`` value other than 0 / 1, a negative token id."""
    if not isinstance(info, RolloutGroupsInfo):
        raise TypeError(f"info must be the RolloutGroupsInfo of pack_rollout_groups, got {type(info).__name__}")
    check_status(info)


def rollout_logprobs(logits: torch.Tensor, info: RolloutGroupsInfo, *, temperature: float = 1.0) -> torch.Tensor:
    """verl's response log-probs ``[len(indices), S - prompt_length]`` (zeros past each response) from the model's
    logits on the shared-prefix batch, rows in ``indices`` order; differentiable."""
    if not isinstance(info, RolloutGroupsInfo):
        raise TypeError(f"info must be the RolloutGroupsInfo of pack_rollout_groups, got {type(info).__name__}")
    check_temperature(temperature)
    result: CompletionLogprobs = completion_logprobs(logits, info.info, temperature=temperature)
    width = info.response_width
    out = result.padded.new_zeros((len(info.rows), width))
    seq = torch.from_numpy(info.seq_of_row).to(result.padded.device)
    got, mask = result.padded[seq], result.mask[seq]
    n = min(width, got.shape[1])
    if n == 0:
        return out
    return torch.cat([got[:, :n].masked_fill(~mask[:, :n], 0), out[:, n:]], 1)
