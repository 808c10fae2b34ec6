"""``packkit.pack_dataset``: a whole dataset packed with one global plan, in TRL's pre-packed format.

``datasets.Dataset`` in, ``datasets.Dataset`` out (a ``ray.data.Dataset`` goes to :mod:`packkit.datasets.ray_data`).
Each output row is one packed row: every per-token list column is packed row-wise and ``seq_lengths``
(list<int32>, the segment lengths of the row) is added — exactly what TRL's ``pack_dataset`` writes and
what ``DataCollatorForLanguageModeling(padding_free=True)`` reads to restart ``position_ids``.

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


def pack_dataset(dataset, seq_length: int, *, algorithm: Optional[str] = None, overlong: str = "error",
                 columns: Optional[Sequence[str]] = None, dp_size: int = 1, cost: CostSpec = "tokens",
                 shuffle: bool = True, seed: Optional[int] = 0, position_ids: bool = False,
                 return_report: bool = False, keep_in_memory: Optional[bool] = None, cache_file_name: Optional[str] = None,
                 extra_cost=None, **options):
    """Pack a whole tokenized dataset into rows of ``seq_length`` tokens with one global plan.

    Args:
        dataset: a ``datasets.Dataset`` (or a ``ray.data.Dataset``, packed on the Ray cluster; see
            :func:`packkit.ray_data.pack_ray_dataset` for its ``options``).
        seq_length: tokens per packed row (> 0).
        algorithm: planner algorithm (default ``"obfd"``; ``"ogbfd"`` when ``dp_size > 1``).
        overlong: rows longer than ``seq_length``: ``"error"`` (default, raises before any output),
            ``"drop"``, ``"truncate"`` (keep the first ``seq_length`` tokens of every column) or
            ``"split"`` (consecutive pieces, each its own segment). All are reported.
        columns: the columns to pack (default: all). Each must be a list of integers (or booleans) per
            row with input_ids' lengths; a column that is not raises — exclude it here. Columns left
            out are not in the output (listed in the report's ``excluded_columns``).
        dp_size, cost: rows are ordered so that consecutive groups of ``dp_size`` rows are steps balanced
            under ``cost`` (``"tokens"``, ``"attention"``, ``(a, b)`` or a callable; see ``packkit.plan``),
            for trainers that deal rows round-robin to ranks in order.
        shuffle, seed: the rows (whole steps with ``dp_size > 1``) in a ``seed``-ed random order (default; ``seed``
            ``None`` is 0). ``shuffle=False``: in the dataset order of each row's (step's) longest sequence. Never
            the planner's order, which runs from the longest sequences to the shortest (a length curriculum).
        position_ids: also write ``position_ids`` (list<int64>, restarting at 0 in every segment).
        extra_cost: a per-row cost added to each row's ``cost`` in the data-parallel balance (``packkit.plan``'s):
            one finite value >= 0 per dataset row, in dataset order (an array, list or tensor), or the name of a
            numeric column holding it, e.g. the vision tower's FLOPs of each row's images
            (:func:`packkit.vision_cost`). The column is read, not packed. ``None``: the plan of ``cost`` alone.
        return_report: return ``(dataset, PackReport)`` instead of the dataset.
        keep_in_memory, cache_file_name: where the packed rows go, as in ``Dataset.map``. By default a
            dataset backed by Arrow files on disk (``load_from_disk``, ``load_dataset``) is packed into a new
            cache file beside them (``cache-packkit-<fingerprint>.arrow``; a temporary directory when
            ``datasets`` caching is disabled), written batch by batch and memory-mapped, so the packed copy
            never has to fit in RAM; an in-memory dataset is packed in memory. ``keep_in_memory=True`` keeps
            the output in memory; ``cache_file_name`` names the file. The file is written afresh on every
            call (to a temporary name, then renamed): it is never read back as a cache.

    The report's summary (counts) is always in the output's ``info.description`` as JSON, after the
    prefix ``"packkit.pack_dataset: "``. Zero-length rows hold no tokens and are in no output row
    (counted in ``zero_length``).
    """
    shuffle, seed, position_ids = check_options(algorithm, overlong, cost, shuffle, seed, position_ids)
    if not isinstance(return_report, (bool, np.bool_)):  # 0 / "no" picked the return type silently
        raise TypeError(f"return_report must be True or False, got {return_report!r}")
    if type(dataset).__module__.startswith("ray.data"):
        from .ray_data import pack_ray_dataset

        if keep_in_memory is not None or cache_file_name is not None:
            raise TypeError("keep_in_memory and cache_file_name are for a datasets.Dataset; a ray.data.Dataset is "
                            "packed into Ray blocks (write them out with the Ray Dataset's write_* methods)")

        return pack_ray_dataset(dataset, seq_length, algorithm=algorithm, overlong=overlong, columns=columns,
                                dp_size=dp_size, cost=cost, shuffle=shuffle, seed=seed, position_ids=position_ids,
                                return_report=return_report, extra_cost=extra_cost, **options)
    if options:
        raise TypeError(f"unexpected options {sorted(options)} for a datasets.Dataset")
    try:
        import datasets
    except ImportError:
        raise ImportError("pack_dataset needs the datasets library: pip install datasets") from None
    from .arrow_packing import (check_row_lengths, iter_packed_batches, pack_table, packed_schema, select_columns,
                                token_column)

    if isinstance(dataset, datasets.DatasetDict):
        raise TypeError("pack_dataset takes one datasets.Dataset; pack each split of a DatasetDict separately")
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"pack_dataset takes a datasets.Dataset or a ray.data.Dataset, got {type(dataset).__name__}"
                        + ("; for streaming datasets use packkit.PackedIterableDataset"
                           if isinstance(dataset, datasets.IterableDataset) else ""))
    seq_length = _as_count(seq_length, "seq_length")
    dp_size = _as_count(dp_size, "dp_size")
    if keep_in_memory is not None and not isinstance(keep_in_memory, bool):
        raise TypeError(f"keep_in_memory must be None, True or False, got {keep_in_memory!r}")
    if cache_file_name is not None and not isinstance(cache_file_name, (str, os.PathLike)):
        raise TypeError(f"cache_file_name must be a path, got {type(cache_file_name).__name__}")
    if keep_in_memory and cache_file_name is not None:
        raise ValueError("pass keep_in_memory=True or a cache_file_name, not both")
    if len(dataset) == 0:
        raise ValueError("the dataset is empty: there is nothing to pack")
    cost_column = extra_cost_column(extra_cost, dataset.column_names)
    if cost_column is not None:
        extra_cost = extra_cost_values(dataset.select_columns([cost_column]).with_format("arrow")[:].column(0),
                                       cost_column)
    chosen = select_columns([c for c in dataset.column_names if c != cost_column], columns)
    excluded = [c for c in dataset.column_names if c not in chosen]
    table = dataset.select_columns(chosen).with_format("arrow")[:]  # a zero-copy slice unless rows were selected
    cols = [token_column(name, table.column(name)) for name in chosen]
    lengths = check_row_lengths(cols)
    extra = as_extra_cost(extra_cost, len(lengths))

    p, segments, empty_removed = plan_rows(lengths, seq_length, algorithm=algorithm, overlong=overlong,
                                           dp_size=dp_size, cost=cost, shuffle=shuffle, seed=seed, extra_cost=extra)
    schema = packed_schema(cols, position_ids=position_ids)
    report = report_from_plan(p, lengths=lengths, seq_length=seq_length, columns=chosen, excluded=excluded,
                              empty_removed=empty_removed, rows=len(segments.bin_offsets) - 1)
    del p  # the plan's arrays beyond `segments` are not needed while packing
    info = datasets.DatasetInfo(description="packkit.pack_dataset: " + json.dumps(report.summary()),
                                features=datasets.Features.from_arrow_schema(schema))
    # An explicit fingerprint: otherwise datasets hashes every token of the new table (seconds per GB).
    params = [dataset._fingerprint, seq_length, algorithm, overlong, chosen, dp_size,
              cost if isinstance(cost, (str, tuple, list)) else repr(cost), shuffle, seed, position_ids,
              None if extra is None else hashlib.blake2b(extra.tobytes(), digest_size=16).hexdigest()]
    fingerprint = datasets.fingerprint.Hasher.hash(["packkit.pack_dataset", *params])
    if cache_file_name is None and not keep_in_memory and dataset.cache_files:
        cache_file_name = _cache_file_path(datasets, dataset, fingerprint)
    if cache_file_name is None:
        out = pack_table(cols, segments, position_ids=position_ids)
    else:
        out = write_arrow_file(os.fspath(cache_file_name), schema,
                               iter_packed_batches(cols, segments, position_ids=position_ids,
                                                   max_chunk_tokens=DISK_CHUNK_TOKENS))
    result = datasets.Dataset(out, info=info, fingerprint=fingerprint)
    if dataset.format["type"] is not None:
        result = result.with_format(dataset.format["type"])
    return (result, report) if return_report else result


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
