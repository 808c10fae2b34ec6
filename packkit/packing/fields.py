"""Fields beside ``input_ids``: classified, then packed exactly like the ids or refused — never dropped silently.

A field of a batch of samples (``{name: [value of sample 0, value of sample 1, ...]}``) is one of:

* **per-token**: every sample's value is a sequence/array/tensor as long as that sample's ``input_ids``
  (``token_type_ids``, ``mm_token_type_ids``, ``completion_mask``, loss weights, ...). It is packed with the
  same plan and layout as the ids by ``torch.ops.packkit.pack`` (any dtype, trailing dims kept), padding
  gets the field's pad value (``pad_values={name: value}``, default 0).
* ``attention_mask``: all ones is accepted and not returned (packed batches carry documents in
  ``position_ids`` / ``cu_seq_lens``); a zero inside a sample is an upstream padding bug and raises.
* **vision** (``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``,
  ``second_per_grid_ts``): per-sample tensors concatenated in packed order by :mod:`packkit.multimodal`.
* ``input_ids``, ``labels`` (a stale column beside the collator's ``input_key`` / ``label_key``), ``position_ids``,
  ``seq_idx``, ``cu_seq_lens_*``, ``max_length_*`` (and a caller's ``reserved`` names, e.g. CP's ``shift_labels``):
  packkit computes them; ValueError unless ``extra_fields="drop"``.
* anything else: ``extra_fields="error"`` (default) raises ValueError naming the field and its shape;
  ``"drop"`` leaves it out on purpose; ``"keep"`` returns it as a list with one entry per packed segment,
  in packed order.
"""
from __future__ import annotations

import functools
import numbers
from typing import NamedTuple, Optional

import numpy as np
import torch

from .multimodal import mrope_spec, pack_multimodal
from .multimodal.mrope import token_types
from .checks import check_fill
from .tensors import describe, first_dim, to_device, to_tensor

EXTRA_FIELD_POLICIES = ("error", "drop", "keep")
VISION_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
# Keys a packed batch produces itself; a sample field of the same name would be overwritten.
OUTPUT_KEYS = ("position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
# The packed ids and labels: a field of that name would replace them (a stale input_ids / labels column).
TOKEN_KEYS = ("input_ids", "labels")


class SortedFields(NamedTuple):
    """A batch's extra fields by kind (see the module docstring)."""

    token: dict  # name -> flat [sum(lengths), *f] tensor (source order)
    vision: dict  # name -> list of per-sample values (None where a sample has none)
    keep: dict  # name -> list of per-sample values
    dropped: tuple  # names left out on purpose (extra_fields="drop", all-ones attention_mask)


def check_policy(extra_fields: str) -> str:
    if extra_fields not in EXTRA_FIELD_POLICIES:
        raise ValueError(f"unknown extra_fields policy {extra_fields!r}; allowed: {', '.join(EXTRA_FIELD_POLICIES)}")
    return extra_fields


def check_pad_values(pad_values) -> dict:
    if pad_values is None:
        return {}
    if not isinstance(pad_values, dict):
        raise TypeError(f"pad_values must be a dict {{field: value}}, got {type(pad_values).__name__}")
    for name, value in pad_values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"pad_values[{name!r}] must be a number, got {type(value).__name__} {value!r}")
    return dict(pad_values)


def flatten_token_field(name: str, values: list) -> torch.Tensor:
    """Per-sample per-token values -> one flat ``[sum(lengths), *f]`` tensor (one concatenation)."""
    if all(isinstance(v, torch.Tensor) for v in values):
        parts = list(values)
    else:
        parts = [to_tensor(v, name, i) for i, v in enumerate(values)]
    trailing = {tuple(p.shape[1:]) for p in parts}
    if len(trailing) > 1:
        raise ValueError(f"field {name!r}: samples disagree on the per-token shape ({sorted(trailing)})")
    dtypes = {p.dtype for p in parts}
    if len(dtypes) > 1:
        dtype = functools.reduce(torch.promote_types, dtypes)
        parts = [p.to(dtype) for p in parts]
    return torch.cat(parts) if parts else torch.zeros(0)


def sort_fields(fields: dict, lengths: np.ndarray, *, extra_fields: str = "error", vision: bool = True,
                token_names=(), reserved=()) -> SortedFields:
    """Classify ``fields`` ({name: per-sample values, or a flat ``[sum(lengths), *f]`` tensor}).

    ``token_names`` are always per-token (their lengths must match); ``vision=False`` treats the vision
    names like any other field; ``reserved`` names more output keys of the caller (``shift_labels``, ...).
    Raises ValueError for anything not allowed (see the module docstring).
    """
    check_policy(extra_fields)
    n = len(lengths)
    total = int(lengths.sum())
    token, vis, keep, dropped = {}, {}, {}, []
    for name, values in fields.items():
        if name in TOKEN_KEYS or name in reserved:
            if extra_fields == "drop":
                dropped.append(name)
                continue
            raise ValueError(f"field {name!r} would overwrite the packed batch's {name!r}, which packkit builds "
                             f"from the input ids and labels it is given; remove it (e.g. a stale column beside "
                             f"input_key/label_key) or pass extra_fields='drop'")
        if name in OUTPUT_KEYS:
            if extra_fields == "drop":
                dropped.append(name)
                continue
            raise ValueError(f"field {name!r} is computed by packkit for the packed batch (per packed segment); "
                             f"remove it from the samples or pass extra_fields='drop'")
        if isinstance(values, torch.Tensor):  # a flat source, like input_ids with lengths=
            if values.dim() < 1 or values.shape[0] != total:
                raise ValueError(f"field {name!r}: a flat tensor must have sum(lengths)={total} rows, got shape "
                                 f"{tuple(values.shape)}")
            _take_token_field(name, values, lengths, token, dropped)
            continue
        if not isinstance(values, (list, tuple)) or len(values) != n:
            raise ValueError(f"field {name!r} must hold one value per sample ({n}), got {describe(values)}")
        if vision and name in VISION_FIELDS:
            vis[name] = list(values)
            continue
        present = [v is not None for v in values]
        dims = [(first_dim(v) if v is not None else None) for v in values]
        per_token = all(present) and all(d == int(l) for d, l in zip(dims, lengths))
        if name == "attention_mask" or name in token_names:
            if not per_token:
                i = next(i for i, (d, l) in enumerate(zip(dims, lengths)) if d != int(l))
                what = "is missing" if values[i] is None else f"is {describe(values[i])}"
                raise ValueError(f"sample {i}: field {name!r} {what} but input_ids has {int(lengths[i])} tokens; "
                                 f"a per-token field needs one entry per token")
            _take_token_field(name, flatten_token_field(name, values), lengths, token, dropped)
            continue
        if per_token and n:
            token[name] = flatten_token_field(name, values)
        elif extra_fields == "drop":
            dropped.append(name)
        elif extra_fields == "keep":
            keep[name] = list(values)
        else:
            i = next((i for i, (d, l) in enumerate(zip(dims, lengths)) if d != int(l)), 0)
            shape = describe(values[i]) if values[i] is not None else "missing"
            raise ValueError(f"field {name!r} is not per-token (sample {i}: {shape}, input_ids has {int(lengths[i])} "
                             f"tokens) and packkit does not know it; pass extra_fields='drop' to leave it out, "
                             f"extra_fields='keep' to get it back as a list in packed order, or make it per-token "
                             f"(extra_fields='error' is the default)")
    return SortedFields(token, vis, keep, tuple(dropped))


def _take_token_field(name: str, flat: torch.Tensor, lengths: np.ndarray, token: dict, dropped: list) -> None:
    """A flat per-token field: packed, or (attention_mask) checked to be all ones and left out."""
    if name == "attention_mask":
        _check_all_ones(flat, name, lengths)
        dropped.append(name)
    else:
        token[name] = flat


def _check_all_ones(mask: torch.Tensor, name: str, lengths: np.ndarray) -> None:
    if mask.numel() == 0:  # no tokens (reshape(0, -1) would be ambiguous): nothing to check
        return
    zeros = torch.nonzero(mask.reshape(mask.shape[0], -1).ne(1).any(-1)).flatten()
    if len(zeros):
        token = int(zeros[0])
        sample = int(np.searchsorted(np.cumsum(lengths), token, side="right"))
        raise ValueError(f"sample {sample}: {name} has a 0 (padding inside a sample); a packed batch needs unpadded "
                         f"samples: remove the padding upstream (packed batches mark documents by position_ids / "
                         f"cu_seq_lens, and an all-ones {name} is accepted and not returned)")


def pack_token_fields(token: dict, pad_values: dict, info, op) -> dict:
    """Pack each flat per-token field with the plan and layout of ``info`` (a ``PackInfo``): one op call each."""
    shape = info.layout
    out = {}
    for name, flat in token.items():
        check_fill(pad_values.get(name, 0), flat.dtype, f"pad_values[{name!r}]")
        src = to_device(flat.contiguous(), info.cu_seqlens.device)
        packed = op(src, info.src_offsets, info.seg_seq, info.seg_start, info.cu_seqlens, info.cu_seg,
                    shape.num_rows, shape.row_len, shape.flat, float(pad_values.get(name, 0)))
        out[name] = packed.unsqueeze(0) if shape.flat else packed
    return out


def keep_in_packed_order(keep: dict, segments) -> dict:
    """``extra_fields="keep"``: one entry per packed segment (the sample's value), in packed order."""
    order = segments.seq_index.tolist()
    return {name: [values[i] for i in order] for name, values in keep.items()}


def prepare_fields(fields, lengths: np.ndarray, flat_ids: torch.Tensor, *, extra_fields: str, pad_values, mrope,
                   reserved=()):
    """(SortedFields, pad values, MRopeSpec or None) for ``pack_sequences``, checked before any packing."""
    pad_values = check_pad_values(pad_values)
    spec = None
    if mrope is not None:

        spec = mrope_spec(mrope)
    if fields is None:
        fields = {}
    if not isinstance(fields, dict):
        raise TypeError(f"fields must be a dict {{name: per-sample values}}, got {type(fields).__name__}")
    token_names = ("mm_token_type_ids",) if spec is not None else ()
    types = fields.get("mm_token_type_ids")
    if spec is not None and isinstance(types, (list, tuple)) and any(v is None for v in types):
        # Samples without mm_token_type_ids (e.g. text-only ones): derived from the token ids, as processors do.

        offsets = np.concatenate(([0], np.cumsum(lengths))).tolist()
        fields = dict(fields, mm_token_type_ids=[
            v if v is not None else token_types(flat_ids[offsets[i]:offsets[i + 1]], spec)
            for i, v in enumerate(types)])
    return (sort_fields(fields, lengths, extra_fields=extra_fields, token_names=token_names, reserved=reserved),
            pad_values, spec)


def pack_fields(batch: dict, info, flat_ids: torch.Tensor, lengths: np.ndarray, sorted_fields: SortedFields,
                pad_values: dict, spec, op) -> None:
    """Add the packed extra fields (and, with ``spec``, ``[4, B, L]`` mRoPE positions) to ``batch``."""
    batch.update(pack_token_fields(sorted_fields.token, pad_values, info, op))
    if sorted_fields.vision or spec is not None:

        batch.update(pack_multimodal(batch, info, flat_ids, lengths, sorted_fields.token, sorted_fields.vision,
                                     spec, op))
    batch.update(keep_in_packed_order(sorted_fields.keep, info.segments))
