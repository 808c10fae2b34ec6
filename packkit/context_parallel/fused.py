"""``pack_context_parallel``: one context-parallel rank's shard gathered straight from the unpacked sequences.

Packing is a gather (packed position -> source token) and so is the CP split (local position -> packed
position), so a rank never needs the packed row: the host knows the packed row's segments from the plan
(ints, no device read), and ``packkit::cp_shard`` in its fused mode (``seg_src``: where each packed segment
starts in the flat source, -1 for padding) reads input ids and labels from the source directly. One launch
(CPU / CUDA / Triton), zero host syncs; the host sends ``S + 1`` cu_seqlens, ``S`` source offsets and the
local cu_seqlens (pinned, non-blocking). The output equals ``shard_context_parallel(pack_sequences(...))``
bit for bit (tests/test_context_parallel.py).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..packing.checks import as_device, check_bool, check_fill, check_pack_scalars, check_separator
from ..packing.fields import check_pad_values, check_policy, prepare_fields
from ..packing.sequences import _backend_for, check_layout, plan_layout, source_tokens
from ..packing.tensors import host_tensor, to_device
from .contract import apply_contract, check_contract, check_shard_slots
from .shard import (CP_OUTPUT_KEYS, CPShardInfo, _check_cp, _cp_geometry, _cp_op, _host_layout, _shard_outputs,
                    _src_index_host)


class FusedPlan:
    """Host facts of a fused shard: the packed row's layout and where each of its segments starts in the source."""

    __slots__ = ("cu", "seg_src", "cup", "local_len", "local_cu")

    def __init__(self, segments, shape, seq_lengths: np.ndarray, cp_size: int, cp_rank: int, mode: str):
        cu, owner = _host_layout(shape, segments)
        src_offsets = np.concatenate(([0], np.cumsum(seq_lengths, dtype=np.int64)))
        self.cu = cu
        self.seg_src = np.full(len(owner), -1, np.int64)  # -1: a padding segment
        real = owner >= 0
        if real.any():
            self.seg_src[real] = src_offsets[segments.seq_index[owner[real]]] + segments.start[owner[real]]
        self.cup, self.local_len, self.local_cu = _cp_geometry(cu, cp_size, cp_rank, mode)

    def source_index(self, cp_size: int, cp_rank: int, zigzag: bool) -> tuple:
        """(source token of each local position or -1, whether it is CP padding) on the host: for other
        per-token fields only (the kernel composes the two gathers itself)."""
        packed = _src_index_host(self.cu, self.cup, cp_size, cp_rank, zigzag, self.local_len)
        cp_pad = packed < 0
        if not len(self.seg_src):
            return np.full_like(packed, -1), cp_pad
        seg = np.clip(np.searchsorted(self.cu, np.maximum(packed, 0), side="right") - 1, 0, len(self.seg_src) - 1)
        start = self.seg_src[seg]
        return np.where(cp_pad | (start < 0), -1, start + packed - self.cu[seg]), cp_pad


def _gather_token_field(flat: torch.Tensor, src: np.ndarray, cp_pad: np.ndarray, pad_value, device) -> torch.Tensor:
    """A per-token field of the source split like the ids: packed padding gets ``pad_value`` (what
    pack_sequences puts there), CP padding 0 (what shard_context_parallel puts there)."""
    flat = to_device(flat, device)
    index = to_device(host_tensor(np.maximum(src, 0)), device)
    got = flat.index_select(0, index)
    shape = (-1, *([1] * (got.dim() - 1)))
    real = to_device(host_tensor(src >= 0), device).reshape(shape)
    packed_pad = to_device(host_tensor((src < 0) & ~cp_pad), device).reshape(shape)
    zero = torch.zeros((), dtype=got.dtype, device=device)
    pad = torch.full((), pad_value, dtype=got.dtype, device=device)
    return torch.where(real, got, torch.where(packed_pad, pad, zero)).unsqueeze(0)


def pack_context_parallel(sequences, cp_size: int, cp_rank: int, mode: str = "zigzag", *, lengths=None, labels=None,
                          plan=None, capacity: Optional[int] = None, algorithm: str = "obfd", overlong: str = "error",
                          layout: str = "flat", num_rows: Optional[int] = None, row_len: Optional[int] = None,
                          pad_token_id: int = 0, ignore_index: int = -100, mask_first_label: bool = True,
                          separator_id: Optional[int] = None, position_ids_start: int = 0, device=None,
                          backend: str = "auto", fields: Optional[dict] = None, pad_values: Optional[dict] = None,
                          extra_fields: str = "error", return_info: bool = False,
                          max_sequences: Optional[int] = None, max_length_buckets=None):
    """Context-parallel rank ``cp_rank``'s shard of the batch ``pack_sequences`` would build, in one launch.

    Equal, bit for bit, to ``shard_context_parallel(pack_sequences(sequences, lengths, ...), cp_size, cp_rank,
    mode, ...)`` (same keys: ``input_ids``, ``labels``, ``shift_labels``, ``position_ids``, ``seq_idx``,
    ``cu_seq_lens_q/k``, host-int ``max_length_q/k``, zigzag's ``cu_seqlens_padded``), but the packed row is
    never built: one ``packkit::cp_shard`` launch reads each local token straight from the unpacked source
    (the plan and both gathers are composed on the host, from ints; no host sync).

    Args:
        sequences, lengths, labels, plan, capacity, algorithm, overlong, layout, num_rows, row_len,
            pad_token_id, ignore_index, mask_first_label, position_ids_start, device, backend: as
            :func:`packkit.pack_sequences` (``sequences``: a list of 1-D sequences, or a flat tensor with
            ``lengths``). ``layout="padded"`` shards the ``[num_rows, row_len]`` batch read as one row, as
            ``shard_context_parallel`` does.
        cp_size, cp_rank, mode: as :func:`packkit.shard_context_parallel` (``"zigzag"`` or ``"contiguous"``).
        separator_id: the first label of every document (HF ``DataCollatorWithFlattening``'s option);
            default: ``ignore_index`` if ``mask_first_label`` else the label as it is.
        fields, pad_values, extra_fields: per-token fields (as ``pack_sequences``: per-sample lists, or flat
            ``[sum(lengths), *f]`` tensors with ``lengths``) follow the same split (packed padding:
            ``pad_values.get(name, 0)``; CP padding: 0); an all-ones ``attention_mask`` is left out. Vision
            inputs and ``extra_fields="keep"`` lists are not supported here (ValueError): pack, then shard.
        return_info: also return the :class:`CPShardInfo` for :func:`packkit.unshard_context_parallel`,
            which puts per-token outputs of all ranks back in the packed row's order.
        max_sequences: the static-shape contract per rank shard (docs/packing.md "Static shapes"): N sequence
            slots, ``cu_seq_lens_q/k`` (and zigzag's ``cu_seqlens_padded``) always ``N + 1`` long, unused slots
            repeating the last offset; every other output as without it. The shard is one row, so its segments
            (documents and padding tails, every row's in the padded layout) must be at most N: more are refused
            by name, never cut (plan fewer per batch: ``PackedBatchSampler(max_sequences=N)``).
        max_length_buckets: the shard's ``max_length_q/k`` rounded up to a bucket (``"pow2"`` or a list of ints,
            as :func:`packkit.pack_sequences`; never above the shard's length).
    """
    _check_cp(cp_size, cp_rank, mode)
    check_layout(layout)
    check_bool(return_info, "return_info")
    pad_token_id, ignore_index, position_ids_start, mask_first_label = check_pack_scalars(
        pad_token_id, ignore_index, position_ids_start, mask_first_label)
    if separator_id is not None:
        check_separator(separator_id, ignore_index)
    check_policy(extra_fields)  # with or without fields (3 passed silently when there were none)
    flat_ids, seq_lengths, flat_labels = source_tokens(sequences, lengths, labels)
    token_fields, pads = {}, check_pad_values(pad_values)
    if fields:
        sorted_fields, pads, _ = prepare_fields(fields, seq_lengths, flat_ids, extra_fields=extra_fields,
                                                pad_values=pad_values, mrope=None, reserved=CP_OUTPUT_KEYS)
        unsupported = [*sorted_fields.vision, *sorted_fields.keep]
        if unsupported:
            raise ValueError(f"pack_context_parallel: fields {sorted(unsupported)} (vision inputs or "
                             f"extra_fields='keep' lists) are not split per token; use pack_sequences, then "
                             f"shard_context_parallel")
        token_fields = sorted_fields.token
    max_sequences, max_length_buckets = check_contract(max_sequences, max_length_buckets)
    segments, shape = plan_layout(seq_lengths, plan, capacity, algorithm, overlong, layout, row_len, num_rows)
    fused = FusedPlan(segments, shape, seq_lengths, cp_size, cp_rank, mode)
    if max_sequences is not None:
        check_shard_slots(fused.cu, len(segments.length), cp_size, mode, max_sequences)
    zigzag = mode == "zigzag"

    device = flat_ids.device if device is None else as_device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    which = _backend_for(device, backend)
    ids = to_device(flat_ids.contiguous(), device)
    lab = ids if flat_labels is None else to_device(flat_labels.contiguous(), device)
    cu_dev = to_device(host_tensor(fused.cu.astype(np.int32)), device)
    cup_dev = to_device(host_tensor(fused.cup.astype(np.int32)), device) if zigzag else cu_dev
    seg_src_dev = to_device(host_tensor(fused.seg_src), device)
    first = separator_id if separator_id is not None else (ignore_index if mask_first_label else None)
    for name, value, dtype in (("pad_token_id", pad_token_id, ids.dtype), ("ignore_index", ignore_index, lab.dtype),
                               ("separator_id", first, lab.dtype)):
        if value is not None:
            check_fill(value, dtype, name)
    outs = _cp_op(which)(ids, lab, None, cu_dev, cup_dev, cp_size, cp_rank, zigzag, fused.local_len,
                         int(pad_token_id), int(ignore_index), seg_src_dev, int(position_ids_start),
                         None if first is None else int(first))
    out = _shard_outputs(outs, fused.local_cu, cup_dev if zigzag else None, device)
    apply_contract(out, max_sequences, max_length_buckets, fused.local_len)
    if token_fields:
        src, cp_pad = fused.source_index(cp_size, cp_rank, zigzag)
        for name, flat in token_fields.items():
            check_fill(pads.get(name, 0), flat.dtype, f"pad_values[{name!r}]")  # as pack_sequences: no silent cast
            out[name] = _gather_token_field(flat, src, cp_pad, pads.get(name, 0), device)
    if not return_info:
        return out
    return out, CPShardInfo(cp_size, cp_rank, mode, fused.cu, fused.cup, int(fused.cu[-1]), fused.local_len, outs[4])
