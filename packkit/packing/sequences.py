"""``packkit.pack_sequences``: sequences + plan -> packed tensors with HF key names, on any device.

The device never reads anything back: every output size (rows, row length, number of ``cu_seqlens``
entries, ``max_seqlen``) is computed here, on the host, from the plan, and passed to the ops as ints.
The plan itself is validated against the sequence lengths on the host too, so the device kernels can
trust it.
"""
from __future__ import annotations

from array import array
import numbers
from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from ..planning.planner import Plan, Segments, as_lengths, plan as make_plan
from .backend_check import HOST, auto_backend, on_host
from .ops import cuda_kernels_status, has_cuda_kernels
from .buffers import PackBuffers
from .checks import (as_device, check_bool, check_fill, check_pack_scalars, check_padding, check_plan_covers,
                     check_token_ids, int64_message, integer_tokens, outside_int64, refuse_meta)
from .fields import check_policy, pack_fields, prepare_fields
from .multimodal.mrope import check_mrope_start
from .static_shapes import bucket, check_buckets, check_max_sequences, check_slots, pad_cu_seqlens
from .tensors import host_tensor, to_device

LAYOUTS = ("flat", "padded")
BACKENDS = ("auto", "cpu", "cuda", "triton")


def check_layout(layout) -> None:
    """Raise ValueError for a layout not in LAYOUTS: one check (and message) for pack_sequences, the fused
    CP pack and the loaders that take ``layout=``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; allowed: {', '.join(LAYOUTS)}")


class PackLayout(NamedTuple):
    """Host-side shape facts of a packed batch (what the ops need as ints)."""

    num_rows: int  # 1 for the flat layout
    row_len: int  # tokens per row (flat: total tokens incl. any trailing padding)
    flat: bool
    num_cu_seqlens: int  # output segments (plan segments + padding segments) + 1
    max_seqlen: int  # longest output segment, padding segments included (flash-attn's max_seqlen)
    num_tokens: int  # real (non-padding) tokens


class PackInfo(NamedTuple):
    """What :func:`unpack_sequences` needs to undo a pack (returned by ``pack_sequences(return_info=True)``)."""

    layout: PackLayout
    segments: Segments  # host (numpy) plan
    seg_seq: torch.Tensor  # the plan on the packed tensors' device
    seg_start: torch.Tensor
    src_offsets: torch.Tensor  # int64 [n + 1]: where each source sequence starts in the flat source
    cu_seqlens: torch.Tensor
    cu_seg: torch.Tensor  # plan segment behind each output segment, -1 for padding
    lengths: np.ndarray  # source lengths


def identity_segments(lengths: np.ndarray) -> Segments:
    """A one-bin plan that keeps every (non-empty) sequence whole and in input order."""
    keep = np.flatnonzero(lengths > 0).astype(np.int64)
    return Segments(keep, np.zeros(len(keep), np.int64), lengths[keep].astype(np.int64),
                    np.array([0, len(keep)], np.int64))


def pack_layout(segments: Segments, *, flat: bool, row_len: Optional[int] = None,
                num_rows: Optional[int] = None) -> PackLayout:
    """Shape facts for packing ``segments``: flat (one row) or padded ``[num_rows, row_len]``.

    Defaults: flat ``row_len`` = the plan's tokens (no padding); padded ``num_rows`` = the plan's bins.
    Raises ValueError if the plan does not fit.
    """
    flat = check_bool(flat, "flat")  # flat=0 passed as the padded layout
    lengths, offsets = segments.length, segments.bin_offsets
    num_bins = len(offsets) - 1
    cumulative = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    total = int(cumulative[-1])
    longest = int(lengths.max()) if len(lengths) else 0
    if flat:
        row_len = total if row_len is None else _count(row_len, "row_len")
        if num_rows is not None and _count(num_rows, "num_rows") != 1:  # _count first: True == 1
            raise ValueError(f"the flat layout is one row; num_rows must be None or 1, got {num_rows}")
        if total > row_len:
            raise ValueError(f"the plan holds {total} tokens but the flat layout has row_len={row_len}")
        pads = int(total < row_len)
        rows = 1
        check_padding(row_len, total, f"the flat batch of row_len={row_len}")
        max_seqlen = max(longest, row_len - total)
    else:
        if row_len is None:
            raise ValueError("the padded layout needs row_len (usually the plan's capacity)")
        row_len = _count(row_len, "row_len")
        rows = num_bins if num_rows is None else _count(num_rows, "num_rows")
        if rows < num_bins:
            raise ValueError(f"the plan has {num_bins} rows but num_rows={rows}")
        _check_batch_size(rows, row_len)  # before the per-row arrays below (num_rows=2**32 found by fuzzing)
        check_padding(rows * max(row_len, 1), total, f"the padded batch [{rows}, {row_len}]")
        bin_tokens = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
        if num_bins and int(bin_tokens.max()) > row_len:
            worst = int(np.argmax(bin_tokens))
            raise ValueError(f"row {worst} of the plan holds {int(bin_tokens[worst])} tokens, more than "
                             f"row_len={row_len}")
        tails = np.concatenate((row_len - bin_tokens, np.full(rows - num_bins, row_len, np.int64)))
        pads = int(np.count_nonzero(tails))
        max_seqlen = max(longest, int(tails.max()) if len(tails) else 0)
    _check_batch_size(rows, row_len)
    return PackLayout(rows, row_len, flat, len(lengths) + pads + 1, max_seqlen, total)


def _check_batch_size(rows: int, row_len: int) -> None:
    if rows * row_len >= 2**31:
        raise ValueError(f"a packed batch must hold fewer than 2^31 tokens (int32 cu_seqlens); got num_rows x "
                         f"row_len = {rows} x {row_len} (a padded row_len is the capacity unless given)")


def flatten_sequences(sequences, lengths=None, *, name: str = "sequences"):
    """(flat 1-D tensor, int64 numpy lengths) from a list of sequences or a flat tensor + lengths."""
    if lengths is not None:
        try:
            flat = torch.as_tensor(sequences)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise TypeError(f"{name}: with lengths=, pass all tokens as one flat tensor or array (or a list of "
                            f"sequences without lengths=); got {type(sequences).__name__} ({exc})") from None
        refuse_meta(sequences, name)
        if flat.dim() < 1:
            raise ValueError(f"{name}: a flat source must be at least 1-D, got a scalar")
        lengths = as_lengths(lengths)
        if len(lengths) and int(lengths.min()) < 0:
            i = int(np.argmin(lengths))
            raise ValueError(f"{name}: lengths must be >= 0; lengths[{i}] is {int(lengths[i])}")
        if int(lengths.sum()) != flat.shape[0]:
            raise ValueError(f"{name}: lengths sum to {int(lengths.sum())} but the flat source has "
                             f"{flat.shape[0]} tokens")
        return flat, lengths
    if isinstance(sequences, torch.Tensor):
        raise TypeError(f"{name}: a tensor source needs lengths=...; or pass a list of 1-D sequences")
    if not isinstance(sequences, Sequence) or isinstance(sequences, (str, bytes)):
        raise TypeError(f"{name}: expected a list of sequences (lists, numpy arrays or 1-D tensors), "
                        f"got {type(sequences).__name__}")
    if all(isinstance(s, torch.Tensor) for s in sequences) and sequences:
        for i, s in enumerate(sequences):
            if s.dim() < 1:
                raise ValueError(f"{name}[{i}] is a 0-d tensor; each sequence must be at least 1-D")
            if s.shape[1:] != sequences[0].shape[1:]:  # torch.cat would raise a RuntimeError
                raise ValueError(f"{name}[{i}] has shape {tuple(s.shape)} but {name}[0] has "
                                 f"{tuple(sequences[0].shape)}; sequences may differ only in their first dim")
        lengths = np.array([s.shape[0] for s in sequences], np.int64)
        try:
            flat = torch.cat(list(sequences))
        except RuntimeError:
            _refuse_meta_items(sequences, name)  # one meta tensor among others: named, not torch's device error
            raise
        if flat.is_meta:  # one test of the result, not one per sequence (Tensor.is_meta is ~170 ns a call)
            _refuse_meta_items(sequences, name)
        return flat, lengths
    lengths = np.empty(len(sequences), np.int64)
    for i, s in enumerate(sequences):
        if isinstance(s, (str, bytes)) or not hasattr(s, "__len__"):
            raise TypeError(f"{name}[{i}] is a {type(s).__name__}; each sequence must be a list, array or tensor "
                            f"of token ids")
        if type(s) is not list and isinstance(s, torch.Tensor) and s.is_meta:  # lists (the common case): one test
            refuse_meta(s, f"{name}[{i}]")
        lengths[i] = len(s)
    try:  # array('q') rejects floats instead of truncating them (np.fromiter would truncate 1.5 to 1);
        # one array per sequence joined is ~2x faster than one array over a chained iterator.
        values = np.frombuffer(b"".join([array("q", s).tobytes() for s in sequences]), np.int64).copy()
    except (TypeError, ValueError, OverflowError) as exc:
        big = outside_int64(sequences) if isinstance(exc, OverflowError) else None
        if big:
            raise ValueError(int64_message(f"{name}[{big[0]}][{big[1]}]", *big[2:])) from None
        raise TypeError(f"{name}: every element must be an integer token id ({exc})") from None
    return torch.from_numpy(values), lengths


def _refuse_meta_items(sequences, name: str) -> None:
    for i, s in enumerate(sequences):
        refuse_meta(s, f"{name}[{i}]")


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


def _backend_for(device: torch.device, backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if device.type == "cpu":
        if backend not in ("auto", "cpu"):
            raise ValueError(f"backend {backend!r} needs a CUDA device; the data is on the CPU")
        return "cpu"
    if device.type != "cuda":
        raise ValueError(f"packkit packs on CPU or CUDA devices, got {device}")
    if backend == "auto":  # the device paths that passed their self-check here (one dict lookup after the first)
        return auto_backend(device)
    if backend == "cuda" and not has_cuda_kernels():
        raise ValueError(f"backend='cuda' but packkit's CUDA kernels are not loaded ({cuda_kernels_status()}: CPU "
                         "torch, no nvcc at build time, or a build for another torch); use backend='triton'")
    if backend == "cpu":
        raise ValueError("backend='cpu' but the data is on a CUDA device")
    return backend


def _op(name: str, backend: str):
    if backend == "triton":
        from ..triton_kernels import pack as _triton_pack  # noqa: F401  (registers packkit::triton_*)

        return getattr(torch.ops.packkit, "triton_" + name)
    if backend == HOST:  # backend="auto" on a GPU whose device paths failed their self-check
        return on_host(getattr(torch.ops.packkit, name))
    return getattr(torch.ops.packkit, name)


def source_tokens(sequences, lengths, labels):
    """(flat int ids, int64 numpy lengths, flat int labels or None) of pack_sequences' inputs, checked:
    integer dtypes only, ids >= 0 (see :mod:`.checks`)."""
    flat_ids, seq_lengths = flatten_sequences(sequences, lengths)
    if flat_ids.dim() != 1:
        raise ValueError(f"input ids must be 1-D per sequence, got trailing dims {tuple(flat_ids.shape[1:])}")
    flat_ids = integer_tokens(flat_ids, "input ids")
    check_token_ids(flat_ids, "input ids", seq_lengths)
    flat_labels = None
    if labels is not None:
        flat_labels, label_lengths = flatten_sequences(labels, lengths, name="labels")
        if not np.array_equal(label_lengths, seq_lengths):
            i = int(np.flatnonzero(label_lengths != seq_lengths)[0]) if len(label_lengths) == len(seq_lengths) else -1
            raise ValueError("labels must have the same lengths as the sequences"
                             + (f" (sequence {i}: {seq_lengths[i]} ids, {label_lengths[i]} labels)" if i >= 0 else
                                f" ({len(label_lengths)} label sequences for {len(seq_lengths)} sequences)"))
        if flat_labels.dim() != 1:
            raise ValueError(f"labels must be 1-D per sequence, got trailing dims {tuple(flat_labels.shape[1:])}")
        # Only the dtype is checked: label values (a negative one besides ignore_index) are the loss's to refuse.
        flat_labels = integer_tokens(flat_labels, "labels")
    return flat_ids, seq_lengths, flat_labels


def plan_layout(seq_lengths, plan, capacity, algorithm, overlong, layout, row_len, num_rows, max_sequences=None):
    """(plan segments, PackLayout) of pack_sequences' plan options, checked against the lengths on the host.
    ``max_sequences``: slots per row; a padded row's padding takes one, so its rows are planned with one less."""
    given = plan is not None  # a plan made here from these lengths needs no coverage check
    if plan is None and capacity is not None:
        per_row = None if max_sequences is None or layout == "flat" else max(max_sequences - 1, 1)
        plan = make_plan(seq_lengths, capacity, algorithm=algorithm, overlong=overlong, max_sequences=per_row)
    if plan is not None:
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a packkit.Plan, got {type(plan).__name__}")
        if plan.num_sequences != len(seq_lengths):
            raise ValueError(f"the plan is for {plan.num_sequences} sequences but {len(seq_lengths)} were given")
        segments = plan.segments
        if given:
            check_plan_covers(plan, seq_lengths)
        if layout == "padded" and row_len is None:
            row_len = plan.capacity
    elif layout == "flat":
        segments = identity_segments(seq_lengths)
    else:
        raise ValueError("the padded layout needs a plan or a capacity")
    shape = pack_layout(segments, flat=layout == "flat", row_len=row_len, num_rows=num_rows)
    return segments, shape


def pack_sequences(sequences, lengths=None, *, labels=None, plan: Optional[Plan] = None,
                   capacity: Optional[int] = None, algorithm: str = "obfd", overlong: str = "error",
                   layout: str = "flat", num_rows: Optional[int] = None, row_len: Optional[int] = None,
                   pad_token_id: int = 0, ignore_index: int = -100, mask_first_label: bool = True,
                   position_ids_start: int = 0, device=None, backend: str = "auto", return_info: bool = False,
                   fields: Optional[dict] = None, pad_values: Optional[dict] = None, extra_fields: str = "error",
                   mrope=None, out: Optional[PackBuffers] = None, max_sequences: Optional[int] = None,
                   max_length_buckets=None):
    """Pack token sequences into one batch with the keys HF models take.

    Args:
        sequences: a list of 1-D token sequences (lists, numpy arrays or tensors), or one flat 1-D
            tensor of all tokens together with ``lengths``.
        labels: optional labels in the same form (defaults to a copy of the input ids).
        plan: a :class:`packkit.Plan` of these lengths; otherwise one is made with ``capacity`` and
            ``algorithm``. With neither (flat layout only) the batch keeps input order in one row,
            exactly like ``transformers.DataCollatorWithFlattening``.
        layout: ``"flat"`` gives ``[1, T]`` tensors; ``"padded"`` gives ``[num_rows, row_len]`` with
            one plan bin per row. ``num_rows``/``row_len`` may exceed what the plan needs, for
            static shapes (CUDA graphs, torch.compile): extra rows and row tails are padding.
        mask_first_label: set each segment's first label to ``ignore_index`` (HF's convention for
            unshifted labels: no document learns to predict the next one's first token).
        position_ids_start: first position of every segment (2 for RoBERTa-style models).
        device: where to pack (default: where ``sequences`` are). On CUDA the host copies are
            non-blocking from pinned memory and the kernels never synchronise.
        backend: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"triton"``. ``"auto"`` on CUDA takes the CUDA kernels,
            else the compiled Triton ones, else the CPU ops, whichever first passed its self-check on this torch
            build and GPU (once, in a child process, cached: :mod:`packkit.packing.backend_check`).
        return_info: also return a :class:`PackInfo` for :func:`unpack_sequences`.
        fields: other per-sample fields ``{name: [value per sequence]}`` (or, with ``lengths``, flat
            ``[sum(lengths), *f]`` tensors for per-token fields); see :mod:`packkit.fields`. Per-token fields
            are packed like the ids (padding = ``pad_values.get(name, 0)``), an all-ones ``attention_mask``
            is accepted and left out, vision inputs (``pixel_values``, ``image_grid_thw``, ...) are
            concatenated in packed order, anything else follows ``extra_fields`` ("error", "drop", "keep").
        mrope: a Qwen2-VL/2.5-VL/3-VL(-MoE) config or model: ``position_ids`` becomes ``[4, B, L]`` (row 0
            the text positions, rows 1-3 each sequence's mRoPE rows as the model's ``get_rope_index``).
        out: a :class:`packkit.PackBuffers` to pack into (``packkit::pack_batch_out``) instead of fresh
            tensors: the returned tensors (and ``PackInfo``'s) are views of its buffers, bit-identical
            to a fresh pack, and are overwritten ``out.num_buffers`` calls later (see PackBuffers).
        max_sequences: the static-shape contract (:mod:`packkit.packing.static_shapes`): N sequence slots per row
            (a row's padding takes one), ``cu_seq_lens_q/k`` always ``num_rows * N + 1`` long (flat: ``N + 1``),
            unused slots repeating the last offset; a plan made here keeps rows within it, a batch that does not
            fit is refused by name. Fix the tokens too (``row_len``, padded ``num_rows``) for one shape per step.
        max_length_buckets: ``max_length_q/k`` rounded up to a bucket: ``"pow2"`` or a list of ints (the row
            length is always the last bucket), so a compiled step sees few distinct values.

    Returns ``{input_ids, labels, position_ids, seq_idx, cu_seq_lens_q, cu_seq_lens_k, max_length_q,
    max_length_k}``. Padding (padded layout, or a flat ``row_len`` beyond the data) is its own
    segment in ``cu_seq_lens``, its positions count up from ``position_ids_start`` like a document's
    (so position-based document detection sees one padding document, not many 1-token ones), its
    labels are ``ignore_index`` and its ids ``pad_token_id``. ``seq_idx`` is each token's segment in
    ``cu_seq_lens`` order (int32), ``max_length_*`` is a host int from the plan.
    """
    check_layout(layout)
    if out is not None and not isinstance(out, PackBuffers):
        raise TypeError(f"out must be a packkit.PackBuffers, got {type(out).__name__}")
    pad_token_id, ignore_index, position_ids_start, mask_first_label = check_pack_scalars(
        pad_token_id, ignore_index, position_ids_start, mask_first_label)
    check_bool(return_info, "return_info")
    check_policy(extra_fields)  # checked with or without fields ('' passed silently when there were none)
    flat_ids, seq_lengths, flat_labels = source_tokens(sequences, lengths, labels)
    extra = None
    if fields or mrope is not None:

        check_mrope_start(mrope, position_ids_start)
        extra = prepare_fields(fields, seq_lengths, flat_ids, extra_fields=extra_fields, pad_values=pad_values, mrope=mrope)

    max_sequences, max_length_buckets = check_max_sequences(max_sequences), check_buckets(max_length_buckets)
    segments, shape = plan_layout(seq_lengths, plan, capacity, algorithm, overlong, layout, row_len, num_rows,
                                  max_sequences)
    slots = None if max_sequences is None else check_slots(segments.length, segments.bin_offsets, shape, max_sequences)

    device = flat_ids.device if device is None else as_device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    which = _backend_for(device, backend)
    src_offsets = torch.from_numpy(np.concatenate(([0], np.cumsum(seq_lengths)))).to(torch.int64)
    host = [host_tensor(a) for a in segments]
    seg_seq, seg_start, seg_length, bin_offsets = (to_device(t, device) for t in host)
    src_offsets = to_device(src_offsets, device)
    host_ids = flat_ids  # extra fields read token types on the host, without a device round trip
    flat_ids = to_device(flat_ids.contiguous(), device)
    if flat_labels is not None:
        flat_labels = to_device(flat_labels.contiguous(), device)

    check_fill(pad_token_id, flat_ids.dtype, "pad_token_id")
    check_fill(ignore_index, flat_ids.dtype if flat_labels is None else flat_labels.dtype, "ignore_index")
    pack_batch = _op("pack_batch", which) if out is None else out.packer(_op("pack_batch_out", which))
    ids, lab, pos, seq_idx, cu = pack_batch(
        flat_ids, flat_labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, shape.num_rows,
        shape.row_len, shape.flat, shape.num_cu_seqlens, int(pad_token_id), int(ignore_index),
        bool(mask_first_label), int(position_ids_start))
    if shape.flat:
        ids, lab, pos, seq_idx = (t.unsqueeze(0) for t in (ids, lab, pos, seq_idx))
    longest = bucket(shape.max_seqlen, max_length_buckets, shape.row_len)
    cu_batch = cu if slots is None else pad_cu_seqlens(cu, slots)  # PackInfo keeps the exact one (unpack's)
    batch = {"input_ids": ids, "labels": lab, "position_ids": pos, "seq_idx": seq_idx,
             "cu_seq_lens_q": cu_batch, "cu_seq_lens_k": cu_batch, "max_length_q": longest, "max_length_k": longest}
    if not return_info and extra is None:
        return batch
    cu_seg = out.cu_seg_of(cu) if out is not None else None
    if cu_seg is None:
        cu_seg = _op("layout", which)(seg_length, bin_offsets, shape.num_rows, shape.row_len, shape.flat,
                                      shape.num_cu_seqlens)[1]
    info = PackInfo(shape, segments, seg_seq, seg_start, src_offsets, cu, cu_seg, seq_lengths)
    if extra is not None:

        pack_fields(batch, info, host_ids, seq_lengths, *extra, _op("pack", which))
    return (batch, info) if return_info else batch


def unpack_sequences(packed: torch.Tensor, info: PackInfo, *, padded: bool = False, max_len: Optional[int] = None,
                     pad_value: float = 0.0, backend: str = "auto"):
    """Per-token outputs of a packed batch (logits, log-probs, losses) back in source order.

    ``packed`` has the batch's token shape followed by any feature dims: ``[1, T, *f]`` / ``[T, *f]``
    (flat) or ``[num_rows, row_len, *f]`` (padded). Returns flat ``[sum(lengths), *f]`` or, with
    ``padded=True``, ``[num_sequences, max_len, *f]`` (``max_len`` defaults to the longest
    sequence). Tokens the plan did not keep (dropped or truncated) get ``pad_value``.
    """
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"packed must be a tensor (the model's per-token output), got {type(packed).__name__}")
    refuse_meta(packed, "packed")
    if not isinstance(info, PackInfo):
        raise TypeError(f"info must be the PackInfo of pack_sequences(..., return_info=True), got "
                        f"{type(info).__name__}")
    if isinstance(pad_value, bool) or not isinstance(pad_value, numbers.Real):
        raise TypeError(f"pad_value must be a number, got {type(pad_value).__name__} {pad_value!r}")
    check_bool(padded, "padded")
    if max_len is not None:  # checked whether or not padded=True reads it (2.5 / NaN passed silently)
        max_len = _count(max_len, "max_len")
    shape = info.layout
    if shape.flat and packed.dim() >= 2 and packed.shape[0] == 1 and packed.shape[1] == shape.row_len:
        packed = packed[0]
    expect = (shape.row_len,) if shape.flat else (shape.num_rows, shape.row_len)
    if tuple(packed.shape[:len(expect)]) != expect:
        raise ValueError(f"packed must start with the batch's token shape {expect}, got {tuple(packed.shape)}")
    which = _backend_for(packed.device, backend)
    check_fill(pad_value, packed.dtype, "pad_value")
    if packed.device != info.cu_seqlens.device:
        raise ValueError(f"packed is on {packed.device} but the batch was packed on {info.cu_seqlens.device}")
    if padded:
        longest = int(info.lengths.max()) if len(info.lengths) else 0
        max_len = longest if max_len is None else max_len
        check_padding(len(info.lengths) * max_len, int(info.lengths.sum()),
                      f"unpack_sequences(padded=True, max_len={max_len}) of {len(info.lengths)} sequences")
        return _op("unpack_padded", which)(packed.contiguous(), info.seg_seq, info.seg_start, info.cu_seqlens,
                                           info.cu_seg, shape.flat, len(info.lengths), max_len, float(pad_value))
    return _op("unpack", which)(packed.contiguous(), info.src_offsets, info.seg_seq, info.seg_start,
                                info.cu_seqlens, info.cu_seg, shape.flat, int(info.lengths.sum()), float(pad_value))


def pack_on_device(input_ids: torch.Tensor, lengths: torch.Tensor, capacity: int, *, labels=None,
                   algorithm: str = "obfd", overlong: str = "error", layout: str = "padded", plan="host", **options):
    """Pack sequences that already live on the GPU (e.g. RL rollouts): flat ``input_ids`` + ``lengths``.

    Host synchronisations: exactly **one** — the device-to-host copy of ``lengths`` (``n`` int64s)
    that planning needs. The plan then goes host-to-device from pinned memory without blocking and
    the pack kernels run on the current stream; tokens never leave the device. Pass ``lengths`` as a
    host array/list instead (if you already have them there) for zero synchronisations.

    Returns ``(batch, info)`` like ``pack_sequences(..., return_info=True)``; use
    :func:`unpack_sequences` with ``info`` to bring per-token outputs (log-probs) back per sequence.
    Other keyword options are those of :func:`pack_sequences` (``plan=`` a :class:`packkit.Plan` is passed on).

    ``plan="device"``: zero synchronisations, under the fixed contract: lengths stay on the device, the rows are
    planned there (:mod:`.device_plan`) and the batch is always ``[num_rows, capacity]`` with ``num_rows *
    max_sequences + 1`` ``cu_seq_lens`` (both required); returns ``(batch, DevicePackInfo)``, whose ``unplaced``
    (a device tensor) the caller checks at its own sync point; see :mod:`.device_pack`.
    """
    if isinstance(plan, str) and plan == "device":
        from .device_pack import device_pack

        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
            raise TypeError("input_ids must be a flat 1-D tensor of all sequences' tokens")
        refuse_meta(input_ids, "input_ids")
        return device_pack(input_ids, lengths, capacity, labels=labels, algorithm=algorithm, overlong=overlong,
                           layout=layout, **options)
    if plan is None or (isinstance(plan, str) and plan == "host"):
        plan = None
    elif not isinstance(plan, Plan):
        raise ValueError(f"plan must be 'host', 'device' or a packkit.Plan, got {plan!r:.60}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
        raise TypeError("input_ids must be a flat 1-D tensor of all sequences' tokens")
    refuse_meta(input_ids, "input_ids")
    refuse_meta(lengths, "lengths")
    if isinstance(lengths, torch.Tensor):
        if lengths.dim() != 1 or lengths.dtype.is_floating_point:
            raise TypeError("lengths must be a 1-D integer tensor")
        lengths = lengths.to("cpu", torch.int64).numpy()  # the one synchronisation
    return pack_sequences(input_ids, lengths, labels=labels, plan=plan, capacity=capacity, algorithm=algorithm,
                          overlong=overlong, layout=layout, return_info=True, **options)
