"""verl's multimodal rollouts in :func:`pack_rollout_groups`: each uid's images once, positions from verl's own.

verl 0.9.1 builds, for Qwen-VL, ``position_ids`` ``[B, 3, S]`` (the three mRoPE rows) or ``[B, 4, S]`` (a text row,
then the three) per row with the model's ``get_rope_index`` on prompt + response, and keeps each row's processor
output in ``non_tensor_batch["multi_modal_inputs"]`` (a dict per row: ``pixel_values``, ``image_grid_thw``, ...).
Here the mRoPE rows are gathered on the device from the rows each packed token comes from (the group's first row
for the prompt, each row for its response): no host read of tokens or positions. The group's first row supplies
the pixels; that every other row of the uid holds the same pixels is checked on the device (``info.status`` bit 8,
no sync); shapes and keys, which are host metadata, are checked at once. The report's visual-token counts read
the grids, which verl keeps on the host (a GPU grid tensor there would be read back once).
"""
from __future__ import annotations


import numpy as np
import torch

from ..packing.multimodal.mrope import mrope_spec
from ..packing.multimodal.vision import _stack_positions
from ..packing.tensors import host_tensor, to_device
from .vision import VISION_KEYS, VisionReport, _packed_index

PIXELS_DIFFER = 8  # checks.STATUS_ERRORS bit: rows of one uid whose vision inputs differ


def _row_inputs(multi_modal_inputs, row: int) -> dict:
    value = multi_modal_inputs[row]
    if value is None:
        return {}
    if not hasattr(value, "keys"):
        raise TypeError(f"multi_modal_inputs[{row}] must be a dict (verl's processor output of the row), got "
                        f"{type(value).__name__}")
    unknown = sorted(set(value.keys()) - set(VISION_KEYS))
    if unknown:
        raise ValueError(f"multi_modal_inputs[{row}] has key(s) {unknown}; allowed: {', '.join(VISION_KEYS)}")
    return {k: value[k] for k in VISION_KEYS if k in value and value[k] is not None}


def rollout_vision(batch: dict, info, rows: np.ndarray, first_row: np.ndarray, group_first: np.ndarray,
                   position_ids: torch.Tensor, multi_modal_inputs, mrope, seq_len: int, check: bool):
    """``(new batch entries, VisionReport, status or None)`` for the packed rollouts ``info`` (one flat row)."""
    spec = mrope_spec(mrope)
    b = len(multi_modal_inputs) if hasattr(multi_modal_inputs, "__len__") else None
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 3 or position_ids.shape[1] not in (3, 4) \
            or position_ids.shape[2] != seq_len or (b is not None and position_ids.shape[0] != b):
        shape = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(f"position_ids must be verl's Qwen-VL [B, 3, S] or [B, 4, S] positions of the rollouts "
                         f"(B = len(multi_modal_inputs) = {b}, S = {seq_len}), got {shape}")
    if position_ids.is_floating_point() or position_ids.dtype == torch.bool:
        raise TypeError(f"position_ids must be integers, got {position_ids.dtype}")
    device = batch["input_ids"].device
    flat = position_ids[:, -3:].transpose(0, 1).reshape(3, -1)  # [3, B * S], the source of every packed token
    dst, src = _packed_index(info.layout)
    index = to_device(host_tensor(np.concatenate([dst, src])), flat.device)
    text = batch["position_ids"]
    packed = torch.full((3, text.numel()), -1, dtype=torch.int64, device=flat.device)
    packed[:, index[:len(dst)]] = flat.index_select(1, index[len(dst):]).to(torch.int64)
    out = {"position_ids": _stack_positions(text, to_device(packed.view(3, *text.shape), text.device))}
    # Each group's first row supplies its vision inputs, in packed (= group) order.
    firsts = rows[group_first]
    per_group = [_row_inputs(multi_modal_inputs, int(r)) for r in firsts]
    status = None
    for i, r in enumerate(rows.tolist()):  # every row against its group's first: keys and shapes now, values on device
        f = int(rows[first_row[i]])
        if f == r:
            continue
        mine, theirs = _row_inputs(multi_modal_inputs, r), _row_inputs(multi_modal_inputs, f)
        if mine.keys() != theirs.keys() or any(tuple(torch.as_tensor(mine[k]).shape) != tuple(
                torch.as_tensor(theirs[k]).shape) for k in mine):
            raise ValueError(f"rows {f} and {r} share a uid but their multi_modal_inputs differ in keys or shapes "
                             f"({ {k: tuple(torch.as_tensor(v).shape) for k, v in theirs.items()} } vs "
                             f"{ {k: tuple(torch.as_tensor(v).shape) for k, v in mine.items()} })")
        if check:
            for k in mine:
                a, c = torch.as_tensor(mine[k]), torch.as_tensor(theirs[k])
                differ = (a != c.to(a.device)).any().to(device=device, dtype=torch.int32) * PIXELS_DIFFER
                status = differ if status is None else status | differ
    for key in VISION_KEYS:
        parts = [torch.as_tensor(g[key]) for g in per_group if key in g]
        if not parts:
            continue
        if key.endswith("grid_thw"):
            parts = [p.reshape(-1, 3).to(torch.int64) for p in parts]
        if key == "second_per_grid_ts":
            parts = [p.reshape(-1) for p in parts]
        out[key] = to_device(torch.cat(parts), device)
    sizes = np.bincount(np.searchsorted(group_first, first_row), minlength=len(group_first))  # rows per group
    m = spec.spatial_merge_size

    def count(g, key):
        return len(torch.as_tensor(g[key]).reshape(-1, 3)) if key in g else 0

    def tokens(g):
        total = 0
        for key in ("image_grid_thw", "video_grid_thw"):
            if key in g:
                grid = torch.as_tensor(g[key]).reshape(-1, 3).cpu()
                total += int((grid[:, 0] * (grid[:, 1] // m) * (grid[:, 2] // m)).sum())
        return total

    n_img = np.array([count(g, "image_grid_thw") for g in per_group], np.int64)
    n_vid = np.array([count(g, "video_grid_thw") for g in per_group], np.int64)
    tok = np.array([tokens(g) for g in per_group], np.int64)
    groups = np.arange(len(per_group))
    report = VisionReport(np.repeat(groups, n_img), np.repeat(groups, n_vid), int(n_img.sum()),
                          int((n_img * sizes).sum()), int(n_vid.sum()), int((n_vid * sizes).sum()), int(tok.sum()),
                          int((tok * sizes).sum()), 0)
    return out, report, status
