"""Vision inputs and mRoPE rows of a packed batch: per-sample tensors in packed order, checked per sample.

The models split ``pixel_values`` by ``image_grid_thw`` in order and scatter the features into the image
tokens in row-major token order, so the packed batch concatenates every sample's vision tensors in the
order its tokens appear in the packed batch (the plan's segment order, which is row-major). The same holds
for ``pixel_values_videos`` / ``video_grid_thw`` / ``second_per_grid_ts``.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..tensors import describe, to_device, to_tensor
from .mrope import MRopeSpec, as_grids, sample_rows, token_types, video_grids_for_rope

PAIRS = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


def _grids(vision: dict, name: str, n: int) -> list:
    values = vision.get(name)
    return [as_grids(values[i] if values is not None else None, name, i) for i in range(n)]


def check_vision(vision: dict, n: int) -> tuple[list, list]:
    """(image grids, video grids) per sample; ValueError naming the sample if pixels and grids disagree."""
    images, videos = _grids(vision, "image_grid_thw", n), _grids(vision, "video_grid_thw", n)
    for (pix, grid), grids in zip(PAIRS, (images, videos)):
        if pix not in vision and grid not in vision:
            continue
        pixels = vision.get(pix, [None] * n)
        for i in range(n):
            p, g = pixels[i], grids[i]
            if p is None:
                if len(g):
                    raise ValueError(f"sample {i}: {grid} has {len(g)} grid(s) but there is no {pix}")
                continue
            if grid not in vision:
                continue  # other VLMs (e.g. LLaVA) have pixel_values without grids: concatenated as given
            rows = p.shape[0] if isinstance(p, (torch.Tensor, np.ndarray)) and p.ndim >= 1 else None
            need = int((g[:, 0] * g[:, 1] * g[:, 2]).sum())
            if rows != need:
                raise ValueError(f"sample {i}: {pix} is {describe(p)} but {grid} {g.tolist()} implies "
                                 f"{need} patch rows (sum of t*h*w)")
    seconds = vision.get("second_per_grid_ts")
    if seconds is not None:
        for i in range(n):
            count = 0 if seconds[i] is None else int(np.asarray(torch.as_tensor(seconds[i])).reshape(-1).shape[0])
            if count != len(videos[i]):
                raise ValueError(f"sample {i}: second_per_grid_ts has {count} value(s) but video_grid_thw has "
                                 f"{len(videos[i])} video(s)")
    return images, videos


def concat_in_order(vision: dict, order: list, device) -> dict:
    """Each vision field's per-sample tensors concatenated along dim 0 in ``order`` (packed order)."""
    out = {}
    for name, values in vision.items():
        parts = [to_tensor(values[i], name, i) for i in order if values[i] is not None]
        if name == "second_per_grid_ts":
            parts = [p.reshape(-1) for p in parts]
        if name.endswith("grid_thw"):
            parts = [p.reshape(-1, 3).to(torch.int64) for p in parts]
        if not parts:
            continue  # no sample in this batch has one: the model must not get an empty tensor
        out[name] = to_device(torch.cat(parts), device)
    return out


def whole_samples_only(segments, lengths: np.ndarray, samples: np.ndarray, what: str) -> None:
    """ValueError if the plan truncated or split one of ``samples`` (their vision blocks would be cut)."""
    if not len(samples):
        return
    empty = samples[lengths[samples] == 0]
    if len(empty):
        raise ValueError(f"sample {int(empty[0])} holds {what} but no tokens")
    mark = np.zeros(len(lengths), bool)
    mark[samples] = True
    seq = segments.seq_index
    cut = mark[seq] & ((segments.start != 0) | (segments.length != lengths[seq]))
    if cut.any():
        i = int(seq[np.flatnonzero(cut)[0]])
        raise ValueError(f"sample {i} holds {what} but the plan cuts it (overlong='truncate'/'split', "
                         f"{int(lengths[i])} tokens): a vision block cannot be split across segments; use a larger "
                         f"capacity or overlong='drop'/'error'")


def mrope_source(types: np.ndarray, offsets: np.ndarray, samples, images: list, videos: list,
                 seconds: Optional[list], spec: MRopeSpec) -> np.ndarray:
    """``[N, 3]`` int64 source rows: each listed sample's own mRoPE rows, -1 everywhere else."""
    src = np.full((int(offsets[-1]), 3), -1, np.int64)
    for i in samples:
        o0, o1 = int(offsets[i]), int(offsets[i + 1])
        sec = None
        if seconds is not None and seconds[i] is not None:
            sec = torch.as_tensor(seconds[i]).reshape(-1)
        src[o0:o1] = sample_rows(types[o0:o1], images[i], video_grids_for_rope(videos[i], spec), sec, spec, i).T
    return src


def pack_multimodal(batch: dict, info, flat_ids: torch.Tensor, lengths: np.ndarray, token_src: dict,
                    vision: dict, spec: Optional[MRopeSpec], op) -> dict:
    """New keys of a packed batch: the vision tensors in packed order and, with ``spec``, ``[4, B, L]`` positions."""
    n = len(lengths)
    images, videos = check_vision(vision, n)
    segments = info.segments
    has_grid = np.array([len(a) > 0 or len(b) > 0 for a, b in zip(images, videos)], bool)
    has_pixels = np.zeros(n, bool)
    for name in ("pixel_values", "pixel_values_videos"):
        if name in vision:
            has_pixels |= np.array([v is not None for v in vision[name]], bool)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    out = {}
    vision_samples = np.flatnonzero(has_grid | has_pixels)
    if spec is not None:
        if "mm_token_type_ids" in token_src:
            src_types = token_src["mm_token_type_ids"]
            if src_types.dim() != 1 or src_types.dtype.is_floating_point:
                raise ValueError(f"mm_token_type_ids must be integer, one per token; got {src_types.dtype} of shape "
                                 f"{tuple(src_types.shape)}")
            # numpy on the host: single-threaded small ops, no intra-op thread wake-ups per call
            types = src_types.detach().cpu().numpy().astype(np.int64, copy=False)
            ids = flat_ids.detach().cpu().numpy()
            for kind, token in ((1, spec.image_token_id), (2, spec.video_token_id)):
                if token is not None:
                    bad = np.flatnonzero((ids == token) != (types == kind))
                    if len(bad):
                        i = int(np.searchsorted(offsets, int(bad[0]), side="right")) - 1
                        raise ValueError(f"sample {i}: token {int(bad[0]) - int(offsets[i])} disagrees between input_ids "
                                         f"(id {token} marks {'image' if kind == 1 else 'video'} tokens) and "
                                         f"mm_token_type_ids")
        else:
            types = token_types(flat_ids.detach().cpu(), spec).numpy()
        tokens_at = np.flatnonzero(types)
        with_tokens = np.unique(np.searchsorted(offsets, tokens_at, side="right") - 1)
        vision_samples = np.union1d(vision_samples, with_tokens).astype(np.int64)
    whole_samples_only(segments, lengths, vision_samples, "vision inputs")
    device = info.cu_seqlens.device
    out.update(concat_in_order(vision, segments.seq_index.tolist(), device))
    if spec is None:
        return out
    text = batch["position_ids"]
    if len(vision_samples):
        src = mrope_source(types, offsets, vision_samples.tolist(), images, videos, vision.get("second_per_grid_ts"),
                           spec)
        shape = info.layout
        rows = op(to_device(torch.from_numpy(src), device), info.src_offsets, info.seg_seq, info.seg_start, info.cu_seqlens,
                  info.cu_seg, shape.num_rows, shape.row_len, shape.flat, -1.0)
        rows = rows.view(*text.shape, 3).movedim(-1, 0)
    else:
        rows = None
    out["position_ids"] = _stack_positions(text, rows)
    return out


def _stack_positions(text: torch.Tensor, rows: Optional[torch.Tensor]) -> torch.Tensor:
    """``[4, *text.shape]``: the text positions, then ``rows`` with -1 (text-only segments, padding) -> text."""
    if text.device.type == "cpu":
        # numpy: a few single-threaded passes; torch's intra-op threads cost more than the work on small CPUs
        t = text.numpy()
        out = np.empty((4, *t.shape), np.int64)
        out[:] = t
        if rows is not None:
            r = rows.numpy()
            np.copyto(out[1:], r, where=r >= 0)
        return torch.from_numpy(out)
    if rows is None:
        return text.unsqueeze(0).expand(4, *text.shape).contiguous()
    return torch.cat((text.unsqueeze(0), torch.where(rows < 0, text.unsqueeze(0), rows)))
