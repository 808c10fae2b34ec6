"""``pack_on_device(..., plan="device")``: plan and pack with zero host synchronisations, under the fixed contract.

The batch has one shape whatever the lengths: ``[num_rows, capacity]`` tokens and ``num_rows * max_sequences + 1``
``cu_seq_lens`` (:mod:`.static_shapes`), ``max_length_q/k`` = ``capacity`` (the longest sequence is a device
value; a larger ``max_length`` only tells the attention kernel it may see longer ones). Its tensors equal, bit for
bit, ``pack_sequences(..., plan=<host Plan of the same rows>, layout="padded", num_rows=, max_sequences=)``
(tests/test_device_plan.py). They are built here with gathers rather than the ``packkit::pack_batch`` op: that op
takes its segment count as a host int, which is the data itself.

What did not fit is reported on the device (``info.unplaced``, ``info.bins == -1``), never dropped silently: with
lengths on the CPU every check is free and a batch that does not fit raises ValueError; with lengths on a GPU the
caller reads ``info.unplaced`` where it syncs anyway (e.g. with the loss).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..planning.arg_rules import Choice, Int, check_args
from ..planning.planner import Plan
from .checks import check_fill, check_pack_scalars, refuse_meta
from .device_plan import plan_bins

DEVICE_OPTIONS = ("num_rows", "max_sequences", "pad_token_id", "ignore_index", "mask_first_label",
                  "position_ids_start")


class DevicePackInfo(NamedTuple):
    """What the device path knows, all on the device (no host copy is made)."""

    bins: torch.Tensor  # int64 [n]: each document's row, -1 if it has no tokens or did not fit
    unplaced: torch.Tensor  # int64 0-d: documents with tokens that did not fit (0 when the whole batch is packed)
    rows_used: torch.Tensor  # int64 0-d: rows holding a document (always a prefix of the rows)
    max_seqlen: torch.Tensor  # int64 0-d: the longest sequence of the batch, padding tails included
    capacity: int


def host_plan(info: DevicePackInfo, lengths) -> Plan:
    """The host :class:`packkit.Plan` of the device's rows (reads ``info.bins`` back: a sync, at the caller's point),
    for :func:`packkit.unpack_sequences` via ``pack_sequences(plan=...)`` or for inspection. ValueError when some
    document did not fit (``info.unplaced > 0``): a Plan covers every document with tokens."""
    bins = info.bins.cpu().numpy()
    lengths = np.asarray(lengths.cpu() if isinstance(lengths, torch.Tensor) else lengths, np.int64)
    rows = max(int(bins.max()) + 1 if len(bins) else 0, 1)
    key = np.where(bins < 0, rows, bins)  # unplaced last, dropped below
    order = np.argsort(key, kind="stable")  # each row's documents in input order
    groups = np.split(order, np.searchsorted(key[order], np.arange(1, rows + 1)))
    return Plan.from_bins(lengths, groups[:rows], info.capacity)


def pack_bins(input_ids, lengths, bins, labels, row_len, num_rows, max_sequences, pad_token_id=0,
              ignore_index=-100, mask_first_label=True, position_ids_start=0):
    """The padded batch of rows ``bins`` (each document's row, -1: none), as fixed-shape torch ops on the device.

    Slots go row by row: a row's documents in input order, then its padding tail if it has one; the slots no row
    uses repeat the last offset at the end (the contract's ``cu_seq_lens``)."""
    R, L, N = num_rows, row_len, max_sequences
    dev = input_ids.device
    lens = lengths.to(torch.int64)
    placed = bins >= 0
    key = torch.where(placed, bins, R)  # unplaced documents sort after every row
    order = torch.sort(key, stable=True).indices
    skey = key.index_select(0, order)
    kept = torch.where(placed, lens, 0)
    slen = kept.index_select(0, order)
    count = torch.zeros(R + 1, dtype=torch.int64, device=dev).index_add_(0, key, placed.to(torch.int64))[:R]
    load = torch.zeros(R + 1, dtype=torch.int64, device=dev).index_add_(0, key, kept)[:R]
    tail = load < L
    used = count + tail
    slot_start = torch.cumsum(used, 0) - used
    row_first = torch.cumsum(count, 0) - count  # sorted position of each row's first document
    cs = torch.cumsum(slen, 0)
    cs_ext = torch.cat((cs.new_zeros(1), cs))  # [n + 1]: tokens before each sorted position
    row = skey.clamp(max=R - 1)
    first = row_first.index_select(0, row)
    splaced = skey < R
    dummy = R * N + 1  # scatter target of what has no slot (dropped with the last entry)
    slot = torch.where(splaced, slot_start.index_select(0, row) + torch.arange(skey.shape[0], device=dev) - first,
                       dummy)
    doc_start = row * L + cs_ext[:-1] - cs_ext.index_select(0, first)
    rows = torch.arange(R, device=dev)
    tail_slot = torch.where(tail, slot_start + count, dummy)
    cu = torch.full((R * N + 2,), R * L, dtype=torch.int64, device=dev)
    cu.scatter_(0, slot, doc_start).scatter_(0, tail_slot, rows * L + load)
    cu = cu[:R * N + 1]
    owner = torch.full((R * N + 2,), -1, dtype=torch.int64, device=dev).scatter_(0, slot, order)[:R * N]
    token = torch.arange(R * L, device=dev)
    seg = torch.searchsorted(cu, token, right=True) - 1  # repeated offsets equal R * L: never <= a token
    within = token - cu.index_select(0, seg)
    doc = owner.index_select(0, seg)
    is_pad = doc < 0
    src_offsets = torch.cat((lens.new_zeros(1), torch.cumsum(lens.clamp(min=0), 0)))  # [n + 1]: never empty
    last = max(input_ids.shape[0] - 1, 0)
    src = (src_offsets.index_select(0, doc.clamp(min=0)) + within).clamp_(0, last)  # never out of bounds
    label_src = input_ids if labels is None else labels

    def gather(source, fill, first_fill):
        if source.shape[0] == 0:  # no tokens at all: every position is padding
            return torch.full((R * L,), fill, dtype=source.dtype, device=dev)
        out = source.index_select(0, src).masked_fill_(is_pad, fill)
        return out.masked_fill_(within == 0, fill) if first_fill else out

    ids = gather(input_ids, pad_token_id, False)
    lab = gather(label_src, ignore_index, mask_first_label)
    pos = within + position_ids_start
    cu32 = cu.to(torch.int32)
    shape = (R, L)
    batch = {"input_ids": ids.view(shape), "labels": lab.view(shape), "position_ids": pos.view(shape),
             "seq_idx": seg.to(torch.int32).view(shape), "cu_seq_lens_q": cu32, "cu_seq_lens_k": cu32,
             "max_length_q": L, "max_length_k": L}
    rows_used = (count > 0).sum()
    max_seqlen = torch.diff(cu).max() if R * N else cu.new_zeros(())
    return batch, rows_used, max_seqlen


def check_device_args(input_ids, lengths, labels, capacity, options, algorithm, overlong, layout):
    """Checked (capacity, num_rows, max_sequences, pad, ignore, mask_first, position_start) of the device path."""
    unknown = sorted(set(options) - set(DEVICE_OPTIONS))
    if unknown:
        raise TypeError(f"pack_on_device(plan='device') does not take {', '.join(unknown)}; its options: "
                        f"{', '.join(DEVICE_OPTIONS)}")
    for name in ("num_rows", "max_sequences"):
        if options.get(name) is None:
            raise ValueError(f"pack_on_device(plan='device') needs {name}= (an int >= 1): its output shapes cannot "
                             "follow the data without a host sync")
    check_args(Choice("algorithm", ("obfd",)), Choice("overlong", ("error",)), Choice("layout", ("padded",)),
               values=(algorithm, overlong, layout))  # the device planner is best-fit; what does not fit is reported
    capacity, rows, slots = check_args(Int("capacity", 1, 2**31 - 1), Int("num_rows", 1, 2**31 - 1),
                                       Int("max_sequences", 1, 2**31 - 2),
                                       values=(capacity, options["num_rows"], options["max_sequences"]))
    if rows * capacity >= 2**31 or rows * slots + 1 > 2**31 - 1:
        raise ValueError(f"num_rows x capacity = {rows} x {capacity} tokens and num_rows x max_sequences = {rows} x "
                         f"{slots} slots must fit int32 cu_seq_lens")
    pad, ignore, start, mask_first = check_pack_scalars(options.get("pad_token_id", 0), options.get("ignore_index", -100),
                                                        options.get("position_ids_start", 0),
                                                        options.get("mask_first_label", True))
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.dtype.is_floating_point \
            or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError("lengths must be a 1-D integer tensor (on the device, for plan='device')")
    refuse_meta(lengths, "lengths")
    if lengths.device.type != "cpu" and lengths.device != input_ids.device:
        raise ValueError(f"lengths are on {lengths.device} but input_ids on {input_ids.device}: pass lengths on "
                         "input_ids' device (or the CPU, where every check is free)")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if labels is not None:
        if not isinstance(labels, torch.Tensor) or labels.shape != input_ids.shape or labels.device != input_ids.device:
            raise ValueError("labels must be a tensor of input_ids' shape on input_ids' device")
        check_fill(ignore, labels.dtype, "ignore_index")
    check_fill(pad, input_ids.dtype, "pad_token_id")
    return capacity, rows, slots, pad, ignore, mask_first, start


def device_pack(input_ids, lengths, capacity, *, labels=None, algorithm="obfd", overlong="error", layout="padded",
                **options):
    """pack_on_device's ``plan="device"`` path (see the module doc); returns ``(batch, DevicePackInfo)``."""
    capacity, rows, slots, pad, ignore, mask_first, start = check_device_args(
        input_ids, lengths, labels, capacity, options, algorithm, overlong, layout)
    if lengths.device.type == "cpu":  # free to check here: a batch that cannot be packed is refused by name
        check_host_lengths(lengths, input_ids.shape[0])
    bins, unplaced = plan_bins(lengths, capacity, rows, slots)
    if lengths.device.type == "cpu":
        check_fit(bins, unplaced, lengths, capacity, rows, slots)
    bins = bins.to(input_ids.device, non_blocking=True)
    batch, rows_used, max_seqlen = pack_bins(input_ids, lengths.to(input_ids.device, non_blocking=True), bins, labels,
                                             capacity, rows, slots, pad, ignore, mask_first, start)
    return batch, DevicePackInfo(bins, unplaced.to(input_ids.device, non_blocking=True), rows_used, max_seqlen,
                                 capacity)


def check_host_lengths(lengths: torch.Tensor, num_tokens: int) -> None:
    lens = lengths.to(torch.int64)
    if lens.numel() and int(lens.min()) < 0:
        i = int(torch.argmin(lens))
        raise ValueError(f"lengths must be >= 0; lengths[{i}] is {int(lens[i])}")
    if int(lens.sum()) != num_tokens:
        raise ValueError(f"lengths sum to {int(lens.sum())} but input_ids has {num_tokens} tokens")


def check_fit(bins, unplaced, lengths, capacity, rows, slots) -> None:
    if int(unplaced) == 0:
        return
    lens = lengths.to(torch.int64)
    i = int(torch.nonzero((bins < 0) & (lens > 0))[0, 0])  # lengths on the CPU: reading them is free
    why = (f"it has {int(lens[i])} tokens, more than capacity={capacity}" if int(lens[i]) > capacity else
           f"num_rows={rows} rows of capacity={capacity} with max_sequences={slots} slots are full")
    raise ValueError(f"{int(unplaced)} documents do not fit the batch (first: document {i}: {why}); pass more "
                     "num_rows or a larger capacity / max_sequences, or fewer documents")
