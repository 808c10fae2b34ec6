"""``packkit.mrope_position_ids``: ``[4, B, L]`` mRoPE positions for a batch built elsewhere."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .mrope import as_grids, mrope_spec, sample_rows, token_types, video_grids_for_rope


def mrope_position_ids(input_ids, mm_token_type_ids, image_grid_thw, video_grid_thw, config, *,
                       second_per_grid_ts=None, position_ids=None) -> torch.Tensor:
    """``[4, B, L]`` int64 positions of a (packed or plain) batch for a Qwen2-VL/2.5-VL/3-VL(-MoE) model.

    Args:
        input_ids: ``[B, L]`` (or ``[L]``) token ids.
        mm_token_type_ids: same shape, 0 text / 1 image / 2 video; None derives it from the config's
            ``image_token_id`` / ``video_token_id``.
        image_grid_thw, video_grid_thw: ``[num, 3]`` grids of the whole batch, in row-major token order
            (what the model takes); None if there are none.
        config: the model's config (or the model).
        second_per_grid_ts: per video of the batch (Qwen2.5-VL), in the same order.
        position_ids: the batch's text positions ``[B, L]``; a document starts wherever they do not go up by
            one (transformers' rule for packed batches). None: each row is one document.

    Row 0 is ``position_ids`` (or ``arange(L)`` per row); rows 1-3 are, per document, exactly what the model's
    ``get_rope_index`` gives for that document alone (text-only documents: ``0 .. len-1``). Grids are consumed
    in document order; a document whose tokens and grids disagree raises ValueError naming ``(row, start)``.
    """
    spec = mrope_spec(config)
    ids = torch.as_tensor(input_ids)
    squeeze = ids.dim() == 1
    if squeeze:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L] or [L], got shape {tuple(ids.shape)}")
    if mm_token_type_ids is None:
        types = token_types(ids.cpu(), spec)
    else:
        types = torch.as_tensor(mm_token_type_ids).reshape(ids.shape).cpu().to(torch.int64)
    if position_ids is None:
        text = torch.arange(ids.shape[1]).expand(ids.shape).to(torch.int64)
    else:
        text = torch.as_tensor(position_ids).reshape(ids.shape).to(torch.int64)
    B, L = ids.shape
    flat_types = types.reshape(-1).numpy()
    pos = text.cpu().numpy()
    starts = np.ones((B, L), bool)
    starts[:, 1:] = np.diff(pos, axis=1) != 1
    doc_starts = np.flatnonzero(starts.reshape(-1))
    offsets = np.concatenate((doc_starts, [B * L]))
    doc_of = np.cumsum(starts.reshape(-1)) - 1  # document of each token
    # Runs of one type inside one document; grids are handed out to the vision runs in order.
    run_start = starts.reshape(-1).copy()
    run_start[1:] |= flat_types[1:] != flat_types[:-1]
    run_idx = np.flatnonzero(run_start)
    images = as_grids(image_grid_thw, "image_grid_thw", "batch")
    videos = video_grids_for_rope(as_grids(video_grid_thw, "video_grid_thw", "batch"), spec)
    seconds = None if second_per_grid_ts is None else torch.as_tensor(second_per_grid_ts).reshape(-1)
    counts = []
    for kind in (1, 2):
        runs = run_idx[flat_types[run_idx] == kind]
        counts.append(np.bincount(doc_of[runs], minlength=len(doc_starts)))
    need = [int(c.sum()) for c in counts]
    if need[0] != len(images) or need[1] != len(videos):
        raise ValueError(f"the batch has {need[0]} image and {need[1]} video block(s) but image_grid_thw has "
                         f"{len(images)} and video_grid_thw {len(videos)} grid(s)")
    firsts = [np.concatenate(([0], np.cumsum(c))) for c in counts]
    rows = np.empty((3, B * L), np.int64)
    within = np.arange(B * L) - offsets[doc_of]
    rows[:] = within  # text-only documents: 0 .. len-1
    for d in np.flatnonzero(counts[0] + counts[1]).tolist():
        o0, o1 = int(offsets[d]), int(offsets[d + 1])
        im = images[firsts[0][d]:firsts[0][d + 1]]
        vi = videos[firsts[1][d]:firsts[1][d + 1]]
        sec = seconds[firsts[1][d]:firsts[1][d + 1]] if seconds is not None else None
        rows[:, o0:o1] = sample_rows(flat_types[o0:o1], im, vi, sec, spec, f"(row {o0 // L}, token {o0 % L})")
    out = torch.cat((text.unsqueeze(0), torch.from_numpy(rows).view(3, B, L))).to(ids.device)
    return out[:, 0] if squeeze else out
