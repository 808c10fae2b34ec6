"""``shard_context_parallel`` / ``unshard_context_parallel``: split a flat packed batch over context-parallel
(CP) ranks in one device pass, and put per-token outputs gathered from all ranks back in source order.

Sizes are host ints: the split needs each segment's length on the host (to size the output without a device
read-back). They come, cheapest first, from ``lengths=`` (segment lengths in ``cu_seq_lens`` order), from
``pack_info=`` (the :class:`packkit.PackInfo` of ``pack_sequences(..., return_info=True)``), or from
``batch["cu_seq_lens_q"]`` itself: free when it is on the CPU, one device-to-host copy (a host sync) of
``S + 1`` int32s when it is on a GPU. Then one kernel (``packkit::cp_shard``, CPU / CUDA / Triton) builds the
rank's ``input_ids``, ``shift_labels``, ``position_ids``, ``seq_idx`` and source index; the small
``cu_seqlens`` arrays go host-to-device from pinned memory without blocking.
"""
from __future__ import annotations

import math
import numbers
from typing import List, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

from ..packing import ops
from ..packing.backend_check import HOST, on_host
from ..packing.checks import (check_bool, check_fill, check_int, check_padding, integer_tokens, refuse_meta,
                              refuse_meta_batch)
from ..packing.sequences import PackInfo, _backend_for
from ..packing.tensors import host_tensor, to_device
from ..planning.planner import as_lengths
from .contract import apply_contract, check_contract, check_shard_slots

CP_MODES = ("zigzag", "contiguous")
_CORE_KEYS = ("input_ids", "labels", "shift_labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k",
              "max_length_q", "max_length_k", "cu_seqlens_padded")
# Keys a CP shard adds to a packed batch's: a per-token field of these names would replace them.
CP_OUTPUT_KEYS = ("shift_labels", "cu_seqlens_padded")


class CPShardInfo(NamedTuple):
    """Host facts of a CP split (``shard_context_parallel(..., return_info=True)``), for unsharding."""

    cp_size: int
    cp_rank: int
    mode: str
    cu_seqlens: np.ndarray  # int64 [S + 1]: the source row's segments (host)
    cu_seqlens_padded: np.ndarray  # int64 [S + 1]: zigzag, each segment padded to a multiple of 2*cp; contiguous: = cu_seqlens
    num_tokens: int  # T, tokens of the source row
    local_len: int  # tokens per rank
    src_index: torch.Tensor  # int64 [local_len] on the batch's device: this rank's source token, -1 for padding


def parse_context_parallel(spec) -> Optional[tuple]:
    """``context_parallel=`` of the loaders: None, ``(cp_size, cp_rank)`` or ``(cp_size, cp_rank, mode)``
    -> ``(cp_size, cp_rank, mode)`` (mode defaults to ``"zigzag"``), validated."""
    if spec is None:
        return None
    if isinstance(spec, (str, bytes)) or not hasattr(spec, "__len__") or len(spec) not in (2, 3):
        raise ValueError(f"context_parallel must be (cp_size, cp_rank) or (cp_size, cp_rank, mode), got {spec!r}")
    cp_size, cp_rank, mode = (*spec, "zigzag") if len(spec) == 2 else spec
    _check_cp(cp_size, cp_rank, mode)
    return int(cp_size), int(cp_rank), mode


def cp_plan_multiple(spec) -> Optional[int]:
    """What plan(..., pad_to_multiple_of=) a loader uses for ``context_parallel=spec``: 2*cp for zigzag
    (every document is padded to it), None otherwise."""
    return 2 * spec[0] if spec is not None and spec[2] == "zigzag" and spec[0] > 1 else None


def check_cp_capacity(multiple: Optional[int], capacity: Optional[int]) -> None:
    """A loader's planned rows must hold whole zigzag-padded documents: ``capacity`` a multiple of
    :func:`cp_plan_multiple`. Shared by PackingCollator, PackedIterableDataset and PackedBatchSampler."""
    if multiple and capacity is not None and capacity % multiple:
        raise ValueError(f"context_parallel zigzag pads documents to multiples of {multiple}; "
                         f"capacity={capacity} must be a multiple of it")


def cp_padded_lengths(lengths, cp_size: int, mode: str = "zigzag") -> np.ndarray:
    """Lengths after CP padding: zigzag rounds each segment up to a multiple of ``2 * cp_size``; contiguous
    pads only the row's end, so segment lengths are unchanged (see :func:`cp_row_len`)."""
    lengths = as_lengths(lengths)  # TypeError for floats rather than truncating them
    if len(lengths) and lengths.min() < 0:
        raise ValueError(f"lengths must be >= 0, got {int(lengths.min())}")
    _check_cp(cp_size, 0, mode)
    if mode == "contiguous":
        return lengths.copy()
    m = 2 * cp_size
    return (lengths + m - 1) // m * m


MAX_CP_SIZE = 1 << 24


def _check_cp(cp_size, cp_rank, mode) -> None:
    for name, v in (("cp_size", cp_size), ("cp_rank", cp_rank)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {v!r}")
    if not 1 <= cp_size <= MAX_CP_SIZE:  # the planner's dp_size bound; 2**64 overflowed numpy's int64
        raise ValueError(f"cp_size must be in [1, {MAX_CP_SIZE}], got {cp_size}")
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, {cp_size}), got {cp_rank}")
    if mode not in CP_MODES:
        raise ValueError(f"unknown context-parallel mode {mode!r}; allowed: {', '.join(CP_MODES)}")


def _host_layout(shape, seg) -> tuple:
    """The packed row's cu_seqlens (int64 [S + 1]) and each segment's plan segment (int64 [S], -1 for a padding
    tail) on the host, rebuilt from the plan: what packkit::layout computes, without a device read."""
    lengths, offsets = seg.length.astype(np.int64), seg.bin_offsets
    pieces: List[np.ndarray] = []
    owners: List[np.ndarray] = []
    pad = np.array([-1], np.int64)
    if shape.flat:
        pieces.append(lengths)
        owners.append(np.arange(len(lengths), dtype=np.int64))
        if shape.row_len > int(lengths.sum()):
            pieces.append(np.array([shape.row_len - int(lengths.sum())], np.int64))
            owners.append(pad)
    else:
        num_bins = len(offsets) - 1
        for b in range(shape.num_rows):
            lo, hi = (int(offsets[b]), int(offsets[b + 1])) if b < num_bins else (0, 0)
            pieces.append(lengths[lo:hi])
            owners.append(np.arange(lo, hi, dtype=np.int64))
            tail = shape.row_len - int(lengths[lo:hi].sum())
            if tail:
                pieces.append(np.array([tail], np.int64))
                owners.append(pad)
    seg_lengths = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
    return np.concatenate(([0], np.cumsum(seg_lengths))).astype(np.int64), owner


def _host_cu_from_info(info: PackInfo) -> np.ndarray:
    """The packed row's cu_seqlens on the host, rebuilt from the plan (what packkit::layout computes)."""
    return _host_layout(info.layout, info.segments)[0]


def _host_cu(batch, lengths, pack_info) -> np.ndarray:
    if lengths is not None:
        lengths = as_lengths(lengths)  # TypeError for floats (np.asarray would truncate 10.5 to 10)
        if len(lengths) and lengths.min() < 0:
            raise ValueError("lengths must be 1-D non-negative segment lengths in cu_seq_lens order")
        return np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    if pack_info is not None:
        if not isinstance(pack_info, PackInfo):
            raise TypeError(f"pack_info must be a packkit.PackInfo, got {type(pack_info).__name__}")
        return _host_cu_from_info(pack_info)
    cu = batch.get("cu_seq_lens_q")
    if cu is None:
        raise ValueError("the batch has no cu_seq_lens_q; pass lengths= (segment lengths) or pack_info=")
    refuse_meta(cu, "batch['cu_seq_lens_q']")
    return torch.as_tensor(cu).to("cpu", torch.int64).numpy()  # on a GPU: the one host sync


def _check_same_segments(given: torch.Tensor, cu: np.ndarray, cu_dev: torch.Tensor, source: str) -> None:
    """The batch's own cu_seq_lens_q must be the segments ``lengths=``/``pack_info=`` describe: otherwise
    shift_labels would cross document boundaries. Host tensors are compared on the host; a GPU tensor's size
    is compared at once and its values on the device (``torch._assert_async``: no host sync, which is what
    ``lengths=`` is for)."""
    what = (f"{source}= gives segments cu_seqlens={cu.tolist() if len(cu) <= 12 else '[...]'} but the batch's "
            f"cu_seq_lens_q")
    if given.dim() != 1 or given.numel() != len(cu):
        raise ValueError(f"{what} has {given.numel()} entries, not {len(cu)}; pass the batch's own segment lengths "
                         f"(or neither, to read cu_seq_lens_q)")
    if given.device.type == "cpu":
        mismatch = np.flatnonzero(given.to(torch.int64).numpy() != cu)
        if len(mismatch):
            raise ValueError(f"{what} is {given.tolist() if len(cu) <= 12 else '[...]'} (first difference at entry "
                             f"{int(mismatch[0])}); pass the batch's own segment lengths (or neither)")
    else:
        torch._assert_async((given.to(cu_dev.device, cu_dev.dtype) == cu_dev).all(),
                            f"shard_context_parallel: {source}= disagrees with the batch's cu_seq_lens_q")


def _local_cu_contiguous(cu: np.ndarray, padded_total: int, rank: int, n: int) -> np.ndarray:
    ext = cu if padded_total == cu[-1] else np.concatenate((cu, [padded_total]))
    cuts = np.unique(np.clip(ext - rank * n, 0, n))
    return cuts.astype(np.int64) if n else np.zeros(1, np.int64)


def _src_index_host(cu: np.ndarray, cup: np.ndarray, cp: int, rank: int, zigzag: bool, n: int) -> np.ndarray:
    """Source token of each of rank ``rank``'s ``n`` positions (-1: padding), vectorised on the host."""
    num_tokens = int(cu[-1])
    if not zigzag:
        g = rank * n + np.arange(n, dtype=np.int64)
        return np.where(g < num_tokens, g, -1)
    chunk = np.diff(cup) // (2 * cp)
    seg = np.repeat(np.arange(len(chunk)), 2 * chunk)
    k = np.arange(n, dtype=np.int64) - (cup[:-1] // cp)[seg]
    c = chunk[seg]
    idx = np.where(k < c, rank * c + k, (2 * cp - 1 - rank) * c + (k - c))
    return np.where(idx < np.diff(cu)[seg], cu[:-1][seg] + idx, -1)


def _cp_geometry(cu: np.ndarray, cp_size: int, cp_rank: int, mode: str) -> tuple:
    """Host ints of a split of a row with segments ``cu``: (padded cu [S + 1], local_len, local cu)."""
    num_tokens = int(cu[-1])
    if mode == "zigzag":
        cup = np.concatenate(([0], np.cumsum(cp_padded_lengths(np.diff(cu), cp_size)))).astype(np.int64)
        local_len = int(cup[-1]) // cp_size
        local_cu = cup // cp_size
    else:
        cup = cu
        local_len = -(-num_tokens // cp_size)
        local_cu = _local_cu_contiguous(cu, local_len * cp_size, cp_rank, local_len)
    if int(cup[-1]) >= 2**31:
        raise ValueError(f"the CP-padded row holds {int(cup[-1])} tokens (cp_size={cp_size}, mode={mode!r}); "
                         f"cu_seqlens are int32 (< 2^31)")
    check_padding(int(cup[-1]), num_tokens, f"the CP-padded row (cp_size={cp_size}, mode={mode!r})")
    return cup, local_len, local_cu


def _shard_outputs(outs, local_cu: np.ndarray, cup_dev: Optional[torch.Tensor], device) -> dict:
    """The HF-named dict of a rank's shard from cp_shard's outputs (cu_seqlens_padded in zigzag mode)."""
    out_ids, out_labels, shift, out_pos, _, seg = outs
    local_cu_dev = to_device(host_tensor(local_cu.astype(np.int32)), device)
    max_len = int(np.diff(local_cu).max()) if len(local_cu) > 1 else 0
    out = {"input_ids": out_ids.unsqueeze(0), "labels": out_labels.unsqueeze(0), "shift_labels": shift.unsqueeze(0),
           "position_ids": out_pos.unsqueeze(0), "seq_idx": seg.unsqueeze(0), "cu_seq_lens_q": local_cu_dev,
           "cu_seq_lens_k": local_cu_dev, "max_length_q": max_len, "max_length_k": max_len}
    if cup_dev is not None:
        out["cu_seqlens_padded"] = cup_dev
    return out


def _cp_op(backend: str):
    if backend == "triton":
        from ..triton_kernels import context_parallel as _triton_cp  # noqa: F401  (registers packkit::triton_cp_shard)

        return torch.ops.packkit.triton_cp_shard
    if backend == HOST:  # backend="auto" on a GPU whose device paths failed their self-check
        return on_host(torch.ops.packkit.cp_shard)
    return torch.ops.packkit.cp_shard


def _flat_tokens(t: torch.Tensor, ids_shape, name: str) -> torch.Tensor:
    """A per-token field shaped like the ids (``[1, T, *f]`` or a padded ``[B, L, *f]``), or flat ``[T, *f]``,
    as ``[T, *f]``. The ids' shape decides, so a ``[1, 1]`` field of a one-token batch is not read as ``[T, f]``."""
    num_tokens = math.prod(ids_shape)
    if tuple(t.shape[:len(ids_shape)]) == tuple(ids_shape):
        return t.reshape(num_tokens, *t.shape[len(ids_shape):])
    if t.dim() >= 1 and t.shape[0] == num_tokens:
        return t
    raise ValueError(f"{name} has shape {tuple(t.shape)}; expected the batch's {num_tokens} tokens "
                     f"(shaped like input_ids {tuple(ids_shape)}, or flat)")


def _is_per_token(t, ids_shape) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() >= len(ids_shape) and tuple(t.shape[:len(ids_shape)]) == tuple(ids_shape)


def _split_field(t: torch.Tensor, src: torch.Tensor, ids_shape) -> torch.Tensor:
    """Another per-token field split like the ids (0 on padding): a gather and a select."""
    flat = _flat_tokens(t, ids_shape, "a per-token field")
    got = flat.index_select(0, src.clamp(min=0))
    mask = (src >= 0).reshape(-1, *([1] * (got.dim() - 1)))
    return torch.where(mask, got, torch.zeros((), dtype=got.dtype, device=got.device)).unsqueeze(0)


def shard_context_parallel(batch: dict, cp_size: int, cp_rank: int, mode: str = "zigzag", *,
                           lengths: Optional[Sequence[int]] = None, pack_info: Optional[PackInfo] = None,
                           pad_token_id: int = 0, ignore_index: int = -100, backend: str = "auto",
                           return_info: bool = False, max_sequences: Optional[int] = None, max_length_buckets=None):
    """Context-parallel rank ``cp_rank``'s shard of a flat packed batch (``pack_sequences`` / the collators).

    Modes:
        ``"zigzag"`` (ring-flash-attn zigzag varlen, TE THD load-balanced, Megatron): every segment of
        ``cu_seq_lens_q`` (each document and each padding tail) is padded to a multiple of ``2 * cp_size``
        and cut into ``2 * cp_size`` equal chunks; rank r keeps chunks r and ``2*cp_size-1-r`` of every
        segment, in segment order.
        ``"contiguous"`` (llama3-style ring attention, Ulysses all-to-all): the row is padded at its end to
        a multiple of ``cp_size`` (the end padding is one more segment) and rank r keeps the r-th slice.

    Returns ``{input_ids, labels, shift_labels, position_ids, seq_idx, cu_seq_lens_q, cu_seq_lens_k,
    max_length_q, max_length_k}`` as ``[1, local_len]`` tensors (plus ``cu_seqlens_padded`` in zigzag mode):
    ``position_ids`` are the source's **global** positions (CP padding continues its segment's count; end
    padding counts from 0); ``shift_labels`` is the next label of the same segment, computed before the
    split (``ignore_index`` at each segment's last token and on padding; pass it to transformers' loss);
    ``labels`` is the unshifted labels split the same way; ``seq_idx`` is each token's segment in the
    source row (end padding: S); ``cu_seq_lens_q/k`` are local (zigzag: each segment's padded length /
    cp_size; contiguous: the pieces of segments inside the slice) and ``max_length_q/k`` host ints;
    ``cu_seqlens_padded`` is the global padded ``cu_seqlens`` (Transformer Engine's THD format). Other
    per-token tensors of the batch (shape starting like ``input_ids``) follow the same split (0 on
    padding); other values are copied as they are.

    The split is one ``packkit::cp_shard`` launch (no host sync) once the segment lengths are known on the
    host: see the module doc for ``lengths=`` / ``pack_info=``. ``return_info=True`` also returns a
    :class:`CPShardInfo` for :func:`unshard_context_parallel`. ``max_sequences`` / ``max_length_buckets``: the
    static-shape contract on the shard, as :func:`packkit.pack_context_parallel` (shard a batch packed without it).
    """
    _check_cp(cp_size, cp_rank, mode)
    max_sequences, max_length_buckets = check_contract(max_sequences, max_length_buckets)
    pad_token_id, ignore_index = check_int(pad_token_id, "pad_token_id", 0), check_int(ignore_index, "ignore_index")
    check_bool(return_info, "return_info")
    if not isinstance(batch, dict) or "input_ids" not in batch:
        raise TypeError("batch must be a dict with input_ids (a packed batch from pack_sequences or a collator)")
    ids_in = batch["input_ids"]
    if not isinstance(ids_in, torch.Tensor):
        raise TypeError("batch['input_ids'] must be a tensor")
    refuse_meta_batch(batch, "batch")
    already = [k for k in CP_OUTPUT_KEYS if k in batch]
    if already:  # a shard of a shard would split the rank's tokens again and recompute shift_labels from them
        raise ValueError(f"the batch already has {already[0]!r}: it is a context-parallel shard (or carries that "
                         f"key); shard the packed batch itself, once")
    num_tokens = ids_in.numel()
    ids = integer_tokens(ids_in.reshape(num_tokens), "batch['input_ids']")
    labels = batch.get("labels")
    labels = ids if labels is None else integer_tokens(_flat_tokens(labels, ids_in.shape, "labels"), "batch['labels']")
    pos = batch.get("position_ids")
    if pos is None:
        raise ValueError("the batch has no position_ids (pack with packkit.pack_sequences or a packkit collator)")
    if pos.numel() != num_tokens:
        raise ValueError(f"position_ids has shape {tuple(pos.shape)}; context parallelism needs one position per "
                         f"token (mRoPE position_ids are not supported)")
    integer_tokens(pos, "batch['position_ids']")  # float positions would be truncated by the int64 cast
    check_fill(pad_token_id, ids.dtype, "pad_token_id")
    check_fill(ignore_index, labels.dtype, "ignore_index")
    cu = _host_cu(batch, lengths, pack_info)
    if len(cu) < 2 and num_tokens:
        raise ValueError("cu_seq_lens must have at least one segment")
    if len(cu) > 1 and np.diff(cu).min() < 0:  # checked first: a decreasing run can still end at num_tokens
        i = int(np.argmax(np.diff(cu) < 0)) + 1
        raise ValueError(f"cu_seq_lens_q must be non-decreasing; index {i} is {int(cu[i])}, below index {i - 1} "
                         f"({int(cu[i - 1])})")
    if int(cu[-1]) != num_tokens:
        raise ValueError(f"the segment lengths sum to {int(cu[-1])} but the batch has {num_tokens} tokens")
    if max_sequences is not None:
        if "cu_seq_lens_q" in batch and lengths is None and pack_info is None and len(cu) > 1 and \
                (np.diff(cu) == 0).any():
            raise ValueError("max_sequences=: the batch's cu_seq_lens_q has zero-length slots (packed under the "
                             "contract already); pack without max_sequences and give it to the shard")
        check_shard_slots(cu, len(cu) - 1, cp_size, mode, max_sequences)
    cup, local_len, local_cu = _cp_geometry(cu, cp_size, cp_rank, mode)
    zigzag = mode == "zigzag"

    device = ids.device
    which = _backend_for(device, backend)
    cu_dev = batch.get("cu_seq_lens_q")
    if not (isinstance(cu_dev, torch.Tensor) and cu_dev.device == device and cu_dev.dtype == torch.int32
            and cu_dev.dim() == 1 and cu_dev.numel() == len(cu) and lengths is None and pack_info is None):
        given = cu_dev
        cu_dev = to_device(host_tensor(cu.astype(np.int32)), device)
        if isinstance(given, torch.Tensor) and (lengths is not None or pack_info is not None):
            _check_same_segments(given, cu, cu_dev, "lengths" if lengths is not None else "pack_info")
    cup_dev = cu_dev if not zigzag else to_device(host_tensor(cup.astype(np.int32)), device)
    outs = _cp_op(which)(
        ids.contiguous(), labels.contiguous(), pos.reshape(num_tokens).to(torch.int64).contiguous(), cu_dev.contiguous(),
        cup_dev.contiguous(), cp_size, cp_rank, zigzag, local_len, int(pad_token_id), int(ignore_index))
    out = apply_contract(_shard_outputs(outs, local_cu, cup_dev if zigzag else None, device), max_sequences,
                         max_length_buckets, local_len)
    for key, value in batch.items():
        if key in _CORE_KEYS:
            continue
        out[key] = _split_field(value, outs[4], ids_in.shape) if _is_per_token(value, ids_in.shape) else value
    if not return_info:
        return out
    return out, CPShardInfo(cp_size, cp_rank, mode, cu, cup, num_tokens, local_len, outs[4])


def unshard_context_parallel(gathered: Union[torch.Tensor, Sequence[torch.Tensor]], info: CPShardInfo) -> torch.Tensor:
    """Per-token outputs of all CP ranks back in the source row's order.

    ``gathered``: ``[cp_size, local_len, *f]`` (``all_gather_into_tensor`` of each rank's ``[local_len, *f]``
    or ``[1, local_len, *f]``) or a list of the ranks' tensors in rank order. ``info``: any rank's
    :class:`CPShardInfo`. Returns ``[T, *f]`` in the packed row's token order (feed it to
    :func:`packkit.unpack_sequences` for per-sequence order); CP padding is dropped. No host sync: the
    index is built on the host and scattered with one ``index_copy``.
    """
    if not isinstance(info, CPShardInfo):
        raise TypeError(f"info must be a CPShardInfo (shard_context_parallel(..., return_info=True)), got "
                        f"{type(info).__name__}")
    cp, n = info.cp_size, info.local_len
    gathered = gathered if isinstance(gathered, torch.Tensor) else list(gathered)  # an iterator read once
    refuse_meta_batch(gathered, "gathered")
    if not isinstance(gathered, torch.Tensor):
        parts = list(gathered)
        if len(parts) != cp:
            raise ValueError(f"expected {cp} rank outputs, got {len(parts)}")
        for r, p in enumerate(parts):
            if not isinstance(p, torch.Tensor) or p.dim() < 1 or (p.shape[0] != n and p.shape[:2] != (1, n)):
                raise ValueError(f"rank {r}'s output must be [local_len={n}, *f] or [1, {n}, *f], got "
                                 f"{tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__}")
        gathered = torch.stack([p.reshape(n, *p.shape[2 if p.dim() >= 2 and p.shape[0] == 1 and p.shape[1] == n else 1:])
                                for p in parts])
    if gathered.dim() >= 3 and gathered.shape[1] == 1 and gathered.shape[2] == n:
        gathered = gathered.squeeze(1)
    if gathered.dim() < 2 or gathered.shape[0] != cp or gathered.shape[1] != n:
        raise ValueError(f"gathered must be [cp_size={cp}, local_len={n}, *f], got {tuple(gathered.shape)}")
    zigzag = info.mode == "zigzag"
    index = np.concatenate([_src_index_host(info.cu_seqlens, info.cu_seqlens_padded, cp, r, zigzag, n)
                            for r in range(cp)]) if cp * n else np.zeros(0, np.int64)
    index = np.where(index < 0, info.num_tokens, index)
    index_dev = to_device(host_tensor(index), gathered.device)
    out = gathered.new_empty((info.num_tokens + 1, *gathered.shape[2:]))
    out.index_copy_(0, index_dev, gathered.reshape(cp * n, *gathered.shape[2:]))
    return out[:info.num_tokens]
