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

from ..packing.multimodal.mrope import MRopeSpec, mrope_spec, sample_rows, token_types, video_grids_for_rope
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
    name: str = "prompts"  # the argument they came from (for messages)


class VisionReport(NamedTuple):
    """What the batch's vision inputs hold (``info.vision``).

    Attributes:
        image_groups, video_groups: where each image / video of the batch came from, in batch order: its group
            (``pack_groups``) or the first sequence holding it (``pack_tree``).
        images_forwarded, videos_forwarded: images / videos the vision tower encodes for this batch.
        images_unshared, videos_unshared: what packing every sequence on its own would encode (each prompt's
            images x its completions; each conversation's images).
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


def split_prompts(prompts, mrope, name: str = "prompts") -> tuple[list, Optional[VisionPrompts]]:
    """``(token prompts, vision)`` (``name``: the argument, for messages): dict prompts -> their ``input_ids`` and
    the checked vision inputs (None when no prompt is a vision-language one and ``mrope`` is None: the plain token
    path, unchanged)."""
    if isinstance(prompts, (str, bytes, dict)) or not hasattr(prompts, "__len__"):
        return prompts, None  # groups_forest names the type error
    dicts = [g for g, p in enumerate(prompts) if isinstance(p, dict)]
    if not dicts and mrope is None:
        return prompts, None
    for g in dicts:
        unknown = sorted(set(prompts[g]) - set(PROMPT_KEYS))
        if unknown:
            raise ValueError(f"{name}[{g}] has key(s) {unknown}; a prompt dict may hold {', '.join(PROMPT_KEYS)}")
        if "input_ids" not in prompts[g]:
            raise ValueError(f"{name}[{g}] is a dict without 'input_ids'")
        mask = prompts[g].get("attention_mask")
        if mask is not None and not bool((torch.as_tensor(mask) == 1).all()):
            raise ValueError(f"{name}[{g}]['attention_mask'] holds zeros: a prompt is one unpadded sample; drop its "
                             "padding (or the mask)")
    if mrope is None:
        with_vision = [g for g in dicts if set(prompts[g]) & set(VISION_KEYS + ("mm_token_type_ids",))]
        if with_vision:
            g = with_vision[0]
            raise ValueError(f"{name}[{g}] holds vision inputs ({', '.join(sorted(set(prompts[g]) - {'input_ids'}))})"
                             " but mrope= was not given: pass mrope=model.config (a Qwen2-VL, Qwen2.5-VL or Qwen3-VL "
                             "config) so the image tokens get the model's 3-D positions")
        return [p["input_ids"] if isinstance(p, dict) else p for p in prompts], None
    spec = mrope_spec(mrope)
    ids = [_ids_1d(p["input_ids"], f"{name}[{g}]['input_ids']") if isinstance(p, dict) else p
           for g, p in enumerate(prompts)]
    n = len(prompts)
    present = sorted({k for g in dicts for k in prompts[g]} & set(VISION_KEYS), key=VISION_KEYS.index)
    fields = {k: [prompts[g].get(k) if isinstance(prompts[g], dict) else None for g in range(n)] for k in present}
    for pix, grid in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
        given = [g for g in range(n) if fields.get(pix, [None] * n)[g] is not None]
        if given and grid not in fields:  # check_vision lets grid-less pixels through (LLaVA); a Qwen-VL needs them
            raise ValueError(f"{name}[{given[0]}] has {pix} but no {grid}: with mrope= (a Qwen-VL config) the model "
                             f"splits the pixels into images by their grids; pass the processor's {grid} too "
                             f"(without it the pixels would be dropped)")
    try:
        images, videos = check_vision(fields, n)
    except ValueError as e:  # its messages say "sample i": here that is prompts[i]
        raise ValueError(f"{name} (sample i = {name}[i]): {e}") from None
    types = []
    for g, p in enumerate(prompts):
        tokens = _as_tensor(ids[g])
        if tokens.dim() != 1 or tokens.is_floating_point() or tokens.dtype == torch.bool:
            types.append(None)  # groups_forest refuses it, naming prompts[g]
            continue
        given = p.get("mm_token_type_ids") if isinstance(p, dict) else None
        types.append(_prompt_types(tokens.cpu(), given, spec, f"{name}[{g}]"))
    return ids, VisionPrompts(spec, types, images, videos, fields, name)


def _prompt_types(tokens: torch.Tensor, given, spec: MRopeSpec, where: str) -> np.ndarray:
    """The prompt's token types: as given (checked against the image / video token ids) or from the ids."""
    if given is None:
        return token_types(tokens, spec).numpy()
    t = _as_tensor(_ids_1d(given, f"{where}['mm_token_type_ids']"))
    if t.dim() != 1 or t.is_floating_point() or t.dtype == torch.bool or len(t) != len(tokens):
        raise ValueError(f"{where}['mm_token_type_ids'] must be integers, one per input_ids token "
                         f"({len(tokens)}); got {t.dtype} of shape {tuple(t.shape)}")
    types = t.cpu().numpy().astype(np.int64)
    ids = tokens.numpy()
    for kind, token in ((1, spec.image_token_id), (2, spec.video_token_id)):
        if token is not None:
            bad = np.flatnonzero((ids == token) != (types == kind))
            if len(bad):
                raise ValueError(f"{where}: token {int(bad[0])} disagrees between input_ids (id {token} marks "
                                 f"{'image' if kind == 1 else 'video'} tokens) and mm_token_type_ids")
    return types


def check_text_tokens(forest: PrefixForest, spec: MRopeSpec, pad_id: int, tree: bool = False) -> None:
    """Completions are text: an image / video token id there (or as ``pad_id``) would make the model scatter a
    feature into it that no image supplies. Host tokens only (device tokens are not read back)."""
    marks = [t for t in (spec.image_token_id, spec.video_token_id) if t is not None]
    if pad_id in marks:
        raise ValueError(f"pad_id={pad_id} is the model's image/video token id; pass another pad_id")
    if forest.tokens.device.type != "cpu" or tree:  # a tree's image tokens all come from its vision blocks
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


class VisionItem(NamedTuple):
    """One image or video of one prompt / sequence (``unit``), with its token span there."""

    unit: int
    kind: int  # 1 image, 2 video
    pixels: torch.Tensor
    grid: torch.Tensor  # [1, 3]
    seconds: Optional[torch.Tensor]  # [1] (Qwen2.5-VL videos), else None
    start: int  # first token of its block(s) in the unit
    end: int  # one past its last token
    tokens: int  # merged visual tokens


def unit_items(vp: VisionPrompts, u: int) -> list:
    """The images and videos of prompt / sequence ``u`` in token order (pixels split by their grids)."""
    t = vp.types[u]
    if t is None or not len(t):
        return []
    bounds = np.flatnonzero(t[1:] != t[:-1]) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(t)]))
    runs = {k: [(int(a), int(b)) for a, b in zip(starts, ends) if t[a] == k] for k in (1, 2)}
    m = vp.spec.spatial_merge_size
    seconds = vp.fields.get("second_per_grid_ts", [None] * (u + 1))[u]
    seconds = None if seconds is None else torch.as_tensor(seconds).reshape(-1)
    out = []
    for kind, grids, pix in ((1, vp.images[u], "pixel_values"), (2, vp.videos[u], "pixel_values_videos")):
        rows = np.concatenate(([0], np.cumsum(grids.prod(-1)))) if len(grids) else [0]
        frames = grids[:, 0] if kind == 2 and vp.spec.frames_as_grids else np.ones(len(grids), np.int64)
        first_run = np.concatenate(([0], np.cumsum(frames))) if len(grids) else [0]
        for j, grid in enumerate(grids):
            span = runs[kind][int(first_run[j]):int(first_run[j + 1])]  # sample_rows checked the counts
            out.append(VisionItem(u, kind, torch.as_tensor(vp.fields[pix][u])[int(rows[j]):int(rows[j + 1])],
                                  torch.from_numpy(grid.reshape(1, 3).copy()),
                                  seconds[j:j + 1] if kind == 2 and seconds is not None else None,
                                  span[0][0], span[-1][1], int(grid[0] * (grid[1] // m) * (grid[2] // m))))
    return sorted(out, key=lambda item: item.start)


def unit_rows(vp: VisionPrompts, u: int, tail: int = 0) -> Optional[np.ndarray]:
    """``[L + tail, 3]`` mRoPE rows of prompt / sequence ``u`` followed by ``tail`` text tokens (the model's walk);
    None for a unit with no vision (its rows are its text positions). Raises ValueError naming the unit when its
    tokens and grids disagree."""
    t = vp.types[u]
    if not (len(vp.images[u]) or len(vp.videos[u]) or t.any()):
        return None
    seconds = vp.fields.get("second_per_grid_ts", [None] * (u + 1))[u]
    seconds = None if seconds is None else torch.as_tensor(seconds).reshape(-1)
    return sample_rows(np.concatenate([t, np.zeros(tail, np.int64)]), vp.images[u],
                       video_grids_for_rope(vp.videos[u], vp.spec), seconds, vp.spec, f"{vp.name}[{u}]").T


def group_sources(vp: VisionPrompts, forest: PrefixForest) -> tuple:
    """For a :func:`groups_forest` forest (root g is group g's prompt, its children its completions):
    ``(rows [len(tokens), 3], types [len(tokens)], node_items, seq_items)`` -- mRoPE rows and token types
    parallel to ``forest.tokens`` (-1 rows: text-only groups), the items each prompt node carries (by its ``src``)
    and the items each sequence sees. A completion's rows are the walk's text positions after its prompt."""
    total = len(forest.tokens)
    rows = np.full((total, 3), -1, np.int64)
    types = np.zeros(total, np.int64)
    roots = forest.roots()
    ends = np.append(roots[1:], forest.num_nodes)
    node_items, seq_items = {}, [None] * forest.num_sequences
    seq_of_node = {int(k): s for s, k in enumerate(forest.seq_node)}
    for g, (root, end) in enumerate(zip(roots.tolist(), ends.tolist())):
        kids = range(root + 1, end)
        walk = unit_rows(vp, g, max((int(forest.length[k]) for k in kids), default=0))  # checks tokens vs grids
        if walk is None:
            continue
        items = unit_items(vp, g)
        for k in kids:
            seq_items[seq_of_node[k]] = items
        p0, plen = int(forest.src[root]), int(forest.length[root])
        rows[p0:p0 + plen] = walk[:plen]
        types[p0:p0 + plen] = vp.types[g]
        if items:
            node_items[p0] = items
        for k in kids:  # a completion: the walk's text positions after the prompt
            c0, clen = int(forest.src[k]), int(forest.length[k])
            rows[c0:c0 + clen] = walk[plen:plen + clen]
    return rows, types, node_items, seq_items


def _packed_index(layout) -> tuple[np.ndarray, np.ndarray]:
    """(flat packed slot, source token offset) of every packed token."""
    n = layout.length
    within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    return np.repeat(layout.dst, n) + within, np.repeat(layout.src, n) + within


def vision_batch(sources: tuple, forest: PrefixForest, layout, text_positions: torch.Tensor,
                 device) -> tuple[dict, VisionReport]:
    """The batch's new entries: ``position_ids`` ``[4, R, S]``, ``mm_token_type_ids`` ``[R, S]`` and the vision
    tensors of every packed node that carries images, in packed order; and the :class:`VisionReport`.

    ``sources``: :func:`group_sources` / ``tree_sources``' ``(rows, types, node_items, seq_items)``; a packed node
    with tokens carries ``node_items[its src]`` (splits copy a node with its ``src``, so a copy carries them again)."""
    src_rows, src_types, node_items, seq_items = sources
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
    carried = [item for p, k in enumerate(layout.order.tolist()) if layout.length[p] > 0
               for item in node_items.get(int(forest.src[k]), ())]
    images = [i for i in carried if i.kind == 1]
    videos = [i for i in carried if i.kind == 2]
    for (pix, grid), items in zip((("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")),
                                  (images, videos)):
        if items:
            out[pix] = to_device(torch.cat([i.pixels for i in items]), device)
            out[grid] = to_device(torch.cat([i.grid for i in items]).to(torch.int64), device)
    if videos and any(i.seconds is not None for i in videos):
        if any(i.seconds is None for i in videos):
            raise ValueError("second_per_grid_ts is given for some videos but not others; give it for every video "
                             "prompt (or none)")
        out["second_per_grid_ts"] = to_device(torch.cat([i.seconds for i in videos]), device)
    seen = [item for items in seq_items if items for item in items]
    report = VisionReport(np.array([i.unit for i in images], np.int64), np.array([i.unit for i in videos], np.int64),
                          len(images), sum(i.kind == 1 for i in seen), len(videos), sum(i.kind == 2 for i in seen),
                          sum(i.tokens for i in carried), sum(i.tokens for i in seen),
                          len(images) - len({id(i) for i in images}))
    return out, report
