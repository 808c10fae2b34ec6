"""Qwen-VL multimodal RoPE (mRoPE) positions, exactly as the models' own ``get_rope_index`` computes them.

transformers 5.x (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE): a sample's ``mm_token_type_ids`` (0 text,
1 image, 2 video) is cut into runs of equal type. A text run of ``n`` tokens gets ``cur .. cur+n-1`` in all
three rows and moves ``cur`` by ``n``. Each vision run takes the next grid ``(t, h, w)`` of its kind and gets
``(cur + floor(t_index * interval), cur + h_index, cur + w_index)`` over the merged grid
``(t, h // m, w // m)`` (``m`` = ``spatial_merge_size``); then ``cur += max(h, w) // m``. ``interval`` is
1 except for Qwen2.5-VL videos: ``tokens_per_second * second_per_grid_ts[video]`` (float, truncated as the
model does). Qwen3-VL splits every video into ``t`` one-frame grids (its frames are separated by
timestamp text), so each frame run takes one ``(1, h, w)`` grid.

The work is per run of a sample that holds vision tokens (numpy over the run's tokens); text-only samples
never enter this module's loops.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ...planning.hf_inputs import as_grids as grids_of

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")


@dataclass(frozen=True)
class MRopeSpec:
    """What mRoPE needs from a model config (``mrope_spec(config)`` reads it)."""

    family: str
    spatial_merge_size: int
    tokens_per_second: Optional[float] = None  # Qwen2.5-VL: video temporal spacing
    frames_as_grids: bool = False  # Qwen3-VL: each video frame is its own (1, h, w) grid
    image_token_id: Optional[int] = None
    video_token_id: Optional[int] = None


def mrope_spec(config) -> MRopeSpec:
    """An :class:`MRopeSpec` from a transformers config (or a model, or an ``MRopeSpec``)."""
    if isinstance(config, MRopeSpec):
        return config
    if not hasattr(config, "model_type") and hasattr(config, "config"):
        config = config.config  # a model
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        raise ValueError(f"mrope= needs the config (or model) of one of {', '.join(FAMILIES)}; got "
                         f"{type(config).__name__} with model_type={family!r}")
    vision = getattr(config, "vision_config", None)
    merge = getattr(vision, "spatial_merge_size", None)
    if isinstance(merge, bool) or not isinstance(merge, numbers.Integral) or merge < 1:
        raise ValueError(f"mrope=: config.vision_config.spatial_merge_size must be a positive int, got {merge!r}")
    tps = getattr(vision, "tokens_per_second", None) if family == "qwen2_5_vl" else None
    if family == "qwen2_5_vl" and tps is None:
        raise ValueError("mrope=: a Qwen2.5-VL config needs vision_config.tokens_per_second")
    return MRopeSpec(family, int(merge), tps, family in ("qwen3_vl", "qwen3_vl_moe"),
                     getattr(config, "image_token_id", None), getattr(config, "video_token_id", None))


def check_mrope_start(mrope, position_ids_start) -> None:
    """mRoPE positions start at 0 like the model's ``get_rope_index``; one check for pack_sequences and the
    loaders that take ``mrope=`` with ``position_ids_start=``."""
    if mrope is not None and position_ids_start != 0:
        raise ValueError("mrope= positions start at 0 (as the model's get_rope_index); position_ids_start must be 0")


def as_grids(value, name: str, index) -> np.ndarray:
    """``[k, 3]`` int64 grids of sample ``index`` (``None`` -> none)."""
    return grids_of(value, f"sample {index}: {name}")


def video_grids_for_rope(videos: np.ndarray, spec: MRopeSpec) -> np.ndarray:
    """The grids the model's ``get_rope_index`` walks: Qwen3-VL splits each video into one-frame grids."""
    if spec.frames_as_grids and len(videos):
        videos = np.repeat(videos, videos[:, 0], axis=0)
        videos[:, 0] = 1
    return videos


def sample_rows(types: np.ndarray, images: np.ndarray, videos: np.ndarray, seconds: Optional[torch.Tensor],
                spec: MRopeSpec, index) -> np.ndarray:
    """``[3, n]`` int64 mRoPE rows of one sample (``videos`` already as :func:`video_grids_for_rope` gives).

    Raises ValueError naming sample ``index`` when the token types and the grids disagree.
    """
    n = len(types)
    out = np.empty((3, n), np.int64)
    bounds = np.flatnonzero(types[1:] != types[:-1]) + 1
    starts = np.concatenate(([0], bounds)).tolist() if n else []
    ends = np.concatenate((bounds, [n])).tolist() if n else []
    m = spec.spatial_merge_size
    cur = 0
    used = [0, 0]
    for s, e in zip(starts, ends):
        kind = int(types[s])
        if kind == 0:
            out[:, s:e] = np.arange(cur, cur + e - s)
            cur += e - s
            continue
        if kind not in (1, 2):
            raise ValueError(f"sample {index}: mm_token_type_ids has value {kind} at token {s}; allowed: 0 (text), "
                             f"1 (image), 2 (video)")
        what, grids = ("image", images) if kind == 1 else ("video", videos)
        j = used[kind - 1]
        used[kind - 1] += 1
        if j >= len(grids):
            raise ValueError(f"sample {index}: {what} block {j + 1} (tokens {s}..{e - 1}) has no grid: "
                             f"{what}_grid_thw has {len(grids)} {'frame ' if kind == 2 and spec.frames_as_grids else ''}"
                             f"grid(s) for this sample")
        t, h, w = (int(x) for x in grids[j])
        lt, lh, lw = t, h // m, w // m
        if lt * lh * lw != e - s:
            raise ValueError(f"sample {index}: {what} block {j} has {e - s} tokens but its grid (t, h, w)=({t}, {h}, {w}) "
                             f"implies t*(h/{m})*(w/{m}) = {lt * lh * lw} (spatial_merge_size={m})")
        if kind == 2 and spec.tokens_per_second is not None:
            # Same arithmetic as the model (float product truncated by .long()), so the rows match bit for bit.
            interval = spec.tokens_per_second * (seconds[j] if seconds is not None else 1)
            temporal = (torch.arange(lt) * interval).long().numpy()
        else:
            temporal = np.arange(lt)
        out[0, s:e] = np.repeat(temporal + cur, lh * lw)
        out[1, s:e] = np.tile(np.repeat(np.arange(cur, cur + lh), lw), lt)
        out[2, s:e] = np.tile(np.arange(cur, cur + lw), lt * lh)
        cur += max(h, w) // m
    if used[0] != len(images) or used[1] != len(videos):
        kind, have, got = ("image", len(images), used[0]) if used[0] != len(images) else ("video", len(videos), used[1])
        raise ValueError(f"sample {index}: {kind}_grid_thw has {have} {'frame ' if kind == 'video' and spec.frames_as_grids else ''}"
                         f"grid(s) but mm_token_type_ids has {got} {kind} block(s)")
    return out


def token_types(input_ids: torch.Tensor, spec: MRopeSpec) -> torch.Tensor:
    """``mm_token_type_ids`` (int64, host) from the config's image/video token ids, as the processors set them."""
    if spec.image_token_id is None and spec.video_token_id is None:
        raise ValueError("mm_token_type_ids is needed: the config names no image_token_id/video_token_id")
    ids = input_ids.detach().cpu().numpy()
    types = np.zeros(ids.shape, np.int64)
    if spec.image_token_id is not None:
        types[ids == spec.image_token_id] = 1
    if spec.video_token_id is not None:
        types[ids == spec.video_token_id] = 2
    return torch.from_numpy(types)
