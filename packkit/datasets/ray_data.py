"""``pack_dataset`` on Ray Data: a ``ray.data.Dataset`` packed across a cluster with one global plan.

Stages (``docs/scale.md`` has the sizes):

1. the input's blocks (Arrow tables in the object store) are validated and their lengths and a content digest
   of every row read by one Ray task per block, in parallel;
2. the driver puts the rows in the order of their digests (Ray's block order is its scheduler's), plans once,
   from the lengths alone, and cuts the output rows into ``num_blocks`` chunks;
3. **exchange**: one task per input block cuts the segments it holds into one piece per output chunk
   (a pack op call; a sample goes only to the chunk whose rows hold it);
4. one task per output chunk receives only its pieces and packs its rows (``pack_table``).

The output is ``ray.data.from_arrow_refs`` of the chunks, in plan order: every kept token exactly once,
and equal rows and seed give the same dataset, whatever order the blocks arrive in. ``ray`` is imported inside the functions.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import numpy as np

from .arrow_packing import (MAX_CHUNK_TOKENS, TokenColumn, check_row_lengths, pack_table, pack_values, select_columns,
                            token_column)
from ..planning.planner import CostSpec, Segments, _as_count, as_extra_cost
from .global_plan import (check_extra_cost_type, check_options, extra_cost_column, extra_cost_values, plan_rows,
                          report_from_plan)

logger = logging.getLogger("packkit")


def _arrow(block):
    from ray.data.block import BlockAccessor

    return BlockAccessor.for_block(block).to_arrow()


def _block_rows(block) -> int:
    return _arrow(block).num_rows


def _block_lengths(block, names: list, row_offset: int, cost_column: Optional[str] = None):
    """((lengths, content keys, extra costs or None), None) or (None, (error class name, message)): errors name
    global rows, raised on the driver; the keys are :func:`row_keys` of the block's rows (and their extra cost)."""
    table = _arrow(block)
    try:
        cols = [token_column(n, table.column(n), row_offset=row_offset) for n in names]
        lengths, keys, costs = check_row_lengths(cols, row_offset=row_offset), row_keys(table, names), None
        if cost_column is not None:
            costs = extra_cost_values(table.column(cost_column), cost_column)
            with np.errstate(over="ignore"):  # equal tokens, other cost: another row
                keys[:, 0] = _mix(keys[:, 0] ^ costs.view(np.uint64))
        return (lengths, keys, costs), None
    except (ValueError, TypeError) as exc:
        return None, (type(exc).__name__, str(exc))


_MASK64 = (1 << 64) - 1
_SALTS = (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03)  # one per 64-bit half of a key


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def row_keys(table, names: list) -> np.ndarray:
    """uint64 ``[rows, 2]``: a 128-bit digest of each row's content (every packed column's values and lengths).

    Ray Data hands blocks over in an order its scheduler picks; planning rows in the order of these keys makes
    the plan a function of the rows alone. Rows with equal keys are equal (but for a 2**-128 chance), so which
    of them is planned first changes nothing in the output."""
    with np.errstate(over="ignore"):
        keys = np.zeros((table.num_rows, 2), np.uint64)
        for c, name in enumerate(names):
            column = table.column(name)
            parts = []
            for chunk in column.chunks:
                offsets = chunk.offsets.to_numpy().astype(np.int64)
                lo, hi = int(offsets[0]), int(offsets[-1])
                values = chunk.values.slice(lo, hi - lo).to_numpy(zero_copy_only=False).astype(np.int64)
                counts = np.diff(offsets)
                within = np.arange(hi - lo, dtype=np.int64) - np.repeat(offsets[:-1] - lo, counts)
                part = np.zeros((len(counts), 2), np.uint64)
                for h, salt in enumerate(_SALTS):
                    x = _mix(values.view(np.uint64) + np.uint64((salt * (c + 1)) & _MASK64))
                    x = _mix(x ^ (within.view(np.uint64) * np.uint64(salt)))  # where in the row the value sits
                    cumulative = np.concatenate((np.zeros(1, np.uint64), np.cumsum(x, dtype=np.uint64)))
                    sums = cumulative[offsets[1:] - lo] - cumulative[offsets[:-1] - lo]  # per row, mod 2**64
                    part[:, h] = _mix(sums + _mix(counts.view(np.uint64) + np.uint64(salt)))
                parts.append(part)
            keys = _mix(keys * np.uint64(31) + (np.concatenate(parts) if parts else keys))
    return keys


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
                     shuffle: bool = True, seed: Optional[int] = 0, position_ids: bool = False,
                     return_report: bool = False, num_blocks: Optional[int] = None, extra_cost=None):
    """:func:`packkit.pack_dataset` for a ``ray.data.Dataset``; returns a ``ray.data.Dataset``.

    ``num_blocks``: output blocks (= packing tasks); default: as many as the input has (at least one,
    and enough that none holds more than 2^28 tokens). Needs a running Ray (``ray.init``) or starts one.

    Ray Data gives no stable row order (its scheduler decides the order blocks arrive in), so the rows are planned
    in the order of a 128-bit digest of their content: equal rows and ``seed`` give the same output whatever the
    block order. ``shuffle=False`` orders steps by that content order (there is no source order to keep). The
    report's index arrays name rows in the dataset's own block order (Ray is asked to preserve it for this read).
    ``extra_cost``: one value per row in that order, or the name of a numeric column (read by the tasks, not packed).
    """
    import ray

    seq_length = _as_count(seq_length, "seq_length")
    dp_size = _as_count(dp_size, "dp_size")
    shuffle, seed, position_ids = check_options(algorithm, overlong, cost, shuffle, seed, position_ids)
    all_names = dataset.schema().names
    cost_column = extra_cost_column(extra_cost, all_names)
    if cost_column is not None:
        check_extra_cost_type(_arrow_type(dataset, cost_column), cost_column)
    names = select_columns([c for c in all_names if c != cost_column], columns)
    excluded = [c for c in all_names if c not in names]
    if cost_column is None and extra_cost is not None:  # an array: its type and values before the pass over the data
        try:
            n = len(extra_cost)
        except TypeError:
            n = 0
        as_extra_cost(extra_cost, n)
    refs = _blocks_in_order(dataset.select_columns(names + ([cost_column] if cost_column else [])))

    rows_task = ray.remote(_block_rows)
    block_rows = np.array(ray.get([rows_task.remote(r) for r in refs]), dtype=np.int64)
    nonempty = block_rows > 0
    refs = [r for r, keep in zip(refs, nonempty) if keep]
    block_rows = block_rows[nonempty]
    if not len(refs):
        raise ValueError("the dataset is empty: there is nothing to pack")
    row_start = np.concatenate(([0], np.cumsum(block_rows)))

    lengths_task = ray.remote(_block_lengths)
    results = ray.get([lengths_task.remote(r, names, int(row_start[b]), cost_column) for b, r in enumerate(refs)])
    for _, error in results:
        if error is not None:
            raise (TypeError if error[0] == "TypeError" else ValueError)(error[1])
    lengths = np.concatenate([r[0][0] for r in results])
    keys = np.concatenate([r[0][1] for r in results])
    extra = as_extra_cost(np.concatenate([r[0][2] for r in results]) if cost_column else extra_cost, len(lengths))
    types = {n: _arrow_type(dataset, n) for n in names}

    # Rows in the order of their content keys, not in the order the blocks came: the same rows and seed give the
    # same plan whatever block order Ray's scheduler delivered (issue 46).
    canonical = content_order(keys)
    p, segments, empty_removed = plan_rows(lengths[canonical], seq_length, algorithm=algorithm, overlong=overlong,
                                           dp_size=dp_size, cost=cost, shuffle=shuffle, seed=seed,
                                           extra_cost=None if extra is None else extra[canonical])
    seq, start, seg_len, bin_offsets = segments
    seq = canonical[seq]  # back to positions in the blocks as read
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
    report = report_from_plan(p, lengths=lengths[canonical], seq_length=seq_length, columns=names,
                              excluded=excluded, empty_removed=empty_removed, rows=num_rows)
    for name in ("dropped", "truncated", "split", "zero_length"):  # input rows, as the blocks were read this time
        setattr(report, name, np.sort(canonical[getattr(report, name)]))
    logger.info("packkit.pack_dataset (ray): %s", report.summary())
    return (out, report) if return_report else out


def _blocks_in_order(dataset):
    """``dataset.to_arrow_refs()`` in the dataset's block order. Ray's executor otherwise hands blocks over as its tasks
    finish (``preserve_order`` is off by default), so the report's row indices would follow the scheduler: on a busy
    machine they named other rows than the single-process report's. The dataset's own context is set for this read
    and restored after (it may be the caller's)."""
    options = dataset.context.execution_options
    saved = options.preserve_order
    options.preserve_order = True
    try:
        return dataset.to_arrow_refs()
    finally:
        options.preserve_order = saved


def content_order(keys: np.ndarray) -> np.ndarray:
    """The rows (positions as read) sorted by their :func:`row_keys`: the order they are planned in."""
    return np.lexsort((keys[:, 1], keys[:, 0]))


def _arrow_type(dataset, name: str):
    schema = dataset.schema()
    base = getattr(schema, "base_schema", schema)
    return base.field(name).type
