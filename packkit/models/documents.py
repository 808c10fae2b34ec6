"""Document spans of a packed batch, for layers that run one document at a time.

A packkit batch (``PackingCollator``, ``pack_sequences``) carries its documents three ways: ``cu_seq_lens_q`` (int32
offsets into the ``B * L`` tokens, flat or padded; a padded row's tail is a segment of its own), ``seq_idx`` (``[B, L]``,
one document index per token) and ``position_ids`` (restarting at 0). The recurrent layers' kernels take the first
two; a layer packkit runs per document needs them as host spans ``(row, start, end)``.
"""
from __future__ import annotations

from typing import Optional

import torch

BOUNDARY_KEYS = ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx", "max_length_q", "max_length_k",
                 "position_ids")

_LAST = {}  # one cached conversion: every layer of a forward passes the same boundary tensor


def _cached(tensor: torch.Tensor, rows: int, length: int, compute):
    key = (id(tensor), tensor._version, tuple(tensor.shape), rows, length)
    if _LAST.get("key") == key and _LAST.get("tensor") is tensor:
        return _LAST["spans"]
    spans = compute()
    _LAST.update(key=key, tensor=tensor, spans=spans)
    return spans


def spans_from_cu(cu: torch.Tensor, rows: int, length: int, where: str) -> list:
    """``[(row, start, end)]`` of the non-empty documents of offsets ``cu`` into ``rows * length`` tokens."""
    def compute():
        if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.is_floating_point() or cu.numel() < 2:
            raise ValueError(f"{where}: cu_seqlens must be a 1-D integer tensor [0, ..., tokens], got "
                             f"{type(cu).__name__} {tuple(getattr(cu, 'shape', ()))}")
        offsets = cu.detach().to("cpu", torch.int64).tolist()
        if offsets[0] != 0 or offsets[-1] != rows * length or any(b < a for a, b in zip(offsets, offsets[1:])):
            raise ValueError(f"{where}: cu_seqlens {offsets[:8]}{'...' if len(offsets) > 8 else ''} must rise from 0 "
                             f"to the batch's {rows} x {length} tokens")
        spans = []
        for a, b in zip(offsets, offsets[1:]):
            if b == a:
                continue
            row = a // length
            if (b - 1) // length != row:
                raise ValueError(f"{where}: the document [{a}, {b}) of cu_seqlens crosses a row of {length} tokens "
                                 "(a padded batch keeps each document in one row)")
            spans.append((row, a - row * length, b - row * length))
        return spans
    return _cached(cu, rows, length, compute)


def spans_from_seq_idx(seq_idx: torch.Tensor, rows: int, length: int, where: str) -> list:
    """``[(row, start, end)]``: runs of equal ``seq_idx`` in each row."""
    def compute():
        if not isinstance(seq_idx, torch.Tensor) or tuple(seq_idx.shape) != (rows, length):
            raise ValueError(f"{where}: seq_idx must be a [{rows}, {length}] tensor, got "
                             f"{tuple(getattr(seq_idx, 'shape', ()))}")
        spans = []
        for row, values in enumerate(seq_idx.detach().to("cpu", torch.int64).tolist()):
            start = 0
            for i in range(1, length + 1):
                if i == length or values[i] != values[start]:
                    spans.append((row, start, i))
                    start = i
        return spans
    return _cached(seq_idx, rows, length, compute)


def spans_from_position_ids(position_ids: torch.Tensor, rows: int, length: int, where: str) -> Optional[list]:
    """Documents where ``position_ids`` restart (a position not one above its predecessor); None when no row
    restarts (a plain batch)."""
    def compute():
        pos = position_ids.detach().to("cpu", torch.int64)
        if pos.dim() == 3:  # mRoPE [3 or 4, B, L]: the text row
            pos = pos[0]
        if pos.dim() == 1:
            pos = pos[None]
        if tuple(pos.shape) != (rows, length) and pos.shape[0] == 1 and rows > 1:
            pos = pos.expand(rows, length)
        if tuple(pos.shape) != (rows, length):
            raise ValueError(f"{where}: position_ids of shape {tuple(position_ids.shape)} do not match the batch's "
                             f"{rows} x {length} tokens")
        starts = torch.ones(rows, length, dtype=torch.bool)
        starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
        if not bool(starts[:, 1:].any()):
            return None
        spans = []
        for row in range(rows):
            cuts = starts[row].nonzero().flatten().tolist() + [length]
            spans += [(row, a, b) for a, b in zip(cuts, cuts[1:])]
        return spans
    return _cached(position_ids, rows, length, compute)


def document_spans(kwargs: dict, rows: int, length: int, where: str) -> Optional[list]:
    """The documents a call's keyword arguments describe (``cu_seqlens``, ``cu_seq_lens_q``, ``seq_idx``, in that
    order), or None when it carries no boundary information."""
    for key in ("cu_seqlens", "cu_seq_lens_q"):
        if kwargs.get(key) is not None:
            return spans_from_cu(kwargs[key], rows, length, where)
    if kwargs.get("seq_idx") is not None:
        return spans_from_seq_idx(kwargs["seq_idx"], rows, length, where)
    return None
