"""Building a :class:`~packkit.PackedIterableDataset`'s items from planned rows of pieces.

``ds`` is the dataset, read for its packing settings (capacity, layout, rows_per_item, pad values, ...).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ...context_parallel import pack_context_parallel, shard_context_parallel
from ...context_parallel.shard import CP_OUTPUT_KEYS
from ...packing.sequences import pack_sequences
from ...packing.static_shapes import documents_per_row
from ...planning.planner import Plan


def pieces_per_row(max_sequences: Optional[int], layout: str, rows_per_item: Optional[int], context_parallel,
                   capacity: int):
    """The planner's pieces-per-row limit under ``max_sequences`` N slots per item row, or per item's CP shard
    (None: no limit)."""
    if max_sequences is None:
        return None
    k = rows_per_item or 1
    if context_parallel is not None:  # N slots for the rank's shard: every row's segments, + contiguous end padding
        cp_size, _, mode = context_parallel
        end = int(mode == "contiguous" and (layout == "flat" or capacity % cp_size != 0))
        per_row = (max_sequences - end) // k - (layout == "padded")  # a padded row's tail takes a slot
        if per_row < 1:
            raise ValueError(f"max_sequences={max_sequences} leaves no slot for a document in each of the "
                             f"{k} rows of an item's CP shard (padding tails{' and the end CP padding' if end else ''}"
                             " take slots); raise max_sequences or lower rows_per_item")
        return per_row
    if layout == "padded":
        return documents_per_row(max_sequences)  # a row's padding takes a slot
    # flat: the item's k rows, no padding, share its N slots
    if max_sequences < k:
        raise ValueError(f"max_sequences={max_sequences} is below rows_per_item={k}: in the flat layout an item's "
                         "rows share its N slots, one piece per row at least")
    return max_sequences // k


def pack_rows(ds, rows: list, num_rows: Optional[int]) -> dict:
    """``pack_sequences`` of ``rows`` (lists of pieces), one row per list; with ``context_parallel=`` the
    rank's shard of it: straight from the pieces in one ``cp_shard`` launch (``pack_context_parallel``), or
    packed then sharded when the pieces carry extra fields."""
    pieces = [p for row in rows for p in row]
    lengths = np.fromiter((len(p[2]) for p in pieces), np.int64, len(pieces))
    offsets = np.zeros(len(rows) + 1, np.int64)
    offsets[1:] = np.cumsum([len(row) for row in rows])
    ids = torch.from_numpy(np.concatenate([p[2] for p in pieces]))
    labels = None
    if any(p[3] is not None for p in pieces):
        labels = torch.from_numpy(np.concatenate([p[2] if p[3] is None else p[3] for p in pieces]))
    padded = ds.layout == "padded"
    names = list(dict.fromkeys(k for p in pieces if p[4] for k in p[4]))
    fields = {k: [p[4].get(k) if p[4] else None for p in pieces] for k in names}
    reserved = (CP_OUTPUT_KEYS if ds.context_parallel is not None else ()) + (
        ("example_ids",) if ds.return_example_ids else ())
    for key in [k for k in reserved if k in fields]:  # this dataset's own outputs: never replaced silently
        if ds.extra_fields != "drop":
            raise ValueError(f"example field {key!r} would be replaced by the dataset's own output; remove it from "
                             f"the examples or pass extra_fields='drop'")
        del fields[key]
    args = dict(labels=labels, plan=Plan.from_bins(lengths, np.split(np.arange(len(lengths)), offsets[1:-1]),
                                                  ds.capacity, algorithm=ds.algorithm),
                layout=ds.layout, num_rows=num_rows if padded else None, row_len=ds.capacity if padded else None,
                pad_token_id=ds.pad_token_id, ignore_index=ds.ignore_index, mask_first_label=ds.mask_first_label,
                position_ids_start=ds.position_ids_start, max_sequences=ds.max_sequences)
    cp = ds.context_parallel
    if cp is not None and not fields:
        return pack_context_parallel(ids, *cp, lengths=lengths, **args)
    if cp is not None:  # the contract is the shard's: pack the rows without it
        args["max_sequences"] = None
    batch = pack_sequences(ids, lengths, fields=fields, pad_values=ds.pad_values, extra_fields=ds.extra_fields,
                           mrope=ds.mrope, **args)
    if cp is None:
        return batch
    return shard_context_parallel(batch, *cp, pad_token_id=ds.pad_token_id, ignore_index=ds.ignore_index,
                                  max_sequences=ds.max_sequences)

def add_example_ids(ds, batch: dict, rows: list) -> dict:
    if ds.return_example_ids:
        per_row = [[p[0] for p in row] for row in rows]
        if ds.rows_per_item is None:
            batch["example_ids"] = per_row[0]
        else:
            if ds.layout == "padded":
                per_row += [[] for _ in range(ds.rows_per_item - len(rows))]
            batch["example_ids"] = per_row
    return batch

def item_of(ds, rows: list) -> dict:
    """One item: ``pack_sequences`` of its rows (padded to ``rows_per_item`` rows in the padded layout)."""
    return add_example_ids(ds, pack_rows(ds, rows, ds.rows_per_item), rows)

def items_of(ds, rows: list) -> list:
    """``len(rows) // k`` items of ``k`` rows each, equal key by key to :func:`item_of` of each group.

    One ``pack_sequences`` call packs them all (per-call overhead dominates one small row); each item
    is then cut out of it: its rows' tokens, its ``cu_seq_lens`` entries shifted to start at 0 and its
    ``seq_idx`` renumbered from 0. Slices are cloned so an item never keeps the others' memory alive
    (nor ships it to the main process from a DataLoader worker).
    """
    k = ds.rows_per_item or 1
    cap = ds.capacity
    if ds.mrope is not None or ds.context_parallel is not None or ds.max_sequences is not None \
            or any(p[4] for row in rows for p in row):
        # Extra fields (vision tensors, [4, B, L] positions): one pack per item, no slicing to get wrong.
        # Context parallelism: one fused cp_shard launch per item, straight from its pieces. max_sequences: each
        # item's cu_seq_lens has its own fixed slots (pack_sequences pads them).
        return [item_of(ds, rows[j * k:(j + 1) * k]) for j in range(len(rows) // k)]
    batch = pack_rows(ds, rows, None)
    piece_len = [[len(p[2]) for p in row] for row in rows]
    row_tokens = np.array([sum(r) for r in piece_len], np.int64)
    row_longest = np.array([max(r) for r in piece_len], np.int64)
    padded = ds.layout == "padded"
    if padded:  # output segments per row: its pieces, plus one for a padding tail
        segs = np.array([len(r) for r in rows], np.int64) + (row_tokens < cap)
    else:
        segs = np.array([len(r) for r in rows], np.int64)
    seg_cum = np.concatenate(([0], np.cumsum(segs))).tolist()
    tok_cum = np.concatenate(([0], np.cumsum(row_tokens))).tolist()
    ids, labels, pos, seq_idx, cu = (batch[key] for key in ("input_ids", "labels", "position_ids", "seq_idx",
                                                            "cu_seq_lens_q"))
    items = []
    for j in range(len(rows) // k):
        r0, r1 = j * k, (j + 1) * k
        s0, s1 = seg_cum[r0], seg_cum[r1]
        longest = int(row_longest[r0:r1].max())
        if padded:
            window = (slice(r0, r1),)
            shift = r0 * cap
            longest = max(longest, int(cap - row_tokens[r0:r1].min()))
        else:
            window = (slice(None), slice(tok_cum[r0], tok_cum[r1]))
            shift = tok_cum[r0]
        cu_item = cu[s0:s1 + 1] - shift
        item = {"input_ids": ids[window].clone(), "labels": labels[window].clone(),
                "position_ids": pos[window].clone(), "seq_idx": seq_idx[window] - s0,
                "cu_seq_lens_q": cu_item, "cu_seq_lens_k": cu_item, "max_length_q": longest,
                "max_length_k": longest}
        items.append(add_example_ids(ds, item, rows[r0:r1]))
    return items
