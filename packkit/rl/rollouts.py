"""``pack_rollouts`` / ``unpack_rollouts``: verl-style ``[B, S]`` rollouts -> one packed micro-batch on the device.

A rollout row is a left-padded prompt followed by a right-padded response, so its valid tokens are one run
``[start, start + length)``. :func:`rollout_layout` reads every row's run with **one** device-to-host copy
per global batch (``2 * B + 1`` int64s) and checks there that each mask is one run. Every micro-batch pack
after it is sync-free: the plan for the rows in ``indices`` (global row, run start, run length) goes to the
device in one non-blocking copy from pinned memory, and the existing pack ops (``packkit::pack_batch``,
``layout``, ``unpack_padded``: CPU, CUDA and Triton backends) read the ``[B, S]`` tensor as a flat source
whose sequence ``b`` starts at ``b * S`` -- no new kernel, no ``nonzero``, no output size read back.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from ..packing.checks import refuse_meta
from ..packing.sequences import _backend_for, _op, pack_layout, PackLayout
from ..packing.tensors import host_tensor, to_device
from ..planning.planner import Segments


class RolloutLayout(NamedTuple):
    """Where each row's valid tokens are (host numpy int64 arrays), from :func:`rollout_layout`."""

    start: np.ndarray  # [B] first valid column of each row (0 for an empty row)
    length: np.ndarray  # [B] valid tokens of each row (= attention_mask.sum(1))
    seq_len: int  # S


class RolloutInfo(NamedTuple):
    """What :func:`unpack_rollouts` needs (returned by :func:`pack_rollouts`)."""

    layout: PackLayout  # host shape facts of the packed micro-batch
    indices: np.ndarray  # the micro-batch's rows, in output order
    seq_len: int  # S
    local_seq: torch.Tensor  # device: position in ``indices`` of each packed row (non-empty rows)
    seg_start: torch.Tensor  # device: run start of each packed row
    cu_seqlens: torch.Tensor
    cu_seg: torch.Tensor
    status: Optional[torch.Tensor]  # device 0-d int32: 0, or rows whose mask is not the layout's run


def _check_mask_tensor(attention_mask) -> None:
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        raise TypeError(f"attention_mask must be a [batch, seq_len] tensor of 0/1 (bool or integer), got "
                        f"{type(attention_mask).__name__}"
                        f"{' of shape ' + str(tuple(attention_mask.shape)) if isinstance(attention_mask, torch.Tensor) else ''}")
    refuse_meta(attention_mask, "attention_mask")
    if attention_mask.is_complex():
        raise TypeError(f"attention_mask must hold 0/1 (bool, integer or float), got dtype {attention_mask.dtype}")


def _not_binary(mask: torch.Tensor) -> torch.Tensor:
    """bool, same shape: entries other than 0 and 1 (a mask of 2 or 0.5 is not a rollout mask)."""
    if mask.dtype == torch.bool:
        return torch.zeros_like(mask)
    return (mask != 0) & (mask != 1)


def rollout_layout(attention_mask: torch.Tensor) -> RolloutLayout:
    """Each row's run of valid tokens, with one device-to-host copy. Raises ValueError naming the rows whose
    mask is not a single run (verl rollouts are left-padded prompt + right-padded response) or holds a value
    other than 0 and 1."""
    return _read_layout(attention_mask)[0]


def _read_layout(attention_mask: torch.Tensor, input_ids: Optional[torch.Tensor] = None):
    """(:func:`rollout_layout`, and with ``input_ids`` a host bool ``[B]``: rows with a negative id at a valid
    position), both from the one device-to-host copy."""
    _check_mask_tensor(attention_mask)
    b, s = attention_mask.shape
    m = attention_mask != 0
    count = m.sum(1, dtype=torch.int64)
    first = m.to(torch.int8).argmax(1) if s else torch.zeros(b, dtype=torch.int64, device=m.device)
    last = (s - 1) - m.flip(1).to(torch.int8).argmax(1) if s else first
    broken = ((count > 0) & (last - first + 1 != count)).to(torch.int64)
    odd = _not_binary(attention_mask).any(1).to(torch.int64)
    negative = ((input_ids < 0) & m).any(1).to(torch.int64) if input_ids is not None else first[:0]
    host = torch.cat((first, count, negative, broken.sum().reshape(1), odd.sum().reshape(1))).cpu().numpy()  # one sync
    start, length = host[:b].copy(), host[b:2 * b].copy()
    start[length == 0] = 0
    if host[-1]:
        rows = np.flatnonzero(odd.cpu().numpy())
        raise ValueError(f"{len(rows)} rows of attention_mask hold a value other than 0 and 1 (first: row "
                         f"{int(rows[0])}); a rollout mask is 1 at valid tokens and 0 at padding")
    if host[-2]:
        rows = np.flatnonzero(broken.cpu().numpy())
        raise ValueError(f"{len(rows)} rows of attention_mask are not one run of valid tokens (first: row "
                         f"{int(rows[0])}); rollouts must be a left-padded prompt followed by a right-padded response")
    return RolloutLayout(start, length, s), (host[2 * b:3 * b] != 0 if input_ids is not None else None)


def _indices(indices, batch: int) -> np.ndarray:
    if isinstance(indices, torch.Tensor):
        if indices.device.type != "cpu":
            raise ValueError("indices must be on the host (numpy, list or a CPU tensor): they size the packed batch")
        indices = indices.numpy()
    idx = np.asarray(indices)
    if idx.ndim != 1:  # a scalar (a count passed for a list) or a 2-D array: reshape(-1) read it as rows
        raise TypeError(f"indices must be a 1-D sequence of row indices, got {idx.ndim}-d {type(indices).__name__}")
    if idx.dtype == object or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= batch):
        raise ValueError(f"indices name row {int(idx.max() if idx.max() >= batch else idx.min())} but the batch has "
                         f"{batch} rows")
    if len(np.unique(idx)) != len(idx):
        raise ValueError("indices name a row twice")
    return idx


def pack_rollouts(input_ids: torch.Tensor, attention_mask: torch.Tensor, indices: Sequence[int],
                  layout: Optional[RolloutLayout] = None, *, row_len: Optional[int] = None, check: bool = True,
                  position_ids_start: int = 0, backend: str = "auto"):
    """Pack rows ``indices`` of verl's ``[B, S]`` rollout tensors into one flat micro-batch on their device.

    Args:
        input_ids, attention_mask: ``[B, S]`` (left-padded prompt + right-padded response per row).
        indices: the micro-batch's rows (host ints, e.g. from :func:`packkit.rl.micro_batches`).
        layout: :func:`rollout_layout` of ``attention_mask``, computed once per global batch and shared by
            every micro-batch and pass (zero host syncs here). Without it, it is computed (one sync).
        row_len: static packed length (CUDA graphs, torch.compile): the tail is one padding segment.
        check: with a given ``layout``, also check the rows on the device, without a sync: each mask is the
            layout's run and holds only 0/1, and no valid token id is negative. ``info.status`` is a 0-d int32
            tensor, 0 when every row is right (read it at a natural sync, or call :func:`check_rollouts`).
            Without ``layout`` the same checks are read in the one copy that computes it, and raise here.
        backend: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"triton"`` (as :func:`packkit.pack_sequences`).

    Returns ``(batch, info)``: ``batch`` = ``{input_ids [1, T], position_ids [1, T] (restarting at
    position_ids_start in every row; verl's own positions for the valid tokens), cu_seq_lens_q/k (int32),
    max_length_q/k (host ints)}``; ``info`` for :func:`unpack_rollouts`.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise TypeError("input_ids must be a [batch, seq_len] tensor")
    if input_ids.dtype.is_floating_point or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    _check_mask_tensor(attention_mask)
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} and input_ids {tuple(input_ids.shape)} differ")
    if attention_mask.device != input_ids.device:
        raise ValueError("attention_mask and input_ids are on different devices")
    batch, seq_len = input_ids.shape
    if isinstance(position_ids_start, bool) or not isinstance(position_ids_start, numbers.Integral) \
            or not 0 <= position_ids_start <= 2**62:  # 2**64 reached the op as torch's schema error
        raise ValueError(f"position_ids_start must be an int >= 0 (at most 2^62), got {position_ids_start!r}")
    if not isinstance(check, (bool, np.bool_)):
        raise TypeError(f"check must be True or False, got {check!r}")
    status = negative = None
    if layout is None:  # the host check of the one copy replaces the device one
        layout, negative = _read_layout(attention_mask, input_ids)
        check = False
    elif not isinstance(layout, RolloutLayout) or len(layout.start) != batch or layout.seq_len != seq_len:
        raise ValueError("layout must be packkit.rl.rollout_layout(attention_mask) of this batch")
    idx = _indices(indices, batch)
    if negative is not None and negative[idx].any():
        raise ValueError(f"{int(negative[idx].sum())} rows of this micro-batch hold a negative token id at a valid "
                         "position; input_ids must be token ids >= 0")
    device = input_ids.device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    which = _backend_for(device, backend)

    lengths = layout.length[idx]
    keep = np.flatnonzero(lengths > 0)
    rows = idx[keep]
    nseg = len(rows)
    # One host buffer, one non-blocking copy: global row, run start, run length, local row, bin offsets, src step.
    host = np.empty(4 * nseg + 2, np.int64)
    host[:nseg], host[nseg:2 * nseg], host[2 * nseg:3 * nseg] = rows, layout.start[rows], lengths[keep]
    host[3 * nseg:4 * nseg] = keep
    host[4 * nseg:] = (0, nseg)
    segments = Segments(rows, host[nseg:2 * nseg], host[2 * nseg:3 * nseg], host[4 * nseg:])
    shape = pack_layout(segments, flat=True, row_len=row_len)
    plan = to_device(host_tensor(host), device)
    seg_seq, seg_start, seg_length = plan[:nseg], plan[nseg:2 * nseg], plan[2 * nseg:3 * nseg]
    local_seq, bin_offsets = plan[3 * nseg:4 * nseg], plan[4 * nseg:]
    src_offsets = torch.arange(0, (batch + 1) * seq_len, seq_len, dtype=torch.int64, device=device)[:batch + 1] \
        if seq_len else torch.zeros(batch + 1, dtype=torch.int64, device=device)

    ids = input_ids if input_ids.dtype in (torch.int64, torch.int32) else input_ids.to(torch.int64)
    ids, _, pos, _, cu = _op("pack_batch", which)(
        ids.contiguous().reshape(-1), None, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, 1,
        shape.row_len, True, shape.num_cu_seqlens, 0, -100, False, int(position_ids_start))
    cu_seg = _op("layout", which)(seg_length, bin_offsets, 1, shape.row_len, True, shape.num_cu_seqlens)[1]
    if check:
        status = _mask_status(attention_mask, input_ids, idx, layout, device)
    out = {"input_ids": ids.unsqueeze(0), "position_ids": pos.unsqueeze(0), "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
           "max_length_q": shape.max_seqlen, "max_length_k": shape.max_seqlen}
    return out, RolloutInfo(shape, idx, seq_len, local_seq, seg_start, cu, cu_seg, status)


def _mask_status(attention_mask, input_ids, idx, layout, device):
    """0-d int32 on the device: how many of the rows ``idx`` have a mask other than the layout's run, a mask value
    other than 0/1, or a negative token id at a valid position (no sync)."""
    bad, raw, expect, rows = _off_layout(attention_mask, idx, layout, device)
    bad |= _not_binary(raw)
    bad |= expect & (input_ids.index_select(0, rows) < 0)
    return bad.any(1).sum(dtype=torch.int32)


def _off_layout(attention_mask, idx, layout, device) -> tuple:
    """``[len(idx), S]`` bool on the device: where rows ``idx`` of the mask differ from the run ``layout`` recorded
    (a layout of another mask of the same shape), with the rows' raw mask, the expected run and the row index."""
    meta = np.stack((idx, layout.start[idx], layout.length[idx]))
    meta = to_device(host_tensor(np.ascontiguousarray(meta)), device)
    cols = torch.arange(layout.seq_len, device=device)
    start, length = meta[1].unsqueeze(1), meta[2].unsqueeze(1)
    expect = (cols >= start) & (cols < start + length)
    raw = attention_mask.index_select(0, meta[0])
    return (raw != 0) != expect, raw, expect, meta[0]


def check_rollouts(info: RolloutInfo) -> None:
    """Read ``info.status`` (one sync) and raise ValueError if a row's mask did not match the layout."""
    if info.status is not None and int(info.status):
        raise ValueError(f"{int(info.status)} rows of this micro-batch have an attention_mask that is not the run "
                         "rollout_layout recorded (the mask changed, or the layout is of another batch), a mask value "
                         "other than 0 and 1, or a negative token id at a valid position")


def unpack_rollouts(values: torch.Tensor, info: RolloutInfo, *, fill: float = 0.0, backend: str = "auto"):
    """Per-token outputs of a packed micro-batch (log-probs, entropy, values; any trailing dims), ``[1, T, *]`` or
    ``[T, *]``, back to ``[len(indices), S, *]`` in ``indices`` order (as verl's ``batch[idx]``), ``fill`` at
    padding. Sync-free."""
    if not isinstance(info, RolloutInfo):
        raise TypeError(f"info must be the RolloutInfo that pack_rollouts returned, got {type(info).__name__}")
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a tensor of per-token outputs, got {type(values).__name__}")
    fill = _check_fill(fill, values.dtype)
    shape = info.layout
    if values.dim() >= 2 and values.shape[0] == 1 and values.shape[1] == shape.row_len:
        values = values[0]
    if values.dim() < 1 or values.shape[0] != shape.row_len:
        raise ValueError(f"values must start with the packed token dim {shape.row_len} (or [1, {shape.row_len}]), "
                         f"got {tuple(values.shape)}")
    if values.device != info.cu_seqlens.device:
        raise ValueError(f"values are on {values.device} but the micro-batch was packed on {info.cu_seqlens.device}")
    which = _backend_for(values.device, backend)
    return _Unpack.apply(values.contiguous(), info, fill, which)


def _check_fill(fill, dtype: torch.dtype):
    """``fill`` as a value ``dtype`` holds exactly (0.5 in an integer tensor would be silently changed)."""
    if isinstance(fill, (bool, np.bool_)) or not isinstance(fill, numbers.Real):
        raise TypeError(f"fill must be a real number, got {type(fill).__name__} {fill!r}")
    if dtype == torch.bool:
        if fill not in (0, 1):
            raise ValueError(f"fill={fill!r} is not a bool value (0 or 1) of these {dtype} values")
    elif not dtype.is_floating_point and not dtype.is_complex:
        info = torch.iinfo(dtype)
        if not (math.isfinite(fill) and float(fill).is_integer() and info.min <= int(fill) <= info.max):
            raise ValueError(f"fill={fill!r} cannot be held by these {dtype} values (integers in [{info.min}, "
                             f"{info.max}])")
    return float(fill)


class _Unpack(torch.autograd.Function):
    """unpack_padded forward; its gradient is a pack of the output gradient (padding gets none)."""

    @staticmethod
    def forward(ctx, values, info, fill, which):
        ctx.info, ctx.which = info, which
        return _op("unpack_padded", which)(values, info.local_seq, info.seg_start, info.cu_seqlens, info.cu_seg, True,
                                           len(info.indices), info.seq_len, fill)

    @staticmethod
    def backward(ctx, grad):
        info, k, s = ctx.info, len(ctx.info.indices), ctx.info.seq_len
        offsets = torch.arange(0, (k + 1) * s, s, dtype=torch.int64, device=grad.device)[:k + 1] if s else \
            torch.zeros(k + 1, dtype=torch.int64, device=grad.device)
        flat = grad.contiguous().reshape(k * s, *grad.shape[2:])
        packed = _op("pack", ctx.which)(flat, offsets, info.local_seq, info.seg_start, info.cu_seqlens, info.cu_seg, 1,
                                        info.layout.row_len, True, 0.0, None)
        return packed, None, None, None
