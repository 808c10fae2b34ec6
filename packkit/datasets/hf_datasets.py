"""``packkit.pack_dataset``: a whole dataset packed with one global plan, in TRL's pre-packed format.

A drop-in for ``trl.pack_dataset`` (issue 57): a ``datasets.Dataset`` / ``IterableDataset`` / ``DatasetDict`` /
``IterableDatasetDict`` in, the same type out (a ``ray.data.Dataset`` goes to :mod:`packkit.datasets.ray_data`).
Each output row is one packed row: every list column is packed row-wise, in the input's column order, and
``seq_lengths`` (the segment lengths of the row, typed as TRL types it) is added — exactly what TRL's
``pack_dataset`` writes and what ``DataCollatorForLanguageModeling(padding_free=True)`` reads to restart
``position_ids``. The input's format is restored. Only the row order differs from TRL's (docs/trl.md).

``datasets`` and ``pyarrow`` are imported inside the functions: ``import packkit`` needs neither.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Optional, Sequence

import numpy as np

from ..planning.planner import CostSpec, _as_count, as_extra_cost
from .global_plan import (PackReport, check_options, extra_cost_column, extra_cost_values, plan_rows,
                          report_from_plan)
from .streamed import pack_iterable, stream_buffer_size
from .trl_rows import pack_column_names, trl_row_order, wrapped_segments


STRATEGIES = {"bfd": "truncate", "bfd_split": "split", "wrapped": None}
# Dataset.map's keyword arguments, which trl.pack_dataset's map_kwargs passes on: the ones packkit reads
# (batch_size, keep_in_memory, cache_file_name) and the ones that change nothing here (packkit plans the whole
# dataset in one process, writes one file and never reads a cache back).
MAP_KWARGS_USED = ("batch_size", "keep_in_memory", "cache_file_name")
MAP_KWARGS_IGNORED = ("num_proc", "desc", "load_from_cache_file", "writer_batch_size", "disable_nullable",
                      "new_fingerprint", "suffix_template", "drop_last_batch", "features", "fn_kwargs",
                      "input_columns", "remove_columns", "with_indices", "with_rank", "batched", "try_original_type")


def pack_dataset(dataset, seq_length: int, strategy: Optional[str] = None, map_kwargs: Optional[dict] = None, *,
                 algorithm: Optional[str] = None, overlong: Optional[str] = None,
                 columns: Optional[Sequence[str]] = None, dp_size: int = 1, cost: CostSpec = "tokens",
                 shuffle: Optional[bool] = None, seed: Optional[int] = 0, position_ids: bool = False,
                 return_report: bool = False, keep_in_memory: Optional[bool] = None, cache_file_name=None,
                 extra_cost=None, buffer_size: Optional[int] = None, **options):
    """Pack a whole tokenized dataset into rows of ``seq_length`` tokens with one global plan.

    A drop-in for ``trl.pack_dataset(dataset, seq_length, strategy="bfd", map_kwargs=None)``: it takes what TRL
    takes (a ``Dataset``, ``IterableDataset``, ``DatasetDict`` or ``IterableDatasetDict``; every list column, of
    any name and value type) and returns what TRL returns (the same type, columns in the input's order plus
    ``seq_lengths``, value types kept, the input's format restored). Only the row order differs (and, with more
    than one map batch of rows, which documents share a row: packkit plans all of them at once). See docs/trl.md.

    Args:
        dataset: a ``datasets.Dataset`` / ``DatasetDict`` (each split packed alone), an ``IterableDataset`` /
            ``IterableDatasetDict`` (streamed: each buffer of ``buffer_size`` rows is planned alone, so memory is
            bounded by one buffer; an ``IterableDataset`` comes back), or a ``ray.data.Dataset`` (packed on the
            Ray cluster; see :func:`packkit.ray_data.pack_ray_dataset` for its ``options``).
        seq_length: tokens per packed row (> 0).
        strategy: TRL's: ``"bfd"`` (the default: over-long rows truncated to ``seq_length``), ``"bfd_split"``
            (split into consecutive pieces, each its own segment) or ``"wrapped"`` (every row's tokens one after
            another, cut every ``seq_length`` tokens within each map batch of ``map_kwargs["batch_size"]`` rows
            (1,000), as TRL does; no ``seq_lengths``). ``None``: ``"bfd"``, or the policy ``overlong`` names.
        map_kwargs: TRL's ``Dataset.map`` arguments. ``batch_size`` sets the ``"wrapped"`` batch and an
            ``IterableDataset``'s buffer; ``keep_in_memory`` / ``cache_file_name`` as below; the rest of
            ``Dataset.map``'s (``num_proc``, ``desc``, ...) change nothing here.
        algorithm: planner algorithm (default ``"obfd"``; ``"ogbfd"`` when ``dp_size > 1``).
        overlong: rows longer than ``seq_length``: ``"truncate"`` (keep the first ``seq_length`` tokens of every
            column; ``strategy="bfd"``), ``"split"`` (``"bfd_split"``), ``"drop"`` or ``"error"`` (raises before
            any output). Default: the strategy's. All are reported.
        columns: the columns to pack (default: all, as TRL). Each must be a list per row (any value type: ints,
            floats, bools, strings, nested lists) with the first column's lengths; a column that is not raises
            (a TypeError, as in TRL) — exclude it here. Columns left out are not in the output (listed in the
            report's ``excluded_columns``). ``input_ids`` need not exist; a negative id in it is warned about.
        dp_size, cost: rows are ordered so that consecutive groups of ``dp_size`` rows are steps balanced
            under ``cost`` (``"tokens"``, ``"attention"``, ``(a, b)`` or a callable; see ``packkit.plan``),
            for trainers that deal rows round-robin to ranks in order.
        shuffle, seed: the rows (whole steps with ``dp_size > 1``) in a ``seed``-ed random order (the default for
            ``"bfd"`` / ``"bfd_split"``; ``seed`` ``None`` is 0). ``shuffle=False`` (the default for
            ``"wrapped"``, whose rows are then exactly TRL's, in TRL's order): in the dataset order of each row's
            (step's) longest sequence, deterministic. Never the planner's order, which runs from the longest
            sequences to the shortest (a length curriculum).
        position_ids: also write ``position_ids`` (list<int64>, restarting at 0 in every segment). Without it an
            input ``position_ids`` list column is packed like any other (as TRL does).
        extra_cost: a per-row cost added to each row's ``cost`` in the data-parallel balance (``packkit.plan``'s):
            one finite value >= 0 per dataset row, in dataset order (an array, list or tensor), or the name of a
            numeric column holding it, e.g. the vision tower's FLOPs of each row's images
            (:func:`packkit.vision_cost`). The column is read, not packed. ``None``: the plan of ``cost`` alone.
        return_report: return ``(dataset, PackReport)`` instead of the dataset (a dict of reports by split for a
            ``DatasetDict``; not for a streamed dataset).
        keep_in_memory, cache_file_name: where the packed rows go, as in ``Dataset.map``. By default a
            dataset backed by Arrow files on disk (``load_from_disk``, ``load_dataset``) is packed into a new
            cache file beside them (``cache-packkit-<fingerprint>.arrow``; a temporary directory when
            ``datasets`` caching is disabled), written batch by batch and memory-mapped, so the packed copy
            never has to fit in RAM; an in-memory dataset is packed in memory. ``keep_in_memory=True`` keeps
            the output in memory; ``cache_file_name`` names the file (a dict by split for a ``DatasetDict``).
            The file is written afresh on every call (to a temporary name, then renamed): never read back.
        buffer_size: rows per buffer of a streamed dataset. ``"bfd"`` / ``"bfd_split"``: default
            ``map_kwargs["batch_size"]``, else 10,000. ``"wrapped"``: default the map batch (1,000; ``None``: the
            whole stream), or a multiple of it (else ValueError): cut where TRL cuts it, rows equal to TRL's.

    The report's summary (counts) is always in the output's ``info.description`` as JSON, after the
    prefix ``"packkit.pack_dataset: "``. Zero-length rows hold no tokens and are in no output row
    (counted in ``zero_length``). An empty dataset (0 rows, or only empty rows) gives 0 rows on every strategy,
    as ``trl.pack_dataset`` does for ``"wrapped"`` (TRL 1.16 raises for ``"bfd"`` / ``"bfd_split"`` there).
    """
    wrapped, overlong, batch_size = _resolve_strategy(strategy, overlong, map_kwargs)
    if map_kwargs:
        keep_in_memory, cache_file_name = _map_kwargs_paths(map_kwargs, keep_in_memory, cache_file_name)
    if shuffle is None:
        shuffle = not wrapped
    if type(dataset).__module__.startswith("ray.data"):
        from .ray_data import pack_ray_dataset

        if wrapped:
            raise ValueError('strategy="wrapped" is for a datasets dataset; a ray.data.Dataset packs with "bfd" or '
                             '"bfd_split"')
        if keep_in_memory is not None or cache_file_name is not None:
            raise TypeError("keep_in_memory and cache_file_name are for a datasets.Dataset; a ray.data.Dataset is "
                            "packed into Ray blocks (write them out with the Ray Dataset's write_* methods)")
        shuffle, seed, position_ids = check_options(algorithm, overlong or "error", cost, shuffle, seed, position_ids)
        return pack_ray_dataset(dataset, seq_length, algorithm=algorithm, overlong=overlong or "error",
                                columns=columns, dp_size=dp_size, cost=cost, shuffle=shuffle, seed=seed,
                                position_ids=position_ids, return_report=return_report, extra_cost=extra_cost,
                                **options)
    shuffle, seed, position_ids = check_options(algorithm, overlong or "error", cost, shuffle, seed, position_ids)
    if not isinstance(return_report, (bool, np.bool_)):  # 0 / "no" picked the return type silently
        raise TypeError(f"return_report must be True or False, got {return_report!r}")
    if options:
        raise TypeError(f"unexpected options {sorted(options)} for a datasets.Dataset")
    try:
        import datasets
    except ImportError:
        raise ImportError("pack_dataset needs the datasets library: pip install datasets") from None
    seq_length = _as_count(seq_length, "seq_length")
    dp_size = _as_count(dp_size, "dp_size")
    if wrapped and (algorithm is not None or dp_size != 1 or extra_cost is not None or position_ids):
        raise ValueError('strategy="wrapped" cuts the token stream every seq_length tokens: it takes no algorithm, '
                         'dp_size, extra_cost or position_ids')
    if keep_in_memory is not None and not isinstance(keep_in_memory, bool):
        raise TypeError(f"keep_in_memory must be None, True or False, got {keep_in_memory!r}")
    buffer_size = stream_buffer_size(buffer_size, batch_size, wrapped=wrapped,
                                     bfd_batch=(map_kwargs or {}).get("batch_size"))
    kwargs = dict(seq_length=seq_length, wrapped=wrapped, batch_size=batch_size, algorithm=algorithm,
                  overlong=overlong, columns=columns, dp_size=dp_size, cost=cost, shuffle=shuffle, seed=seed,
                  position_ids=position_ids, extra_cost=extra_cost)
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if cache_file_name is not None and not isinstance(cache_file_name, dict):
            raise TypeError("cache_file_name for a DatasetDict is a dict of paths by split")
        streamed = isinstance(dataset, datasets.IterableDatasetDict)
        if streamed and return_report:
            raise TypeError("return_report is not available for a streamed dataset (it is packed as it is read)")
        out, reports = {}, {}
        for split, part in dataset.items():
            if streamed:
                out[split] = pack_iterable(part, buffer_size=buffer_size, **kwargs)
            else:
                out[split], reports[split] = _pack_one(datasets, part, keep_in_memory=keep_in_memory,
                                                       cache_file_name=(cache_file_name or {}).get(split), **kwargs)
        result = type(dataset)(out)
        return (result, reports) if return_report else result
    if isinstance(dataset, datasets.IterableDataset):
        if return_report:
            raise TypeError("return_report is not available for a streamed dataset (it is packed as it is read)")
        if keep_in_memory is not None or cache_file_name is not None:
            raise TypeError("keep_in_memory and cache_file_name are for a datasets.Dataset; a streamed dataset is "
                            "packed as it is read")
        return pack_iterable(dataset, buffer_size=buffer_size, **kwargs)
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"pack_dataset takes a datasets.Dataset, IterableDataset, DatasetDict or a ray.data.Dataset, "
                        f"got {type(dataset).__name__}")
    result, report = _pack_one(datasets, dataset, keep_in_memory=keep_in_memory, cache_file_name=cache_file_name,
                               **kwargs)
    return (result, report) if return_report else result


def _resolve_strategy(strategy, overlong, map_kwargs):
    """(wrapped, overlong policy or None for wrapped, the map batch size) from TRL's and packkit's options."""
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"Invalid packing strategy '{strategy}', must be one of {tuple(STRATEGIES)}.")
    if map_kwargs is not None and not isinstance(map_kwargs, dict):
        raise TypeError(f"map_kwargs must be a dict of Dataset.map arguments, got {type(map_kwargs).__name__}")
    unknown = sorted(set(map_kwargs or {}) - set(MAP_KWARGS_USED) - set(MAP_KWARGS_IGNORED))
    if unknown:
        raise TypeError(f"map_kwargs has arguments Dataset.map does not take: {unknown}")
    batch_size = (map_kwargs or {}).get("batch_size", 1000)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))):
        raise TypeError(f"map_kwargs['batch_size'] must be an int or None, got {batch_size!r}")
    if batch_size is not None and batch_size <= 0:
        batch_size = None  # Dataset.map: the whole dataset is one batch
    if strategy == "wrapped":
        if overlong is not None:
            raise ValueError('strategy="wrapped" cuts rows anywhere: it takes no overlong policy')
        return True, None, batch_size
    implied = STRATEGIES[strategy or "bfd"]
    if overlong is None:
        overlong = implied
    elif strategy is not None and overlong != implied:
        raise ValueError(f"strategy={strategy!r} means overlong={implied!r}, not {overlong!r}; pass one of them")
    return False, overlong, batch_size


def _map_kwargs_paths(map_kwargs, keep_in_memory, cache_file_name):
    if "keep_in_memory" in map_kwargs:
        if keep_in_memory is not None and keep_in_memory != map_kwargs["keep_in_memory"]:
            raise ValueError("keep_in_memory is given twice (argument and map_kwargs) with different values")
        keep_in_memory = map_kwargs["keep_in_memory"]
    if map_kwargs.get("cache_file_name") is not None:
        if cache_file_name is not None and cache_file_name != map_kwargs["cache_file_name"]:
            raise ValueError("cache_file_name is given twice (argument and map_kwargs) with different values")
        cache_file_name = map_kwargs["cache_file_name"]
    return keep_in_memory, cache_file_name


def _restored_format(fmt: dict, present: Sequence[str], added: Sequence[str]) -> dict:
    """``with_format`` arguments restoring the input's format on the output, as ``trl.pack_dataset`` does (its
    columns plus the ones packing adds), less any column that is not in the output."""
    fmt = dict(fmt)
    kwargs = fmt.pop("format_kwargs", None) or {}
    if fmt.get("columns") is not None:
        fmt["columns"] = [c for c in fmt["columns"] if c in present] + [c for c in added if c not in fmt["columns"]]
    fmt.update(kwargs)
    return fmt


def _pack_one(datasets, dataset, *, seq_length, wrapped, batch_size, algorithm, overlong, columns, dp_size, cost,
              shuffle, seed, position_ids, extra_cost, keep_in_memory, cache_file_name):
    """One ``datasets.Dataset``: (packed dataset in the input's format, PackReport)."""
    from .arrow_packing import check_row_lengths, iter_packed_batches, pack_table, packed_schema, token_column

    if cache_file_name is not None and not isinstance(cache_file_name, (str, os.PathLike)):
        raise TypeError(f"cache_file_name must be a path, got {type(cache_file_name).__name__}")
    if keep_in_memory and cache_file_name is not None:
        raise ValueError("pass keep_in_memory=True or a cache_file_name, not both")
    cost_column = extra_cost_column(extra_cost, dataset.column_names)
    if cost_column is not None:
        extra_cost = extra_cost_values(dataset.select_columns([cost_column]).with_format("arrow")[:].column(0),
                                       cost_column)
    chosen = pack_column_names([c for c in dataset.column_names if c != cost_column], columns, wrapped=wrapped,
                               position_ids=position_ids)
    excluded = [c for c in dataset.column_names if c not in chosen]
    source = dataset if not excluded else dataset.select_columns(chosen)
    table = source.with_format("arrow")[:]  # a zero-copy slice unless rows were selected
    cols = [token_column(name, table.column(name), generic=True) for name in chosen]
    lead = chosen.index("input_ids") if "input_ids" in chosen else 0
    lengths = check_row_lengths(cols, lead=lead, negative="warn")
    extra = as_extra_cost(extra_cost, len(lengths))

    if wrapped:
        segments, report = wrapped_segments(lengths, seq_length, batch_size, shuffle=shuffle, seed=seed)
        report.columns, report.excluded_columns = list(chosen), excluded
    else:
        p, segments, empty_removed = plan_rows(lengths, seq_length, algorithm=algorithm, overlong=overlong,
                                               dp_size=dp_size, cost=cost, shuffle=shuffle, seed=seed,
                                               extra_cost=extra)
        report = report_from_plan(p, lengths=lengths, seq_length=seq_length, columns=chosen, excluded=excluded,
                                  empty_removed=empty_removed, rows=len(segments.bin_offsets) - 1)
        segments = trl_row_order(segments)
        del p  # the plan's arrays beyond `segments` are not needed while packing
    pack_args = dict(position_ids=position_ids, seq_lengths=not wrapped)
    schema = packed_schema(cols, **pack_args)
    info = datasets.DatasetInfo(description="packkit.pack_dataset: " + json.dumps(report.summary()),
                                features=datasets.Features.from_arrow_schema(schema))
    # An explicit fingerprint: otherwise datasets hashes every token of the new table (seconds per GB).
    params = [dataset._fingerprint, seq_length, "wrapped" if wrapped else "bfd", batch_size if wrapped else None,
              algorithm, overlong, chosen, dp_size, cost if isinstance(cost, (str, tuple, list)) else repr(cost),
              shuffle, seed, position_ids,
              None if extra is None else hashlib.blake2b(extra.tobytes(), digest_size=16).hexdigest()]
    fingerprint = datasets.fingerprint.Hasher.hash(["packkit.pack_dataset", *params])
    if cache_file_name is None and not keep_in_memory and dataset.cache_files:
        cache_file_name = _cache_file_path(datasets, dataset, fingerprint)
    if cache_file_name is None:
        out = pack_table(cols, segments, **pack_args)
    else:
        out = write_arrow_file(os.fspath(cache_file_name), schema,
                               iter_packed_batches(cols, segments, max_chunk_tokens=DISK_CHUNK_TOKENS, **pack_args))
    result = datasets.Dataset(out, info=info, fingerprint=fingerprint)
    added = [n for n in schema.names if n not in chosen]
    return result.with_format(**_restored_format(dataset.format, schema.names, added)), report


# Tokens per record batch written to a cache file: the output held in memory at once (16 MiB of int32 ids).
DISK_CHUNK_TOKENS = 1 << 22


def _cache_file_path(datasets, dataset, fingerprint: str) -> str:
    """Where ``Dataset.map`` would put this result: beside the input's files, or a temporary directory."""
    if datasets.is_caching_enabled():
        return os.path.join(os.path.dirname(dataset.cache_files[0]["filename"]), f"cache-packkit-{fingerprint}.arrow")
    return os.path.join(datasets.fingerprint.get_temporary_cache_files_directory(),
                        f"cache-packkit-{datasets.fingerprint.generate_random_fingerprint()}.arrow")


def write_arrow_file(path: str, schema, batches):
    """Writes ``batches`` as an Arrow IPC stream (the format of ``datasets`` cache files) to ``path``,
    one batch at a time, and returns the file memory-mapped as a ``datasets`` table. The stream goes to
    a temporary name first, so ``path`` never holds a partial file."""
    import pyarrow as pa
    from datasets.table import MemoryMappedTable

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f, pa.ipc.new_stream(f, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
                del batch
                pa.default_memory_pool().release_unused()  # else the pool keeps every freed batch's pages
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return MemoryMappedTable.from_file(path)


def read_report(dataset) -> dict:
    """The summary :func:`pack_dataset` wrote into ``dataset.info.description``."""
    text = dataset.info.description or ""
    prefix = "packkit.pack_dataset: "
    if not text.startswith(prefix):
        raise ValueError("this dataset was not written by packkit.pack_dataset (no report in info.description)")
    return json.loads(text[len(prefix):])


class PackedRowsCollator:
    """Rows of a pre-packed dataset into a per-sequence collator (e.g. :class:`packkit.PackingCollator`).

    Each row is cut at its ``seq_lengths`` into its segments (every per-token key alike) before
    ``collator`` sees them, so documents stay separate: positions restart and no document attends to
    another. With ``PackingCollator()`` (flat layout) the batch is the rows one after another.
    Use with ``TrainingArguments(remove_unused_columns=False)`` so the Trainer keeps ``seq_lengths``.
    """

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features):
        segments = []
        for i, feature in enumerate(features):
            if "seq_lengths" not in feature:
                raise ValueError(f"feature {i} has no 'seq_lengths' (keys: {sorted(feature)}); PackedRowsCollator "
                                 f"takes rows of packkit.pack_dataset / trl.pack_dataset (set "
                                 f"remove_unused_columns=False so the Trainer keeps the column)")
            lengths = np.asarray(feature["seq_lengths"], np.int64).reshape(-1)
            keys = [k for k in feature if k not in ("seq_lengths", "position_ids")]
            cuts = np.cumsum(lengths)
            for k in keys:
                if len(feature[k]) != int(cuts[-1] if len(cuts) else 0):
                    raise ValueError(f"feature {i}: {k!r} has {len(feature[k])} values but its seq_lengths sum to "
                                     f"{int(cuts[-1]) if len(cuts) else 0}")
            parts = {k: np.split(np.asarray(feature[k]), cuts[:-1]) for k in keys}
            segments.extend({k: parts[k][j] for k in keys} for j in range(len(lengths)))
        return self.collator(segments)
