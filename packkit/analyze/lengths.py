"""Where a sample's length comes from, and reading all lengths of a file into an int64 array.

A sample's length is the **sum** over the chosen fields (seed 001 counts text + image tokens):

* ``count_fields``: integers holding a token count (integral floats such as ``12.0`` are accepted);
* ``ids_fields``: lists of token ids (the length is the list's length; Arrow lists are measured
  with ``list_value_length``, no Python loop);
* ``text_fields``: strings (or chat-message lists) counted with a local tokenizer;

* ``image_size_fields`` / ``image_width_field`` + ``image_height_field``: image sizes, turned into image
  tokens by a Qwen-VL resize rule (``vision``, :mod:`packkit.analyze.vision_tokens`);

plus ``extra_tokens`` per sample (e.g. an EOS or separator appended when packing).
Text files and ``.npy`` arrays of lengths need no fields.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from .errors import AnalyzeError, optional
from .readers import KIND, Chunk, ColumnarSource, FastPathUnavailable, RecordSource, open_source, read_lengths_file
from .safe_input import Snapshot
from .tokenize import TokenCounter
from .vision_tokens import VisionTokenRule, image_tokens

COUNT_NAMES = ("length", "num_tokens", "n_tokens", "token_count", "num_token", "seq_len", "seqlen", "len",
               "total_tokens", "tokens")
IDS_NAMES = ("input_ids", "token_ids", "ids", "tokens")
TEXT_NAMES = ("text", "messages", "conversations", "content")


@dataclass(frozen=True)
class LengthSpec:
    count_fields: tuple[str, ...] = ()
    ids_fields: tuple[str, ...] = ()
    text_fields: tuple[str, ...] = ()
    tokenizer: str | None = None
    add_special_tokens: bool = True
    extra_tokens: int = 0
    image_size_fields: tuple[str, ...] = ()
    image_width_field: str | None = None
    image_height_field: str | None = None
    vision: VisionTokenRule | None = None

    def __post_init__(self):
        for name in ("count_fields", "ids_fields", "text_fields", "image_size_fields"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(value))
        if self.text_fields and self.tokenizer is None:
            raise AnalyzeError(f"text fields {list(self.text_fields)} need --tokenizer DIR (a local tokenizer folder)")
        if isinstance(self.extra_tokens, bool) or not isinstance(self.extra_tokens, int) or self.extra_tokens < 0:
            raise AnalyzeError(f"extra_tokens must be a non-negative integer, got {self.extra_tokens!r}")
        if (self.image_width_field is None) != (self.image_height_field is None):
            raise AnalyzeError("image width and height fields go together: pass both --image-width-field and "
                               "--image-height-field")
        if self.image_fields and self.vision is None:
            raise AnalyzeError("image size fields need a resize rule: pass --vision-model qwen2-vl|qwen2.5-vl|qwen3-vl "
                               "(and optionally --patch-size/--merge-size/--min-pixels/--max-pixels)")
        if self.vision is not None and not self.image_fields:
            raise AnalyzeError("--vision-model needs image sizes: pass --image-size-field NAME or "
                               "--image-width-field W --image-height-field H")

    @property
    def token_fields(self) -> tuple[str, ...]:
        return self.count_fields + self.ids_fields + self.text_fields

    @property
    def image_fields(self) -> tuple[str, ...]:
        pair = (self.image_width_field, self.image_height_field) if self.image_width_field is not None else ()
        return self.image_size_fields + pair

    @property
    def fields(self) -> tuple[str, ...]:
        return self.token_fields + self.image_fields

    def describe(self) -> dict:
        return asdict(self)


@dataclass
class LengthsRead:
    lengths: np.ndarray
    info: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# field resolution


def _guess_spec(spec: LengthSpec, names: list[str], types: dict, path: Path) -> LengthSpec:
    """Fills in the length source from the column names when no token field was given."""
    if spec.token_fields:
        return spec
    if spec.tokenizer is not None:
        for name in TEXT_NAMES:
            if name in names:
                return replace(spec, text_fields=(name,))
    for name in COUNT_NAMES:
        if name in names and types.get(name) == "count":
            return replace(spec, count_fields=(name,))
    for name in IDS_NAMES:
        if name in names and types.get(name) == "ids":
            return replace(spec, ids_fields=(name,))
    raise AnalyzeError(f"cannot tell which field holds the length (fields: {', '.join(names) or 'none'}); pass "
                       "--length-field NAME (token counts), --ids-field NAME (token id lists) or --text-field NAME "
                       "with --tokenizer DIR; several are summed", path)


def _value_kind(value) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "count"
    if isinstance(value, list):
        return "ids"
    if isinstance(value, str):
        return "text"
    return None


def _arrow_kind(pa, dtype) -> str | None:
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype):
        return "count"
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return "ids"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "text"
    return None


def _get(record: dict, name: str):
    """``record[name]``, or a nested ``a.b.c`` path when no key ``name`` exists; KeyError if missing."""
    if name in record:
        return record[name]
    value = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(name)
        value = value[part]
    return value


def _arrow_column(pa, table, name: str, path: Path):
    names = table.schema.names
    if name in names:
        return table.column(name)
    parts = name.split(".")
    if parts[0] in names:
        column = table.column(parts[0])
        for part in parts[1:]:
            if not pa.types.is_struct(column.type) or column.type.get_field_index(part) < 0:
                break
            column = optional("pyarrow.compute").struct_field(column, part)
        else:
            return column
    raise AnalyzeError(f"no field {name!r} (fields: {', '.join(names)})", path)


# ---------------------------------------------------------------------------------------------
# per-chunk lengths


class _Retry(Exception):
    """A fast-path chunk had a bad value: re-read with the Python reader for an exact line number."""


def _first(pc, mask) -> int:
    return int(pc.index(mask, True).as_py())


def _count_column_arrow(pa, pc, column, name, chunk: Chunk, path) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    dtype = column.type

    def fail(i: int, problem: str):
        if not chunk.exact:
            raise _Retry()
        raise AnalyzeError(problem, path, chunk.location(i))

    if column.null_count:
        fail(_first(pc, pc.is_null(column)), f"field {name!r} is null")
    if pa.types.is_integer(dtype):
        if pa.types.is_signed_integer(dtype) and len(column) and pc.min(column).as_py() < 0:
            i = _first(pc, pc.less(column, 0))
            fail(i, f"negative length {column[i].as_py()} in field {name!r}")
        if pa.types.is_uint64(dtype) and len(column) and pc.max(column).as_py() >= 2**63:
            i = _first(pc, pc.greater_equal(column, pa.scalar(2**63, pa.uint64())))
            fail(i, f"length {column[i].as_py()} in field {name!r} does not fit in int64")
        return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if pa.types.is_floating(dtype):
        values = column.to_numpy(zero_copy_only=False)
        bad = ~np.isfinite(values) | (values != np.floor(values))
        if bad.any():
            i = int(np.argmax(bad))
            fail(i, f"non-integer length {float(values[i])!r} in field {name!r}")
        if (values < 0).any():
            i = int(np.argmax(values < 0))
            fail(i, f"negative length {float(values[i]):g} in field {name!r}")
        return values.astype(np.int64)
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        hint = "; to tokenize text use --text-field with --tokenizer"
    elif _arrow_kind(pa, dtype) == "ids":
        hint = "; for token id lists use --ids-field"
    else:
        hint = ""
    if not chunk.exact:
        raise _Retry()
    raise AnalyzeError(f"field {name!r} has type {dtype}, not an integer token count{hint}", path)


def _ids_column_arrow(pa, pc, column, name, chunk: Chunk, path) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if _arrow_kind(pa, column.type) != "ids":
        if not chunk.exact:
            raise _Retry()
        raise AnalyzeError(f"field {name!r} has type {column.type}, not a list of token ids", path)
    if column.null_count:
        if not chunk.exact:
            raise _Retry()
        raise AnalyzeError(f"field {name!r} is null", path, chunk.location(_first(pc, pc.is_null(column))))
    return pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _text_column_arrow(pa, pc, column, name, chunk: Chunk, path, counter: TokenCounter) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not chunk.exact and column.null_count:
        raise _Retry()
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        raise AnalyzeError(f"field {name!r} has type {column.type}, not text; for token counts use --length-field", path)
    return counter.count(column.to_pylist(), name, lambda i: (path, chunk.location(i)))


def _arrow_chunk_lengths(chunk: Chunk, spec: LengthSpec, counter, path) -> np.ndarray:
    pa = optional("pyarrow")
    pc = optional("pyarrow.compute")
    total = np.full(len(chunk), spec.extra_tokens, dtype=np.int64)
    for name in spec.count_fields:
        total += _count_column_arrow(pa, pc, _arrow_column(pa, chunk.table, name, path), name, chunk, path)
    for name in spec.ids_fields:
        total += _ids_column_arrow(pa, pc, _arrow_column(pa, chunk.table, name, path), name, chunk, path)
    for name in spec.text_fields:
        total += _text_column_arrow(pa, pc, _arrow_column(pa, chunk.table, name, path), name, chunk, path, counter)
    if spec.vision is not None:
        def column(name):
            return _arrow_column(pa, chunk.table, name, path).to_pylist()

        total += _images_of(spec, len(chunk), column, lambda i: (path, chunk.location(i)))
    return total


def _images_of(spec: LengthSpec, n: int, column, where) -> np.ndarray:
    """Image tokens per sample of a chunk (``column(name)`` gives a field's values as Python objects)."""
    total = np.zeros(n, np.int64)
    for name in spec.image_size_fields:
        total += image_tokens(spec.vision, n, where, sizes=column(name), names=(name, None, None))
    if spec.image_width_field is not None:
        total += image_tokens(spec.vision, n, where, widths=column(spec.image_width_field),
                              heights=column(spec.image_height_field),
                              names=(None, spec.image_width_field, spec.image_height_field))
    return total


def _count_value(value, name: str, where) -> int:
    if isinstance(value, bool) or value is None:
        raise AnalyzeError(f"field {name!r} is {'null' if value is None else 'a boolean'}, not a token count", *where)
    if isinstance(value, int):
        if value < 0:
            raise AnalyzeError(f"negative length {value} in field {name!r}", *where)
        if value >= 2**63:
            raise AnalyzeError(f"length {value} in field {name!r} does not fit in int64", *where)
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise AnalyzeError(f"non-integer length {value!r} in field {name!r}", *where)
        if value < 0:
            raise AnalyzeError(f"negative length {value:g} in field {name!r}", *where)
        return int(value)
    hint = "; to tokenize text use --text-field with --tokenizer" if isinstance(value, str) else (
        "; for token id lists use --ids-field" if isinstance(value, list) else "")
    raise AnalyzeError(f"field {name!r} holds {type(value).__name__} {str(value)[:40]!r}, "
                       f"not an integer token count{hint}", *where)


def _record_chunk_lengths(chunk: Chunk, spec: LengthSpec, counter, path) -> np.ndarray:
    records = chunk.records
    n = len(records)
    total = np.full(n, spec.extra_tokens, dtype=np.int64)

    def where(i):
        return (path, chunk.location(i))

    def values(name):
        out = []
        for i, record in enumerate(records):
            try:
                out.append(_get(record, name))
            except KeyError:
                raise AnalyzeError(f"missing field {name!r} (fields present: {', '.join(record) or 'none'})",
                                   *where(i)) from None
        return out

    for name in spec.count_fields:
        total += np.fromiter((_count_value(v, name, where(i)) for i, v in enumerate(values(name))),
                             dtype=np.int64, count=n)
    for name in spec.ids_fields:
        column = values(name)
        for i, v in enumerate(column):
            if not isinstance(v, list):
                hint = "; to tokenize text use --text-field with --tokenizer" if isinstance(v, str) else ""
                raise AnalyzeError(f"field {name!r} holds {'null' if v is None else type(v).__name__}, "
                                   f"not a list of token ids{hint}", *where(i))
        total += np.fromiter(map(len, column), dtype=np.int64, count=n)
    for name in spec.text_fields:
        total += counter.count(values(name), name, where)
    if spec.vision is not None:
        total += _images_of(spec, n, values, where)
    return total


# ---------------------------------------------------------------------------------------------
# whole file


def _read_columnar(source: ColumnarSource, spec: LengthSpec, limit, progress, path) -> tuple[np.ndarray, LengthSpec]:
    pa = optional("pyarrow")
    types = {n: _arrow_kind(pa, source.schema.field(n).type) for n in source.column_names}
    spec = _guess_spec(spec, source.column_names, types, path)
    for name in spec.fields:  # a missing column is a whole-file problem: report before reading
        top = name if name in source.column_names else name.split(".")[0]
        if top not in source.column_names:
            raise AnalyzeError(f"no field {name!r} (fields: {', '.join(source.column_names)})", path)
    columns = list(dict.fromkeys(n if n in source.column_names else n.split(".")[0] for n in spec.fields))
    counter = TokenCounter(spec.tokenizer, spec.add_special_tokens) if spec.text_fields else None
    desc = f"{'tokenizing' if counter else 'reading'} {path.name}"
    parts = [_arrow_chunk_lengths(chunk, spec, counter, path)
             for chunk in source.chunks(columns, limit, progress, desc)]
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), spec


def _jsonl_schema(pa, spec: LengthSpec):
    if any("." in name for name in spec.fields) or len(set(spec.fields)) != len(spec.fields) or spec.image_fields:
        return None  # image sizes (dicts, lists) are read by the Python reader
    fields = [(n, pa.int64()) for n in spec.count_fields]
    fields += [(n, pa.list_(pa.int64())) for n in spec.ids_fields]
    fields += [(n, pa.large_string()) for n in spec.text_fields]
    return pa.schema(fields)


def _read_records(source: RecordSource, spec: LengthSpec, limit, progress, path) -> tuple[np.ndarray, LengthSpec, str]:
    if not spec.token_fields:
        first = source.first_record()
        if first is None:
            raise AnalyzeError("no samples (the file holds no records)", path)
        spec = _guess_spec(spec, list(first), {k: _value_kind(v) for k, v in first.items()}, path)
    counter = TokenCounter(spec.tokenizer, spec.add_special_tokens) if spec.text_fields else None
    desc = f"{'tokenizing' if counter else 'reading'} {path.name}"
    pa = optional("pyarrow")
    schema = _jsonl_schema(pa, spec) if (pa is not None and source.format == "jsonl") else None
    if schema is not None:
        try:
            parts = [_arrow_chunk_lengths(chunk, spec, counter, path)
                     for chunk in source.jsonl_arrow_chunks(schema, limit, progress, desc)]
            return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), spec, "pyarrow"
        except (FastPathUnavailable, _Retry):
            pass  # the Python reader below reports the problem with its line number, or reads it exactly
    parts = [_record_chunk_lengths(chunk, spec, counter, path) for chunk in source.chunks(limit, progress, desc)]
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), spec, "python"


def read_lengths(path: str | Path, spec: LengthSpec | None = None, *, format: str = "auto", split: str | None = None,
                 max_samples: int | None = None, progress: bool | None = None) -> LengthsRead:
    """Reads every sample's length from ``path`` (see :mod:`packkit.analyze.readers` for the formats).

    Raises :class:`~packkit.analyze.errors.AnalyzeError` naming the file, the line or row and the problem.
    """
    path = Path(path)
    spec = spec or LengthSpec()
    if max_samples is not None and (isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples <= 0):
        raise AnalyzeError(f"max_samples must be a positive integer, got {max_samples!r}")
    snapshot = Snapshot.of(path)
    fmt, source = open_source(path, format, split)
    reader = "pyarrow"
    if KIND[fmt] == "lengths":
        if spec.fields or spec.tokenizer:
            raise AnalyzeError(f"a {fmt} file of lengths has no fields: drop --length-field/--ids-field/"
                               "--text-field/--tokenizer", path)
        lengths = read_lengths_file(path, fmt, max_samples, progress)
        if spec.extra_tokens:
            lengths = lengths + spec.extra_tokens
    elif KIND[fmt] == "columnar":
        lengths, spec = _read_columnar(source, spec, max_samples, progress, path)
    else:
        lengths, spec, reader = _read_records(source, spec, max_samples, progress, path)
    if not path.is_dir():
        snapshot.check(path)  # appended, truncated or rewritten while read: the lengths would be a mix
    if lengths.size == 0:
        raise AnalyzeError("no samples (the dataset is empty)", path)
    info = {"path": str(path), "format": fmt, "split": getattr(source, "split", None), "samples": int(lengths.size),
            "max_samples": max_samples, "reader": reader if KIND[fmt] != "lengths" else "lengths",
            "length_source": {"count_fields": list(spec.count_fields), "ids_fields": list(spec.ids_fields),
                              "text_fields": list(spec.text_fields), "tokenizer": spec.tokenizer,
                              "add_special_tokens": spec.add_special_tokens if spec.text_fields else None,
                              "extra_tokens": spec.extra_tokens,
                              **({"image_size_fields": list(spec.image_size_fields),
                                  "image_width_field": spec.image_width_field,
                                  "image_height_field": spec.image_height_field,
                                  "vision": spec.vision.describe()} if spec.vision is not None else {})}}
    return LengthsRead(np.ascontiguousarray(lengths, dtype=np.int64), info)
