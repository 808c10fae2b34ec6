"""File formats -> chunks of rows, streamed.

Three kinds of source:

* **columnar** (Parquet, Arrow IPC file/stream, a saved HF ``datasets`` folder): pyarrow record
  batches of only the needed columns, with their 0-based row offset;
* **records** (JSON Lines, JSON): Python dicts with their line (1-based) or row (0-based) number.
  JSON Lines first tries pyarrow's multithreaded JSON reader (``jsonl_arrow_chunks``); any problem
  there sends the caller back to the exact, line-numbered Python reader;
* **lengths** (a text file with one integer per line, or a ``.npy`` array): read straight to int64.
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import AnalyzeError, optional, require
from .progress import bar
from .safe_input import MAX_LINE_BYTES, LineBoundedReader, input_stat, open_input, read_document, read_lines

FORMATS = ("jsonl", "json", "parquet", "arrow", "hf", "text", "npy")
KIND = {"jsonl": "records", "json": "records", "parquet": "columnar", "arrow": "columnar", "hf": "columnar",
        "text": "lengths", "npy": "lengths"}
_EXTENSIONS = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet",
    ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow", ".txt": "text", ".lengths": "text",
    ".npy": "npy",
}
CHUNK_ROWS = 65_536
RECORD_CHUNK = 4_096


class FastPathUnavailable(Exception):
    """The pyarrow fast path cannot read this input exactly; use the Python reader instead."""


@dataclass
class Chunk:
    """Rows ``offset .. offset + len`` of a source.

    ``table`` (pyarrow Table/RecordBatch) for columnar chunks; ``records`` and ``numbers`` (line or row
    number of each record, ``unit`` says which) for Python records. ``exact`` is False for chunks from
    the JSON Lines fast path, whose row indices are not line numbers: a bad value there must be
    re-read by the Python reader to be reported with its line.
    """

    offset: int
    table: object = None
    records: list | None = None
    numbers: list | None = None
    unit: str = "row"
    exact: bool = True

    def __len__(self) -> int:
        return len(self.records) if self.records is not None else self.table.num_rows

    def location(self, i: int) -> str:
        """Where row ``i`` of this chunk is, e.g. ``"line 12"`` or ``"row 11"``."""
        if self.numbers is not None:
            return f"{self.unit} {self.numbers[i]}"
        return f"row {self.offset + i}"


# ---------------------------------------------------------------------------------------------
# format detection


def _base_suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _sniff_json(path: Path) -> str:
    """``.json`` files are often JSON Lines: one object on the first line and more lines after it."""
    with open_input(path) as f:
        first = f.readline(MAX_LINE_BYTES + 1)
        while first and not first.strip():
            first = f.readline(MAX_LINE_BYTES + 1)
        if not first.lstrip().startswith(b"{") or len(first) > MAX_LINE_BYTES:
            return "json"
        try:
            json.loads(first)
        except (ValueError, RecursionError):
            return "json"
        rest = f.read(4096)
    return "jsonl" if rest.strip() else "json"


def detect_format(path: str | Path, fmt: str = "auto") -> str:
    """The format of ``path``: from ``fmt`` if given, else the extension, else the first bytes."""
    path = Path(path)
    input_stat(path)  # missing, unreadable or special files (FIFOs, devices, sockets) end here
    if fmt != "auto":
        if fmt not in FORMATS:
            raise AnalyzeError(f"unknown format {fmt!r}; allowed: auto, {', '.join(FORMATS)}")
        if (fmt == "hf") != path.is_dir():
            raise AnalyzeError("format 'hf' needs a folder written by datasets' save_to_disk" if fmt == "hf"
                               else f"a folder cannot be read as {fmt}; use --format hf for a saved dataset", path)
        return fmt
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            return "hf"
        raise AnalyzeError("a folder must be a dataset saved with datasets' save_to_disk "
                           "(state.json or dataset_dict.json not found)", path)
    ext = _base_suffix(path)
    if ext in _EXTENSIONS:
        return _sniff_json(path) if _EXTENSIONS[ext] == "json" else _EXTENSIONS[ext]
    with open_input(path) as f:
        head = f.read(64)
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"ARROW1") or head[:4] == b"\xff\xff\xff\xff":
        return "arrow"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    stripped = head.lstrip()
    if stripped.startswith(b"{"):
        return _sniff_json(path)
    if stripped.startswith(b"["):
        return "json"
    if re.match(rb"^\s*\d", head):
        return "text"
    raise AnalyzeError(f"unknown format (extension {ext or 'none'!r}, first bytes {head[:16]!r}); "
                       f"pass --format with one of: {', '.join(FORMATS)}", path)


# ---------------------------------------------------------------------------------------------
# columnar sources


def _pyarrow(feature: str):
    return require("pyarrow", "pyarrow", feature)


class ColumnarSource:
    """Parquet / Arrow / saved-dataset input: column names, and record batches of selected columns."""

    def __init__(self, path: Path, fmt: str, split: str | None = None):
        self.path, self.format, self.split = path, fmt, split
        self.num_rows: int | None = None
        pa = _pyarrow(f"reading {fmt} files")
        if fmt == "parquet":
            pq = require("pyarrow.parquet", "pyarrow", "reading Parquet files")
            try:
                self._parquet = pq.ParquetFile(str(path))
            except (pa.ArrowException, OSError) as e:
                raise AnalyzeError(f"not a readable Parquet file: {e}", path) from None
            self.schema = self._parquet.schema_arrow
            self.num_rows = self._parquet.metadata.num_rows
        elif fmt == "arrow":
            self._table = self._read_ipc(pa, path)
            self.schema, self.num_rows = self._table.schema, self._table.num_rows
        else:
            self._table = self._read_saved_dataset(path, split)
            self.schema, self.num_rows = self._table.schema, self._table.num_rows

    @staticmethod
    def _read_ipc(pa, path: Path):
        # Read into memory, not memory-mapped: a mapped file truncated by another process would kill this
        # one with SIGBUS instead of the "changed while being read" error.
        try:
            source = pa.OSFile(str(path), "rb")
        except (pa.ArrowException, OSError) as e:
            raise AnalyzeError(f"cannot open: {e}", path) from None
        errors = []
        for opener in (pa.ipc.open_file, pa.ipc.open_stream):
            try:
                source.seek(0)
                return opener(source).read_all()
            except (pa.ArrowException, OSError) as e:
                errors.append(str(e))
        raise AnalyzeError(f"not an Arrow IPC file or stream ({errors[0]})", path)

    def _read_saved_dataset(self, path: Path, split: str | None):
        datasets = require("datasets", "datasets", "reading a saved Hugging Face dataset folder")
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as e:  # datasets raises several types for a bad folder
            raise AnalyzeError(f"cannot load the saved dataset: {type(e).__name__}: {e}", path) from None
        if isinstance(ds, datasets.DatasetDict):
            names = list(ds.keys())
            if split is None:
                if len(names) == 1 or "train" in names:
                    split = names[0] if len(names) == 1 else "train"
                else:
                    raise AnalyzeError(f"the folder holds splits {names}; choose one with --split", path)
            if split not in ds:
                raise AnalyzeError(f"no split {split!r}; splits: {', '.join(names)}", path)
            ds = ds[split]
            self.split = split
        elif split is not None:
            raise AnalyzeError(f"--split {split!r} given but the folder holds a single Dataset", path)
        if getattr(ds, "_indices", None) is not None:
            ds = ds.flatten_indices()
        return ds.data.table

    @property
    def column_names(self) -> list[str]:
        return list(self.schema.names)

    def chunks(self, columns: list[str], limit: int | None, progress: bool | None, desc: str) -> Iterator[Chunk]:
        total = self.num_rows if limit is None else min(self.num_rows, limit)
        offset = 0
        with bar(progress, total=total, desc=desc, unit="rows", unit_scale=True) as pbar:
            if self.format == "parquet":
                batches = self._parquet.iter_batches(batch_size=CHUNK_ROWS, columns=columns)
            else:
                batches = self._table.select(columns).to_batches(max_chunksize=CHUNK_ROWS)
            for batch in batches:
                if limit is not None and offset + batch.num_rows > limit:
                    batch = batch.slice(0, limit - offset)
                if batch.num_rows:
                    yield Chunk(offset, table=batch)
                offset += batch.num_rows
                pbar.update(batch.num_rows)
                if limit is not None and offset >= limit:
                    break


# ---------------------------------------------------------------------------------------------
# JSON Lines / JSON records


class RecordSource:
    """JSON Lines or JSON input."""

    def __init__(self, path: Path, fmt: str):
        self.path, self.format = path, fmt
        self.num_rows: int | None = None
        self._json_rows: list | None = None  # a JSON document is parsed once

    def first_record(self) -> dict | None:
        for chunk in self.chunks(limit=1, progress=False, desc=""):
            return chunk.records[0]
        return None

    def chunks(self, limit: int | None, progress: bool | None, desc: str) -> Iterator[Chunk]:
        if self.format == "jsonl":
            yield from self._jsonl_chunks(limit, progress, desc)
        else:
            yield from self._json_chunks(limit, progress, desc)

    def _jsonl_chunks(self, limit, progress, desc) -> Iterator[Chunk]:
        path = self.path
        gz = path.suffix == ".gz"
        total = None if gz else os.path.getsize(path)
        records, numbers, offset = [], [], 0
        with open_input(path) as f, bar(progress, total=total, desc=desc, unit="B", unit_scale=True) as pbar:
            for number, line in read_lines(f, path):
                pbar.update(len(line))
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except UnicodeDecodeError as e:
                    raise AnalyzeError(f"not valid UTF-8 ({e.reason} at byte {e.start})", path, f"line {number}") from None
                except json.JSONDecodeError as e:
                    raise AnalyzeError(f"malformed JSON: {e.msg} (column {e.colno})", path, f"line {number}") from None
                except RecursionError:
                    raise AnalyzeError(_TOO_DEEP, path, f"line {number}") from None
                if not isinstance(record, dict):
                    raise AnalyzeError(f"expected a JSON object, got {_json_type(record)}", path, f"line {number}")
                records.append(record)
                numbers.append(number)
                if limit is not None and offset + len(records) >= limit:
                    break
                if len(records) == RECORD_CHUNK:
                    yield Chunk(offset, records=records, numbers=numbers, unit="line")
                    offset += len(records)
                    records, numbers = [], []
        if records:
            yield Chunk(offset, records=records, numbers=numbers, unit="line")

    def _json_chunks(self, limit, progress, desc) -> Iterator[Chunk]:
        path = self.path
        if self._json_rows is None:
            with open_input(path) as f:
                data = read_document(f, path)
            try:
                top = json.loads(data)
            except UnicodeDecodeError as e:
                raise AnalyzeError(f"not valid UTF-8 ({e.reason} at byte {e.start})", path) from None
            except json.JSONDecodeError as e:
                raise AnalyzeError(f"malformed JSON: {e.msg} (column {e.colno})", path, f"line {e.lineno}") from None
            except RecursionError:
                raise AnalyzeError(_TOO_DEEP, path) from None
            self._json_rows = _json_rows(top, path)
        rows = self._json_rows
        self.num_rows = len(rows)
        if limit is not None:
            rows = rows[:limit]
        with bar(progress, total=len(rows), desc=desc, unit="rows", unit_scale=True) as pbar:
            for start in range(0, len(rows), RECORD_CHUNK):
                part = rows[start:start + RECORD_CHUNK]
                for i, record in enumerate(part):
                    if not isinstance(record, dict):
                        raise AnalyzeError(f"expected a JSON object, got {_json_type(record)}", path, f"row {start + i}")
                yield Chunk(start, records=part, numbers=list(range(start, start + len(part))), unit="row")
                pbar.update(len(part))

    def jsonl_arrow_chunks(self, schema, limit: int | None, progress: bool | None, desc: str) -> Iterator[Chunk]:
        """JSON Lines through pyarrow's reader with an explicit schema of only the needed fields.

        Raises :class:`FastPathUnavailable` on any parse or conversion problem (the Python reader then
        reports it with its line number). Blank lines are skipped, so row indices are not line numbers:
        chunks are marked ``exact=False``.
        """
        pa = optional("pyarrow")
        pj = optional("pyarrow.json")
        if pa is None or pj is None or self.format != "jsonl":
            raise FastPathUnavailable("pyarrow.json not available")
        with open_input(self.path) as f:
            yield from self._arrow_batches(pa, pj, f, schema, limit, progress, desc)

    def _arrow_batches(self, pa, pj, f, schema, limit, progress, desc) -> Iterator[Chunk]:
        # Any failure, a line over MAX_LINE_BYTES included (AnalyzeError from LineBoundedReader), sends the
        # caller to the Python reader, which reports it with its line number.
        try:
            stream = pa.PythonFile(LineBoundedReader(f, self.path), mode="r")
            # use_threads=False: pyarrow's reader threads calling back into a Python file abort the process
            # at exit ("terminate called without an active exception") after a second read; measured cost
            # ~0.29 s vs 0.17-0.26 s natively on an 89 MiB file.
            reader = pj.open_json(stream, read_options=pj.ReadOptions(block_size=1 << 22, use_threads=False),
                                  parse_options=pj.ParseOptions(explicit_schema=schema,
                                                                unexpected_field_behavior="ignore"))
        except (pa.ArrowException, OSError, AnalyzeError) as e:
            raise FastPathUnavailable(str(e)) from None
        offset, seen = 0, 0
        total = None if self.path.suffix == ".gz" else os.path.getsize(self.path)
        with bar(progress, total=total, desc=desc, unit="B", unit_scale=True) as pbar:
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                except (pa.ArrowException, OSError, AnalyzeError) as e:
                    raise FastPathUnavailable(str(e)) from None
                if total is not None:
                    position = min(stream.tell(), total)
                    pbar.update(position - seen)
                    seen = position
                if limit is not None and offset + batch.num_rows > limit:
                    batch = batch.slice(0, limit - offset)
                if batch.num_rows:
                    yield Chunk(offset, table=batch, exact=False)
                offset += batch.num_rows
                if limit is not None and offset >= limit:
                    break


# Python's json parser recurses once per level and stops at the interpreter's recursion limit (1000 by
# default): that is the nesting limit, reported as an error instead of a RecursionError traceback.
_TOO_DEEP = (f"JSON nested too deeply (more than about {sys.getrecursionlimit()} levels of arrays/objects, "
             "the parser's limit)")


def _json_type(value) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _json_rows(top, path: Path) -> list:
    """Records from a JSON document: ``[{...}, ...]``, ``{"data": [{...}, ...]}`` (one key) or columns
    ``{"field": [v0, v1, ...], ...}`` (equal-length arrays)."""
    if isinstance(top, list):
        return top
    if isinstance(top, dict):
        if len(top) == 1:
            (value,) = top.values()
            if isinstance(value, list) and all(isinstance(v, dict) for v in value[:1]):
                return value
        if top and all(isinstance(v, list) for v in top.values()):
            sizes = {k: len(v) for k, v in top.items()}
            if len(set(sizes.values())) != 1:
                raise AnalyzeError(f"a JSON object of columns needs equal-length arrays; got lengths {sizes}", path)
            keys = list(top)
            return [dict(zip(keys, values)) for values in zip(*top.values())]
    raise AnalyzeError("expected an array of objects, an object holding one such array, or an object "
                       f"of equal-length column arrays; got {_json_type(top)} at the top level", path)


# ---------------------------------------------------------------------------------------------
# files of lengths

_INT = re.compile(r"^[+-]?[0-9]+$")


def _parse_length_line(text: str, path: Path, number: int) -> int:
    if _INT.match(text):
        value = int(text)
        if value < 0:
            raise AnalyzeError(f"negative length {value}", path, f"line {number}")
        if value >= 2**63:
            raise AnalyzeError(f"length {value} does not fit in int64", path, f"line {number}")
        return value
    try:
        float(text)
        problem = f"non-integer length {text!r}"
    except ValueError:
        problem = f"expected one integer length per line, got {text[:60]!r}"
    raise AnalyzeError(problem, path, f"line {number}")


def _read_text_lengths_python(path: Path, limit: int | None, progress: bool | None, desc: str) -> np.ndarray:
    values = []
    total = None if path.suffix == ".gz" else os.path.getsize(path)
    with open_input(path) as f, bar(progress, total=total, desc=desc, unit="B", unit_scale=True) as pbar:
        for number, raw in read_lines(f, path):
            pbar.update(len(raw))
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise AnalyzeError("not valid UTF-8 text", path, f"line {number}") from None
            if not text or text.startswith("#"):
                continue
            values.append(_parse_length_line(text, path, number))
            if limit is not None and len(values) >= limit:
                break
    return np.asarray(values, dtype=np.int64)


def _read_csv(pa, pcsv, source):
    return pcsv.read_csv(
        source,
        read_options=pcsv.ReadOptions(column_names=["length"], block_size=1 << 24, use_threads=False),  # see above
        parse_options=pcsv.ParseOptions(delimiter="\x1f", quote_char=False, ignore_empty_lines=True),
        convert_options=pcsv.ConvertOptions(column_types={"length": pa.int64()}, strings_can_be_null=False,
                                            null_values=[]))


def _read_text_lengths_arrow(path: Path, limit: int | None) -> np.ndarray | None:
    """All lengths through pyarrow's CSV reader (multithreaded), or None if anything is unusual."""
    pa = optional("pyarrow")
    pcsv = optional("pyarrow.csv")
    if pa is None or pcsv is None:
        return None
    try:
        with open_input(path) as f:
            table = _read_csv(pa, pcsv, LineBoundedReader(f, path))
    except (pa.ArrowException, OSError, AnalyzeError):  # the Python reader reports the problem exactly
        return None
    column = table.column("length")
    if column.null_count:
        return None
    values = column.to_numpy()
    if limit is not None:
        values = values[:limit]
    if values.size and values.min() < 0:
        return None
    return np.ascontiguousarray(values, dtype=np.int64)


def read_lengths_file(path: Path, fmt: str, limit: int | None, progress: bool | None) -> np.ndarray:
    """A text file (one non-negative integer per line; blank lines and ``#`` comments skipped) or a
    1-D integer ``.npy`` array, as int64."""
    if fmt == "npy":
        try:
            with open_input(path) as f:  # not memory-mapped: see ColumnarSource._read_ipc
                array = np.load(f, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise AnalyzeError(f"not a readable .npy array: {e}", path) from None
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise AnalyzeError(f"a .npy file of lengths must be a 1-D integer array; got shape {array.shape}, "
                               f"dtype {array.dtype}", path)
        if limit is not None:
            array = array[:limit]
        array = np.asarray(array, dtype=np.int64)
        if array.size and array.min() < 0:
            i = int(np.argmax(array < 0))
            raise AnalyzeError(f"negative length {int(array[i])}", path, f"row {i}")
        return array
    fast = _read_text_lengths_arrow(path, limit)
    if fast is not None:
        return fast
    return _read_text_lengths_python(path, limit, progress, desc=f"reading {path.name}")


def open_source(path: str | Path, fmt: str = "auto", split: str | None = None):
    """(format, source): a :class:`ColumnarSource`, a :class:`RecordSource`, or the path for lengths files."""
    path = Path(path)
    fmt = detect_format(path, fmt)
    if split is not None and fmt != "hf":
        raise AnalyzeError(f"--split applies only to saved dataset folders, not to {fmt} input", path)
    if fmt in ("parquet", "arrow", "hf"):
        return fmt, ColumnarSource(path, fmt, split)
    if fmt in ("jsonl", "json"):
        return fmt, RecordSource(path, fmt)
    return fmt, path
