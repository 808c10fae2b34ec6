"""Packing Arrow tables by a plan: per-token list columns in, TRL's pre-packed format out.

Shared by :mod:`packkit.datasets` (one process) and :mod:`packkit.ray_data` (Ray tasks). Tokens move
from the Arrow value buffers (viewed as numpy/torch without a copy when a column is one chunk) through
the C++ ``packkit::pack`` op; output ``ListArray``\\ s are built from the packed values and row offsets
directly. No Python runs per row or per sequence.

Imports pyarrow lazily, so ``import packkit`` does not need it.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from ..packing import ops  # noqa: F401  (registers torch.ops.packkit.*)
from ..planning.planner import Segments

# Largest number of tokens packed per output chunk: Arrow ``list`` offsets and the op's cu_seqlens are int32.
MAX_CHUNK_TOKENS = 1 << 28
RESERVED = ("seq_lengths", "position_ids")


# Tokens per output batch when a column has several Arrow chunks: each batch gathers its source rows
# into one temporary array of about this size (64 MiB of int32 ids).
GATHER_CHUNK_TOKENS = 1 << 24


class TokenColumn(NamedTuple):
    """One per-token list column as buffers: ``values[offsets[i]:offsets[i+1]]`` is row ``i``.

    Fixed-width numbers (any integer or float width, booleans) are moved by the C++ op as raw elements. Any
    other value type (nested lists, strings, structs, ...) or values holding nulls are kept as an Arrow array
    in ``arrow_values`` (``values`` None) and gathered with Arrow's ``take``: TRL packs every list column.

    A column in several Arrow chunks (datasets read from disk come in batches of rows) is not combined:
    ``values`` is None, ``chunks`` holds the chunks, ``row_starts[c]`` is the first row of chunk ``c``,
    ``offsets`` are the offsets the combined column would have (only its row lengths are read), and
    :func:`pack_values` gathers just the rows each output batch needs."""

    name: str
    type: object  # the column's pyarrow list type (kept for the output)
    values: Optional[np.ndarray]  # 1-D, the column's value dtype (bool stays numpy bool)
    offsets: np.ndarray  # int64 [rows + 1], absolute into ``values`` (need not start at 0)
    chunks: tuple = ()
    row_starts: Optional[np.ndarray] = None  # int64 [len(chunks) + 1]
    arrow_values: object = None  # the flat pyarrow values (generic types; ``values`` is None then)


class ColumnTypeError(TypeError, ValueError):
    """A column that cannot be packed (not a list per row). A TypeError, as ``trl.pack_dataset`` raises for it,
    and a ValueError, as packkit did before the drop-in contract (issue 57)."""


def _pa():
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - exercised only without pyarrow
        raise ImportError("packing datasets needs pyarrow: pip install pyarrow (or packkit[datasets])") from None
    return pa


def checked_column_names(names: Sequence[str], columns: Sequence[str]) -> list[str]:
    """``columns`` (deduplicated, in the order given), each a column of ``names``; TypeError / ValueError otherwise."""
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"columns must be a list of column names, got {columns!r}")
    chosen = list(dict.fromkeys(columns))
    unknown = [c for c in chosen if c not in names]
    if unknown:
        raise ValueError(f"columns {unknown} are not in the dataset; its columns are {list(names)}")
    return chosen


def refuse_reserved(chosen: Sequence[str], reserved: Sequence[str]) -> None:
    """An input column pack_dataset would write (seq_lengths, position_ids) is an already-packed dataset."""
    for name in reserved:
        if name in chosen:
            raise ValueError(f"input column {name!r} is reserved: pack_dataset writes it (is the dataset already "
                             f"packed?); leave it out with columns=[...]")


def select_columns(names: Sequence[str], columns: Optional[Sequence[str]]) -> list[str]:
    """The columns to pack: all of ``names`` or exactly ``columns`` (validated; input_ids required)."""
    names = list(names)
    chosen = names if columns is None else checked_column_names(names, columns)
    if "input_ids" not in chosen:
        raise ValueError(f"the dataset must have an 'input_ids' column to pack (columns: {chosen})")
    refuse_reserved(chosen, RESERVED)
    return ["input_ids"] + [c for c in chosen if c != "input_ids"]


def token_column(name: str, column, *, row_offset: int = 0, generic: bool = False) -> TokenColumn:
    """Buffers of a per-token list column (pyarrow ChunkedArray or Array); raises on anything else.

    No copy of the values: one chunk is viewed in place, several are kept as they are (see TokenColumn).
    ``generic=False`` (the Ray path): the values must be integers or booleans without nulls, as before.
    ``generic=True`` (``pack_dataset`` on a ``datasets`` dataset, TRL's contract): any list column packs; a null
    row is an empty row, and values of any type (nulls included) are kept as they are.
    ``row_offset`` only shifts the row numbers in error messages.
    """
    pa = _pa()
    typ = column.type
    if generic and pa.types.is_null(typ) and len(column) == 0:  # 0 rows, type unknown (from_dict({"c": []}))
        return TokenColumn(name, typ, np.zeros(0, np.int64), np.zeros(1, np.int64))  # kept as it is, as TRL
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)):
        raise ColumnTypeError(f"column {name!r} is not per-token (type {typ}); every packed column must be a list "
                              f"per row, like input_ids (trl.pack_dataset refuses it too). Choose the columns to "
                              f"pack with columns=[...]")
    value_type = typ.value_type
    if not generic:
        if pa.types.is_list(value_type) or pa.types.is_large_list(value_type) \
                or pa.types.is_fixed_size_list(value_type) or pa.types.is_struct(value_type):
            raise TypeError(f"column {name!r} is nested ({typ}); packed columns must be flat lists of integers per "
                            f"row")
        if not (pa.types.is_integer(value_type) or pa.types.is_boolean(value_type)):
            raise TypeError(f"column {name!r} holds {value_type}, not integers; packed columns must be lists of "
                            f"integers (or booleans) per row")
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if generic:
        chunks = [_nulls_as_empty(c) for c in chunks]
    if len(chunks) > 1:
        row_starts = np.zeros(len(chunks) + 1, np.int64)
        np.cumsum([len(c) for c in chunks], out=row_starts[1:])
        lengths = [np.diff(_checked_offsets(name, c, row_offset + int(r0), values=not generic))
                   for c, r0 in zip(chunks, row_starts)]
        offsets = np.zeros(int(row_starts[-1]) + 1, np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        return TokenColumn(name, typ, None, offsets, tuple(chunks), row_starts)
    column = chunks[0] if chunks else pa.array([], type=typ)
    offsets = _checked_offsets(name, column, row_offset, values=not generic)
    fixed = pa.types.is_integer(value_type) or pa.types.is_floating(value_type) or pa.types.is_boolean(value_type)
    if generic and (not fixed or _values_have_nulls(column, offsets)):
        return TokenColumn(name, typ, None, offsets, arrow_values=column.values)
    if pa.types.is_boolean(value_type):
        array = column.values.to_numpy(zero_copy_only=False)
    else:
        array = column.values.to_numpy(zero_copy_only=True)
    return TokenColumn(name, typ, array, offsets)


def _nulls_as_empty(chunk):
    """A list Array whose null rows are empty lists (TRL drops a null row of its first column as empty)."""
    if not chunk.null_count:
        return chunk
    pa = _pa()
    import pyarrow.compute as pc

    return pc.if_else(pc.is_null(chunk), pa.scalar([], type=chunk.type), chunk)


def _values_have_nulls(column, offsets: np.ndarray) -> bool:
    lo, hi = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
    return bool(column.values.slice(lo, hi - lo).null_count)


def _checked_offsets(name: str, column, row_offset: int, *, values: bool = True) -> np.ndarray:
    """int64 offsets of one list Array; raises if a row or (``values``) a value inside the rows is null."""
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"column {name!r}: row {row + row_offset} is null; packed columns need a list in every row")
    offsets = column.offsets.to_numpy().astype(np.int64, copy=False)
    if values and _values_have_nulls(column, offsets):
        raise ValueError(f"column {name!r} has null values inside its lists; packed columns must hold integers only")
    return offsets


def _first_negative(col: TokenColumn) -> Optional[tuple[int, np.ndarray, int]]:
    """(value index, offsets, row offset of its chunk) of the first negative value of a signed-integer column."""
    pa = _pa()
    if pa.types.is_null(col.type) or not pa.types.is_signed_integer(col.type.value_type):
        return None
    if col.arrow_values is not None:  # values with nulls
        import pyarrow.compute as pc

        lo, hi = (int(col.offsets[0]), int(col.offsets[-1])) if len(col.offsets) else (0, 0)
        mask = pc.fill_null(pc.less(col.arrow_values.slice(lo, hi - lo), 0), False).to_numpy(zero_copy_only=False)
        hits = np.flatnonzero(mask)
        return (int(hits[0]) + lo, col.offsets, 0) if len(hits) else None
    if col.values is not None:
        values = col.values[int(col.offsets[0]):int(col.offsets[-1])] if len(col.offsets) else col.values[:0]
        negative = np.flatnonzero(values < 0)
        return (int(negative[0]) + int(col.offsets[0]), col.offsets, 0) if len(negative) else None
    for c, chunk in enumerate(col.chunks):
        sub = token_column(col.name, chunk, generic=True)
        found = _first_negative(sub)
        if found is not None:
            return found[0], sub.offsets, int(col.row_starts[c])
    return None


def _check_token_ids(col: TokenColumn, row_offset: int, negative: str = "error") -> None:
    """input_ids must be token ids >= 0: a negative id only fails later, in the model's embedding.
    ``negative="warn"`` (TRL's contract: it packs them) warns instead of raising."""
    found = _first_negative(col)
    if found is None:
        return
    first, offsets, chunk_row = found
    row = int(np.searchsorted(offsets, first, side="right")) - 1 + chunk_row + row_offset
    message = (f"column 'input_ids', row {row} holds a negative token id; input_ids must be token ids >= 0 (mask "
               "targets with -100 in labels, not in input_ids)")
    if negative == "warn":
        warnings.warn(message + "; packed as it is, as trl.pack_dataset does", stacklevel=4)
        return
    raise ValueError(message)


def check_row_lengths(columns: Sequence[TokenColumn], *, row_offset: int = 0, lead: int = 0,
                      negative: str = "error") -> np.ndarray:
    """int64 lengths of ``columns[lead]`` (input_ids); ValueError naming row and column where another disagrees,
    or the row of a negative token id in a column named input_ids (``negative="warn"``: a warning)."""
    if columns[lead].name == "input_ids":
        _check_token_ids(columns[lead], row_offset, negative)
    first = columns[lead]
    lengths = np.diff(first.offsets)
    for col in columns:
        if col is first:
            continue
        other = np.diff(col.offsets)
        if len(other) != len(lengths):
            raise ValueError(f"column {col.name!r} has {len(other)} rows but {first.name} has {len(lengths)}")
        bad = np.flatnonzero(other != lengths)
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"column {col.name!r}, row {i + row_offset}: {int(other[i])} values but {first.name} "
                             f"has {int(lengths[i])} tokens; per-token columns must match {first.name} row by row "
                             f"({len(bad)} rows disagree)")
    return lengths


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # Arrow buffers are read-only; the op only reads them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def pack_values(col: TokenColumn, seg_seq: np.ndarray, seg_start: np.ndarray, cu: np.ndarray):
    """The segments' tokens of ``col`` one after another (``cu`` = int32 cumulative segment lengths): a numpy
    array, or a pyarrow Array for a column of another value type (``col.arrow_values``)."""
    if col.chunks:  # gather the rows these segments use from their chunks into one array, then pack that
        rows, local_seq = np.unique(seg_seq, return_inverse=True)
        which = np.searchsorted(col.row_starts, rows, side="right") - 1
        cuts = np.flatnonzero(np.diff(which)) + 1
        pieces = [col.chunks[int(which[a])].take(_pa().array(rows[a:b] - col.row_starts[int(which[a])]))
                  for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(rows)])))]
        gathered = token_column(col.name, _pa().concat_arrays(pieces) if pieces else _pa().array([], type=col.type),
                                generic=True)
        return pack_values(gathered, local_seq.astype(np.int64).reshape(-1), seg_start, cu)
    total = int(cu[-1])
    if col.arrow_values is not None:  # any other value type: Arrow gathers the tokens by index
        cu64 = cu.astype(np.int64)
        first = col.offsets[seg_seq] + seg_start - cu64[:-1]
        index = np.repeat(first, np.diff(cu64)) + np.arange(total, dtype=np.int64)
        return col.arrow_values.take(_pa().array(index))
    num = len(seg_seq)
    out = torch.ops.packkit.pack(_as_tensor(col.values), _as_tensor(col.offsets), _as_tensor(seg_seq),
                                 _as_tensor(seg_start), _as_tensor(cu), torch.arange(num, dtype=torch.int32),
                                 1, total, True)
    return out.numpy()


def _list_array(typ, offsets: np.ndarray, values):
    pa = _pa()
    value_type = typ.value_type
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        flat = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    elif pa.types.is_boolean(value_type):
        flat = pa.array(values, type=value_type)
    else:  # no copy: the Arrow buffer keeps the numpy array (and the tensor under it) alive
        flat = pa.Array.from_buffers(value_type, len(values), [None, pa.py_buffer(values)])
    large = pa.types.is_large_list(typ)
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(pa.array(offsets.astype(np.int64 if large else np.int32)), flat, type=typ)


def seq_lengths_type(columns: Sequence[TokenColumn]):
    """``seq_lengths``' value type, as ``trl.pack_dataset`` writes it: the length type of the first column's
    offsets (int32 for ``list``, int64 for ``large_list``)."""
    pa = _pa()
    return pa.int64() if pa.types.is_large_list(columns[0].type) else pa.int32()


def packed_schema(columns: Sequence[TokenColumn], *, position_ids: bool = False, seq_lengths: bool = True):
    """The output schema of :func:`iter_packed_batches` / :func:`pack_table` (``seq_lengths=False``: the
    ``"wrapped"`` strategy's, which has none)."""
    pa = _pa()
    fields = [(c.name, c.type) for c in columns]
    if seq_lengths:
        fields.append(("seq_lengths", pa.list_(seq_lengths_type(columns))))
    if position_ids:
        fields.append(("position_ids", pa.list_(pa.int64())))
    return pa.schema(fields)


def iter_packed_batches(columns: Sequence[TokenColumn], segments: Segments, *, position_ids: bool = False,
                        max_chunk_tokens: Optional[int] = None, seq_lengths: bool = True):
    """Yields the packed rows as pyarrow RecordBatches of at most ``max_chunk_tokens`` tokens (a bin larger
    than that is its own batch), one row per bin of ``segments``: the packed columns, ``seq_lengths``
    (list<int32>, the segment lengths of the row) and, if asked, ``position_ids`` (list<int64>, restarting
    at 0 in every segment). Bins must be non-empty. Only one batch is built at a time, so a caller that
    writes each one out holds one batch of output, not the whole table."""
    pa = _pa()
    max_chunk_tokens = MAX_CHUNK_TOKENS if max_chunk_tokens is None else max_chunk_tokens
    if any(c.chunks for c in columns):
        max_chunk_tokens = min(max_chunk_tokens, GATHER_CHUNK_TOKENS)
    schema = packed_schema(columns, position_ids=position_ids, seq_lengths=seq_lengths)
    length_dtype = np.int64 if seq_lengths and pa.types.is_int64(schema.field("seq_lengths").type.value_type) \
        else np.int32
    seg_seq, seg_start, seg_length, bin_offsets = (np.ascontiguousarray(a, dtype=np.int64) for a in segments)
    cum_seg = np.concatenate(([0], np.cumsum(seg_length)))
    row_tokens = cum_seg[bin_offsets]  # cumulative tokens at each row boundary
    num_rows = len(bin_offsets) - 1
    r0 = 0
    while r0 < num_rows:
        # rows r0..r1-1 hold at most max_chunk_tokens (at least one row)
        r1 = int(np.searchsorted(row_tokens, row_tokens[r0] + max_chunk_tokens, side="right")) - 1
        r1 = min(max(r1, r0 + 1), num_rows)
        s0, s1 = int(bin_offsets[r0]), int(bin_offsets[r1])
        cu = (cum_seg[s0:s1 + 1] - cum_seg[s0]).astype(np.int32)
        row_offsets = row_tokens[r0:r1 + 1] - row_tokens[r0]
        arrays = [_list_array(col.type, row_offsets, pack_values(col, seg_seq[s0:s1], seg_start[s0:s1], cu))
                  for col in columns]
        lengths = seg_length[s0:s1].astype(np.int32)
        if seq_lengths:
            arrays.append(pa.ListArray.from_arrays(pa.array((bin_offsets[r0:r1 + 1] - s0).astype(np.int32)),
                                                   pa.array(lengths.astype(length_dtype))))
        if position_ids:
            pos = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), lengths)
            arrays.append(pa.ListArray.from_arrays(pa.array(row_offsets.astype(np.int32)), pa.array(pos)))
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
        r0 = r1


def pack_table(columns: Sequence[TokenColumn], segments: Segments, *, position_ids: bool = False,
               max_chunk_tokens: Optional[int] = None, seq_lengths: bool = True):
    """:func:`iter_packed_batches` as one pyarrow Table (in memory)."""
    pa = _pa()
    batches = iter_packed_batches(columns, segments, position_ids=position_ids, max_chunk_tokens=max_chunk_tokens,
                                  seq_lengths=seq_lengths)
    return pa.Table.from_batches(list(batches), schema=packed_schema(columns, position_ids=position_ids,
                                                                     seq_lengths=seq_lengths))
