"""Reading one example into pieces: its token ids checked and converted, the over-long policy applied.

A piece is ``(source position, first token, ids int64 array, labels int64 array or None, other fields
of the example {name: value} or None)``; see :mod:`packkit.packing.fields` for the other fields.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Optional

import numpy as np
import torch

from ...packing.tensors import first_dim


def token_array(value, position: int, what: str) -> np.ndarray:
    """A 1-D int64 array of token ids, or TypeError/ValueError naming the example."""
    where = f"example {position}: {what}"
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            raise TypeError(f"{where} must be integer token ids, got a tensor of dtype {value.dtype}")
        if value.dim() != 1:
            raise ValueError(f"{where} must be 1-D, got a tensor of shape {tuple(value.shape)}")
        return value.detach().cpu().to(torch.int64).numpy()
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{where} is a {type(value).__name__}; examples must be tokenized (integer token ids)")
    if isinstance(value, np.ndarray):
        array = value
    else:
        if not hasattr(value, "__len__"):
            raise TypeError(f"{where} must be a list, array or tensor of token ids, got {type(value).__name__}")
        if len(value) == 0:
            return np.zeros(0, np.int64)
        try:
            array = np.asarray(value)
        except (ValueError, OverflowError, TypeError) as exc:
            raise TypeError(f"{where} must be a flat sequence of integer token ids ({exc})") from None
    if array.ndim != 1:
        raise ValueError(f"{where} must be 1-D, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        if array.size == 0:
            return np.zeros(0, np.int64)
        if array.dtype.kind == "O":
            bad = next((i for i, x in enumerate(array)
                        if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral)), None)
            if bad is None:
                raise ValueError(f"{where} token ids must fit in int64")
            raise TypeError(f"{where} must be integer token ids; token {bad} is "
                            f"{type(array[bad]).__name__} {array[bad]!r}")
        raise TypeError(f"{where} must be integer token ids, got dtype {array.dtype}")
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{where} token ids must fit in int64")
    return array.astype(np.int64, copy=False)


def example_pieces(position: int, example, stats: Optional[dict], *, input_key: str, label_key: Optional[str],
                   capacity: int, overlong: str) -> list:
    """The example's pieces under the over-long policy (none if dropped or empty); counts into ``stats``."""
    if isinstance(example, Mapping):
        if input_key not in example:
            raise ValueError(f"example {position} has no {input_key!r} key (keys: "
                             f"{', '.join(map(repr, example))}); set input_key=... to the token-id field")
        ids = token_array(example[input_key], position, input_key)
        labels = example.get(label_key) if label_key is not None else None
        if labels is not None:
            labels = token_array(labels, position, label_key)
            if len(labels) != len(ids):
                raise ValueError(f"example {position} has {len(ids)} {input_key} but {len(labels)} "
                                 f"{label_key}")
        extras = {k: v for k, v in example.items() if k != input_key and k != label_key} or None
        if extras and "attention_mask" in extras:  # all ones: accepted, not needed (checked here, per example)
            mask = extras.pop("attention_mask")
            if mask is not None and (token_array(mask, position, "attention_mask") != 1).any() \
                    or mask is not None and len(mask) != len(ids):
                raise ValueError(f"example {position}: attention_mask is not all ones (padding inside an example); "
                                 f"packed rows need unpadded examples: remove the padding upstream")
            extras = extras or None
    else:
        if isinstance(example, (numbers.Number, str, bytes)) or example is None:
            raise TypeError(f"example {position} is a {type(example).__name__}; examples must be dicts with "
                            f"{input_key!r} or sequences of token ids")
        ids, labels, extras = token_array(example, position, "the token sequence"), None, None
    if len(ids) and int(ids.min()) < 0:  # pack_sequences refuses it too; here the message names the example
        raise ValueError(f"example {position}: token id {int(ids.min())} is negative; token ids index the "
                         f"embedding and must be >= 0")
    n, cap = len(ids), capacity
    if stats is not None:
        stats["examples"] += 1
    if n == 0:
        if stats is not None:
            stats["zero_length"] += 1
        return []
    if n <= cap:
        return [(position, 0, ids, labels, extras)]
    if overlong == "error":
        raise ValueError(f"example {position} has {n} tokens, more than capacity={cap}; pass "
                         f"overlong='drop', 'truncate' or 'split' to handle over-long examples")
    if stats is not None:
        stats[{"drop": "dropped", "truncate": "truncated", "split": "split"}[overlong]] += 1
    if overlong == "drop":
        return []
    if extras:
        whole = [k for k, v in extras.items() if v is not None and first_dim(v) != n]
        if whole:
            raise ValueError(f"example {position} has {n} tokens, more than capacity={cap}, and field(s) "
                             f"{', '.join(map(repr, whole))} that are not per-token, so it cannot be "
                             f"{overlong}d (a vision block or per-example value would be cut or repeated); "
                             f"use overlong='drop' or a larger capacity")
    if overlong == "truncate":
        return [(position, 0, ids[:cap], None if labels is None else labels[:cap],
                 extras and {k: None if v is None else v[:cap] for k, v in extras.items()})]
    return [(position, s, ids[s:s + cap], None if labels is None else labels[s:s + cap],
             extras and {k: None if v is None else v[s:s + cap] for k, v in extras.items()})
            for s in range(0, n, cap)]
