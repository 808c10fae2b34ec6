"""``pack_dataset`` on Ray Data: a ``ray.data.Dataset`` packed across a cluster with one global plan.

Stages (``docs/scale.md`` has the sizes):

1. the input's blocks (Arrow tables in the object store) are validated and their lengths read by one
   Ray task per block, in parallel (only the offsets buffers are read);
2. the driver plans once, from the lengths alone, and cuts the output rows into ``num_blocks`` chunks;
3. **exchange**: one task per input block cuts the segments it holds into one piece per output chunk
   (a pack op call; a sample goes only to the chunk whose rows hold it);
4. one task per output chunk receives only its pieces and packs its rows (``pack_table``).

The output is ``ray.data.from_arrow_refs`` of the chunks, in plan order: every kept token exactly once,
and equal input (same blocks) and seed give the same dataset. ``ray`` is imported inside the functions.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import numpy as np

from .arrow_packing import (MAX_CHUNK_TOKENS, TokenColumn, check_row_lengths, pack_table, pack_values, select_columns,
                            token_column)
from ..planning.planner import CostSpec, Segments, _as_count
from .global_plan import check_options, plan_rows, report_from_plan

logger = logging.getLogger("packkit")


def _arrow(block):
    from ray.data.block import BlockAccessor

    return BlockAccessor.for_block(block).to_arrow()


def _block_rows(block) -> int:
    return _arrow(block).num_rows


def _block_lengths(block, names: list, row_offset: int):
    """(lengths, None) or (None, (error class name, message)): errors name global rows, raised on the driver."""
    table = _arrow(block)
    try:
        cols = [token_column(n, table.column(n), row_offset=row_offset) for n in names]
        return check_row_lengths(cols, row_offset=row_offset), None
    except (ValueError, TypeError) as exc:
        return None, (type(exc).__name__, str(exc))


def _cut_pieces(block, names: list, rows: np.ndarray, starts: np.ndarray, lengths: np.ndarray, bounds: np.ndarray):
    """This block's segments (local rows, in output order) packed flat and cut at ``bounds``: one dict of
    numpy arrays per output chunk (None where the chunk needs nothing from this block)."""
    table = _arrow(block)
    cu = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    flat = {n: pack_values(token_column(n, table.column(n)), rows, starts, cu) for n in names}
    token_bounds = cu[bounds].astype(np.int64)
    out = []
    for k in range(len(bounds) - 1):
        a, b = int(token_bounds[k]), int(token_bounds[k + 1])
        out.append({n: flat[n][a:b] for n in names} if bounds[k + 1] > bounds[k] else None)
    return out if len(out) > 1 else out[0]


def _pack_chunk(types: dict, names: list, order: np.ndarray, lengths: np.ndarray, bin_offsets: np.ndarray,
                position_ids: bool, *pieces):
    """Rows of one output chunk. ``pieces`` are its segments' tokens grouped by source block (in block
    order); ``order`` lists the chunk's segments in that grouped order, so segment j is source ``inv[j]``."""
    parts = [p for p in pieces if p is not None]
    src_lengths = lengths[order]
    offsets = np.concatenate(([0], np.cumsum(src_lengths))).astype(np.int64)
    cols = [TokenColumn(n, types[n], np.concatenate([p[n] for p in parts]), offsets) for n in names]
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order), dtype=np.int64)
    segments = Segments(inverse, np.zeros(len(order), np.int64), lengths, bin_offsets)
    return pack_table(cols, segments, position_ids=position_ids)


def pack_ray_dataset(dataset, seq_length: int, *, algorithm: Optional[str] = None, overlong: str = "error",
                     columns: Optional[Sequence[str]] = None, dp_size: int = 1, cost: CostSpec = "tokens",
                     seed: Optional[int] = None, position_ids: bool = False, return_report: bool = False,
                     num_blocks: Optional[int] = None):
    """:func:`packkit.pack_dataset` for a ``ray.data.Dataset``; returns a ``ray.data.Dataset``.

    ``num_blocks``: output blocks (= packing tasks); default: as many as the input has (at least one,
    and enough that none holds more than 2^28 tokens). Needs a running Ray (``ray.init``) or starts one.
    """
    import ray

    seq_length = _as_count(seq_length, "seq_length")
    dp_size = _as_count(dp_size, "dp_size")
    position_ids = check_options(algorithm, overlong, cost, seed, position_ids)
    names = select_columns(dataset.schema().names, columns)
    excluded = [c for c in dataset.schema().names if c not in names]
    refs = dataset.select_columns(names).to_arrow_refs()

    rows_task = ray.remote(_block_rows)
    block_rows = np.array(ray.get([rows_task.remote(r) for r in refs]), dtype=np.int64)
    nonempty = block_rows > 0
    refs = [r for r, keep in zip(refs, nonempty) if keep]
    block_rows = block_rows[nonempty]
    if not len(refs):
        raise ValueError("the dataset is empty: there is nothing to pack")
    row_start = np.concatenate(([0], np.cumsum(block_rows)))

    lengths_task = ray.remote(_block_lengths)
    results = ray.get([lengths_task.remote(r, names, int(row_start[b])) for b, r in enumerate(refs)])
    for _, error in results:
        if error is not None:
            raise (TypeError if error[0] == "TypeError" else ValueError)(error[1])
    lengths = np.concatenate([r[0] for r in results])
    types = {n: _arrow_type(dataset, n) for n in names}

    p, segments, empty_removed = plan_rows(lengths, seq_length, algorithm=algorithm, overlong=overlong,
                                           dp_size=dp_size, cost=cost, seed=seed)
    seq, start, seg_len, bin_offsets = segments
    num_rows = len(bin_offsets) - 1
    total = int(seg_len.sum())
    if num_blocks is None:
        num_blocks = max(len(refs), -(-total // MAX_CHUNK_TOKENS), 1)
    num_blocks = max(1, min(_as_count(num_blocks, "num_blocks"), max(num_rows, 1)))
    # Output chunks: row ranges of about equal tokens (rows stay whole).
    row_tokens = np.concatenate(([0], np.cumsum(np.add.reduceat(seg_len, bin_offsets[:-1])
                                                if num_rows else np.zeros(0, np.int64))))
    targets = np.arange(1, num_blocks) * (total / num_blocks)
    row_cuts = np.unique(np.concatenate(([0], np.searchsorted(row_tokens, targets), [num_rows])))
    seg_cuts = bin_offsets[row_cuts]  # segment ranges of the chunks

    # Exchange, map side: per block, its segments in global (= chunk-major) order.
    seg_block = np.searchsorted(row_start, seq, side="right") - 1
    by_block = np.argsort(seg_block, kind="stable")
    block_seg_start = np.searchsorted(seg_block[by_block], np.arange(len(refs) + 1))
    cut_task = ray.remote(_cut_pieces)
    num_chunks = len(seg_cuts) - 1
    pieces = []
    for b, ref in enumerate(refs):
        idx = by_block[block_seg_start[b]:block_seg_start[b + 1]]
        bounds = np.searchsorted(idx, seg_cuts)  # this block's segments per chunk
        pieces.append(cut_task.options(num_returns=num_chunks).remote(
            ref, names, seq[idx] - row_start[b], start[idx], seg_len[idx], bounds))
    if num_chunks == 1:
        pieces = [[p] for p in pieces]

    # Reduce side: each chunk packs only its own pieces.
    pack_task = ray.remote(_pack_chunk)
    out_refs = []
    for k in range(num_chunks):
        s0, s1 = int(seg_cuts[k]), int(seg_cuts[k + 1])
        order = np.argsort(seg_block[s0:s1], kind="stable")  # the chunk's segments grouped by block
        offsets = bin_offsets[row_cuts[k]:row_cuts[k + 1] + 1] - s0
        out_refs.append(pack_task.remote(types, names, order, seg_len[s0:s1], offsets, position_ids,
                                         *[pieces[b][k] for b in range(len(refs))]))
    out = ray.data.from_arrow_refs(out_refs)
    report = report_from_plan(p, lengths=lengths, seq_length=seq_length, columns=names, excluded=excluded,
                              empty_removed=empty_removed, rows=num_rows)
    logger.info("packkit.pack_dataset (ray): %s", report.summary())
    return (out, report) if return_report else out


def _arrow_type(dataset, name: str):
    schema = dataset.schema()
    base = getattr(schema, "base_schema", schema)
    return base.field(name).type
