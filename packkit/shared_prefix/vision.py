"""Vision-language prompts in a shared-prefix batch: each prompt's images once per packed prompt, mRoPE exact.

A prompt may be one processor output for one sample (a dict: ``input_ids`` and any of ``pixel_values`` +
``image_grid_thw``, ``pixel_values_videos`` + ``video_grid_thw`` (+ ``second_per_grid_ts``),
``mm_token_type_ids``). The positions reuse ``packkit.packing.multimodal`` (one implementation with
``PackingCollator(mrope=...)``): a group's prompt and its longest completion are walked as one sample by the
same ``sample_rows`` the collator uses, i.e. the model's own ``get_rope_index``; a completion is text, so its
tokens take the walk's text positions after the prompt (the prompt's next position on all three axes), exactly as
prompt + completion alone. Row 0 stays the tree's text positions (prompt length + j), as the collator's row 0.

The batch lists the vision tensors of every packed prompt copy in packed (row-major token) order, which is how
the models split ``pixel_values`` by grid and scatter features into image tokens: once per group, once more for
each sub-group a ``capacity`` split made (it re-carries its prompt and so its images; ``VisionReport``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from ..packing.multimodal.mrope import MRopeSpec, as_grids, mrope_spec, sample_rows, token_types, video_grids_for_rope
from ..packing.multimodal.vision import _stack_positions, check_vision
from ..packing.tensors import to_device
from .tree import PrefixForest

VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
PROMPT_KEYS = ("input_ids", "mm_token_type_ids", "attention_mask") + VISION_KEYS


class VisionPrompts(NamedTuple):
    """The groups' vision inputs, checked (host; lists over groups)."""

    spec: MRopeSpec
    types: list  # int64 [P] token types of each prompt (0 text, 1 image, 2 video)
    images: list  # [k, 3] image grids of each prompt
    videos: list  # [k, 3] video grids of each prompt (as given, not split into frames)
    fields: dict  # name -> per-group tensor or None (the VISION_KEYS present in any prompt)


class VisionReport(NamedTuple):
    """What the batch's vision inputs hold (``info.vision``).

    Attributes:
        image_groups, video_groups: the group of each image / video of the batch, in batch order.
        images_forwarded, videos_forwarded: images / videos the vision tower encodes for this batch.
        images_unshared, videos_unshared: what packing each completion with its own prompt would encode
            (each prompt's images x its completions).
        visual_tokens_forwarded, visual_tokens_unshared: merged visual tokens in the language model, likewise.
        copied_images: images encoded more than once because a split sub-group re-carries its prompt
            (``info.plan.report.split_groups`` names the groups); 0 without splits.
    """

    image_groups: np.ndarray
    video_groups: np.ndarray
    images_forwarded: int
    images_unshared: int
    videos_forwarded: int
    videos_unshared: int
    visual_tokens_forwarded: int
    visual_tokens_unshared: int
    copied_images: int


def _ids_1d(value, name: str):
    """A processor's ``[1, L]`` per-sample tensor is taken as ``[L]``; anything else is left to the token checks."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 2 and value.shape[0] == 1:
        return value[0]
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 2:
        raise ValueError(f"{name} must be one sample's tokens ([L] or [1, L]), got shape {tuple(value.shape)}")
    return value


def _as_tensor(value) -> torch.Tensor:
    """A token list as a tensor; an empty list is int64 (not numpy's float64)."""
    if isinstance(value, (list, tuple)) and len(value) == 0:
        return torch.zeros(0, dtype=torch.int64)
    return torch.as_tensor(np.asarray(value) if isinstance(value, (list, tuple)) else value)


def split_prompts(prompts, mrope) -> tuple[list, Optional[VisionPrompts]]:
    """``(token prompts, vision)``: dict prompts -> their ``input_ids`` and the checked vision inputs (None when no
    prompt is a vision-language one and ``mrope`` is None: the plain token path, unchanged)."""
    if isinstance(prompts, (str, bytes, dict)) or not hasattr(prompts, "__len__"):
        return prompts, None  # groups_forest names the type error
    dicts = [g for g, p in enumerate(prompts) if isinstance(p, dict)]
    if not dicts and mrope is None:
        return prompts, None
    for g in dicts:
        unknown = sorted(set(prompts[g]) - set(PROMPT_KEYS))
        if unknown:
            raise ValueError(f"prompts[{g}] has key(s) {unknown}; a prompt dict may hold {', '.join(PROMPT_KEYS)}")
        if "input_ids" not in prompts[g]:
            raise ValueError(f"prompts[{g}] is a dict without 'input_ids'")
        mask = prompts[g].get("attention_mask")
        if mask is not None and not bool((torch.as_tensor(mask) == 1).all()):
            raise ValueError(f"prompts[{g}]['attention_mask'] holds zeros: a prompt is one unpadded sample; drop its "
                             "padding (or the mask)")
    if mrope is None:
        with_vision = [g for g in dicts if set(prompts[g]) & set(VISION_KEYS + ("mm_token_type_ids",))]
        if with_vision:
            g = with_vision[0]
            raise ValueError(f"prompts[{g}] holds vision inputs ({', '.join(sorted(set(prompts[g]) - {'input_ids'}))})"
                             " but mrope= was not given: pass mrope=model.config (a Qwen2-VL, Qwen2.5-VL or Qwen3-VL "
                             "config) so the image tokens get the model's 3-D positions")
        return [p["input_ids"] if isinstance(p, dict) else p for p in prompts], None
    spec = mrope_spec(mrope)
    ids = [_ids_1d(p["input_ids"], f"prompts[{g}]['input_ids']") if isinstance(p, dict) else p
           for g, p in enumerate(prompts)]
    n = len(prompts)
    present = sorted({k for g in dicts for k in prompts[g]} & set(VISION_KEYS), key=VISION_KEYS.index)
    fields = {k: [prompts[g].get(k) if isinstance(prompts[g], dict) else None for g in range(n)] for k in present}
    try:
        images, videos = check_vision(fields, n)
    except ValueError as e:  # its messages say "sample i": here that is prompts[i]
        raise ValueError(f"prompts (sample i = prompts[i]): {e}") from None
    types = []
    for g, p in enumerate(prompts):
        tokens = _as_tensor(ids[g])
        if tokens.dim() != 1 or tokens.is_floating_point() or tokens.dtype == torch.bool:
            types.append(None)  # groups_forest refuses it, naming prompts[g]
            continue
        given = p.get("mm_token_type_ids") if isinstance(p, dict) else None
        types.append(_prompt_types(tokens.cpu(), given, spec, g))
    return ids, VisionPrompts(spec, types, images, videos, fields)


def _prompt_types(tokens: torch.Tensor, given, spec: MRopeSpec, g: int) -> np.ndarray:
    """The prompt's token types: as given (checked against the image / video token ids) or from the ids."""
    if given is None:
        return token_types(tokens, spec).numpy()
    t = _as_tensor(_ids_1d(given, f"prompts[{g}]['mm_token_type_ids']"))
    if t.dim() != 1 or t.is_floating_point() or t.dtype == torch.bool or len(t) != len(tokens):
        raise ValueError(f"prompts[{g}]['mm_token_type_ids'] must be integers, one per input_ids token "
                         f"({len(tokens)}); got {t.dtype} of shape {tuple(t.shape)}")
    types = t.cpu().numpy().astype(np.int64)
    ids = tokens.numpy()
    for kind, token in ((1, spec.image_token_id), (2, spec.video_token_id)):
        if token is not None:
            bad = np.flatnonzero((ids == token) != (types == kind))
            if len(bad):
                raise ValueError(f"prompts[{g}]: token {int(bad[0])} disagrees between input_ids (id {token} marks "
                                 f"{'image' if kind == 1 else 'video'} tokens) and mm_token_type_ids")
    return types


def check_text_tokens(forest: PrefixForest, spec: MRopeSpec, pad_id: int) -> None:
    """Completions are text: an image / video token id there (or as ``pad_id``) would make the model scatter a
    feature into it that no image supplies. Host tokens only (device tokens are not read back)."""
    marks = [t for t in (spec.image_token_id, spec.video_token_id) if t is not None]
    if pad_id in marks:
        raise ValueError(f"pad_id={pad_id} is the model's image/video token id; pass another pad_id")
    if forest.tokens.device.type != "cpu":
        return
    tokens = forest.tokens.numpy()
    for k in np.flatnonzero(forest.parent >= 0).tolist():
        piece = tokens[forest.src[k]:forest.src[k] + forest.length[k]]
        hit = np.flatnonzero(np.isin(piece, marks))
        if len(hit):
            g = int(forest.parent[k])
            j = k - g - 1
            group = int(np.flatnonzero(forest.roots() == g)[0])
            raise ValueError(f"completions[{group}][{j}][{int(hit[0])}] is the image/video token id "
                             f"{int(piece[hit[0]])}: completions are text (images belong in the prompt dict)")


def source_rows(vp: VisionPrompts, forest: PrefixForest) -> tuple[np.ndarray, np.ndarray]:
    """``([len(tokens), 3] mRoPE rows, [len(tokens)] token types)`` parallel to ``forest.tokens`` (a
    :func:`groups_forest` forest: root g is group g's prompt, its children its completions). Rows are -1 for
    text-only groups (their rows equal the text positions, filled in when the batch is stacked)."""
    total = len(forest.tokens)
    rows = np.full((total, 3), -1, np.int64)
    types = np.zeros(total, np.int64)
    roots = forest.roots()
    ends = np.append(roots[1:], forest.num_nodes)
    fields = vp.fields
    for g, (root, end) in enumerate(zip(roots.tolist(), ends.tolist())):
        t = vp.types[g]
        if not (len(vp.images[g]) or len(vp.videos[g]) or t.any()):
            continue
        p0, plen = int(forest.src[root]), int(forest.length[root])
        kids = range(root + 1, end)
        tail = max((int(forest.length[k]) for k in kids), default=0)
        seconds = fields.get("second_per_grid_ts", [None] * (g + 1))[g]
        seconds = None if seconds is None else torch.as_tensor(seconds).reshape(-1)
        walk = sample_rows(np.concatenate([t, np.zeros(tail, np.int64)]), vp.images[g],
                           video_grids_for_rope(vp.videos[g], vp.spec), seconds, vp.spec, f"prompts[{g}]").T
        rows[p0:p0 + plen] = walk[:plen]
        types[p0:p0 + plen] = t
        for k in kids:  # a completion: the walk's text positions after the prompt
            c0, clen = int(forest.src[k]), int(forest.length[k])
            rows[c0:c0 + clen] = walk[plen:plen + clen]
    return rows, types


def _packed_index(layout) -> tuple[np.ndarray, np.ndarray]:
    """(flat packed slot, source token offset) of every packed token."""
    n = layout.length
    within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    return np.repeat(layout.dst, n) + within, np.repeat(layout.src, n) + within


def _visual_tokens(grids: np.ndarray, spec: MRopeSpec) -> int:
    m = spec.spatial_merge_size
    return int((grids[:, 0] * (grids[:, 1] // m) * (grids[:, 2] // m)).sum()) if len(grids) else 0


def vision_batch(vp: VisionPrompts, src_rows: np.ndarray, src_types: np.ndarray, prompt_src: np.ndarray,
                 group_sizes: np.ndarray, forest: PrefixForest, layout, text_positions: torch.Tensor,
                 device) -> tuple[dict, VisionReport]:
    """The batch's new entries: ``position_ids`` ``[4, R, S]``, ``mm_token_type_ids`` ``[R, S]`` and each packed
    prompt copy's vision tensors in packed order; and the :class:`VisionReport`.

    ``prompt_src[g]``: where group ``g``'s prompt starts in ``forest.tokens`` (a packed root with tokens is a copy
    of the prompt starting there: splits keep ``src``)."""
    rows_shape = tuple(text_positions.shape)
    slots = int(np.prod(rows_shape))
    dst, src = _packed_index(layout)
    rows = np.full((slots, 3), -1, np.int64)
    rows[dst] = src_rows[src]
    types = np.zeros(slots, np.int64)
    types[dst] = src_types[src]
    rows_t = to_device(torch.from_numpy(rows.T.copy()).view(3, *rows_shape), device)
    out = {"position_ids": _stack_positions(text_positions, rows_t),
           "mm_token_type_ids": to_device(torch.from_numpy(types).view(rows_shape), device)}
    # Which group each packed prompt copy is, in packed order (a root with tokens: its src is its prompt's).
    group_of = {int(s): g for g, s in enumerate(prompt_src.tolist())
                if len(vp.images[g]) or len(vp.videos[g])}
    copies = [group_of[int(forest.src[k])] for k in layout.order.tolist()
              if forest.parent[k] < 0 and forest.length[k] > 0 and int(forest.src[k]) in group_of]
    for name, values in vp.fields.items():
        parts = [torch.as_tensor(values[g]) for g in copies if values[g] is not None]
        if name == "second_per_grid_ts":
            parts = [p.reshape(-1) for p in parts]
        if name.endswith("grid_thw"):
            parts = [p.reshape(-1, 3).to(torch.int64) for p in parts]
        if parts:
            out[name] = to_device(torch.cat(parts), device)
    n_img = np.array([len(a) for a in vp.images], np.int64)
    n_vid = np.array([len(a) for a in vp.videos], np.int64)
    copies = np.array(copies, np.int64)
    tok = np.array([_visual_tokens(a, vp.spec) + _visual_tokens(b, vp.spec) for a, b in zip(vp.images, vp.videos)],
                   np.int64)
    report = VisionReport(np.repeat(copies, n_img[copies]) if len(copies) else np.zeros(0, np.int64),
                          np.repeat(copies, n_vid[copies]) if len(copies) else np.zeros(0, np.int64),
                          int(n_img[copies].sum()), int((n_img * group_sizes).sum()),
                          int(n_vid[copies].sum()), int((n_vid * group_sizes).sum()),
                          int(tok[copies].sum()), int((tok * group_sizes).sum()),
                          int(n_img[copies].sum() - n_img.sum()))
    return out, report
