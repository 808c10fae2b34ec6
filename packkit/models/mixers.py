"""Per-document forward for recurrent mixers whose layers get no document boundaries from transformers (Mamba-1:
``MambaMixer``, ``FalconMambaMixer``, ``JambaMambaMixer``; they call ``selective_scan_fn`` / ``mamba_inner_fn``
without ``seq_idx``; Mamba-2 ``Mamba2Mixer``: transformers 5.25 passes the call's keywords to the backbone, but
the mixer reads no boundaries from them).

The model's forward pre-hook (``prepare.py``) keeps the call's ``cu_seq_lens_q`` / ``seq_idx`` / ``position_ids``;
each mixer then runs its own forward once per document, from a zero state, and concatenates: exact against each
document run alone by construction. Under gradient checkpointing the recomputation in backward sees the boundaries of
the forward it repeats (they are replaced only by the next forward), and a stale set is refused by its token count.

The forward is a method bound to the mixer and the state an attribute of it, not a closure over either: a deepcopy of
a prepared model (a reference or EMA model) then runs its own weights and its own boundaries.
"""
from __future__ import annotations

import types

import torch

from .documents import BOUNDARY_KEYS, document_spans, spans_from_position_ids


def _spans(state, rows: int, length: int, where: str):
    bounds = state.boundaries
    spans = document_spans({"cu_seq_lens_q": bounds.get("cu_seq_lens_q"), "seq_idx": bounds.get("seq_idx")},
                           rows, length, where)
    if spans is None and isinstance(bounds.get("position_ids"), torch.Tensor):
        spans = spans_from_position_ids(bounds["position_ids"], rows, length, where)
    return spans


def _forward(self, hidden_states, *args, **kwargs):
    state = self._packkit_state
    original = type(self).forward.__get__(self)
    where = f"{type(self).__name__} (packkit per-document)"
    rows, length = hidden_states.shape[:2]
    spans = _spans(state, rows, length, where)
    if spans is None:
        return original(hidden_states, *args, **kwargs)
    cache = kwargs.get("cache", kwargs.get("cache_params", args[0] if args else None))
    if cache is not None:
        raise ValueError(f"{where}: a packed call with a cache is refused: each document starts from a zero state "
                         "(call the model with use_cache=False)")
    mask = kwargs.pop("attention_mask", None)
    if mask is not None and not (isinstance(mask, torch.Tensor) and tuple(mask.shape) == (rows, length)):
        raise ValueError(f"{where}: a packed call with an attention_mask of shape "
                         f"{tuple(getattr(mask, 'shape', ()))} is refused (a packkit batch has none)")
    # each call is one document: the batch's boundaries (transformers >= 5.25 hands them to the mixer, which
    # hands them to its conv / scan kernels) describe the whole row, not the part
    kwargs = {k: v for k, v in kwargs.items() if k not in BOUNDARY_KEYS}
    outputs = [[] for _ in range(rows)]
    for row, start, end in spans:
        part = hidden_states[row:row + 1, start:end]
        doc_mask = None if mask is None else mask[row:row + 1, start:end]
        outputs[row].append(original(part, *args, attention_mask=doc_mask, **kwargs))
    return torch.cat([torch.cat(parts, dim=1) for parts in outputs], dim=0)


def install_mixer(module: torch.nn.Module, state) -> None:
    module._packkit_state = state
    module.forward = types.MethodType(_forward, module)


def remove_mixer(module: torch.nn.Module) -> None:
    vars(module).pop("forward", None)
    vars(module).pop("_packkit_state", None)
