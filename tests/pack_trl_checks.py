"""Shared by the trl.pack_dataset drop-in tests (issue 57): random datasets in every form ``pack_dataset`` takes,
and their packed output read back as multisets (row order is the one thing allowed to differ from TRL)."""
from __future__ import annotations

import collections

import numpy as np

INT_TYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOAT_TYPES = ["float16", "float32", "float64"]


def freeze(value):
    """A hashable copy of one cell (lists of lists, strings, numbers, numpy arrays alike)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, (np.generic,)):
        return value.item()
    return value


def table_rows(dataset) -> list[dict]:
    """The rows of a packed Dataset / IterableDataset as plain Python dicts, whatever its format."""
    import datasets

    if isinstance(dataset, datasets.IterableDataset):
        return [dict(r) for r in dataset.with_format(None)]
    return dataset.with_format(None).to_list()


def segments(rows: list[dict], *, names=None) -> collections.Counter:
    """Multiset of segments: each row cut at its seq_lengths, a segment is a tuple of every column's piece."""
    out = collections.Counter()
    for row in rows:
        cols = [k for k in (names or row) if k != "seq_lengths"]
        cut = np.concatenate(([0], np.cumsum(row["seq_lengths"]))).astype(int)
        assert int(cut[-1]) == len(row[cols[0]]), "seq_lengths must sum to the row's length"
        for a, b in zip(cut[:-1], cut[1:]):
            assert b > a, "no empty segment"
            out[tuple(freeze(row[c][a:b]) for c in cols)] += 1
    return out


def row_multiset(rows: list[dict]) -> collections.Counter:
    return collections.Counter(tuple((k, freeze(v)) for k, v in sorted(r.items())) for r in rows)


def expected_segments(columns: dict, seq_length: int, strategy: str) -> collections.Counter:
    """What TRL's documentation promises: "bfd" keeps each non-empty row's first seq_length tokens, "bfd_split"
    cuts it into consecutive pieces of seq_length tokens (the last one shorter)."""
    names = list(columns)
    out = collections.Counter()
    for i in range(len(columns[names[0]])):
        row = [list(columns[c][i]) if columns[c][i] is not None else [] for c in names]
        n = len(row[0])
        if n == 0:
            continue
        cuts = [0, min(n, seq_length)] if strategy == "bfd" else list(range(0, n, seq_length)) + [n]
        for a, b in zip(cuts[:-1], cuts[1:]):
            out[tuple(freeze(col[a:b]) for col in row)] += 1
    return out


def random_columns(rng, n: int, *, max_len: int = 40, kinds=("int", "float", "bool", "nested", "string"),
                   empty_rate: float = 0.1):
    """Random per-token columns of ``n`` rows: input_ids plus one column of each kind, random value types.
    Returns (columns as Python lists, pyarrow types by column)."""
    import pyarrow as pa

    lengths = rng.integers(1, max_len + 1, n)
    lengths[rng.random(n) < empty_rate] = 0
    id_type = str(rng.choice(["int32", "int64", "uint16", "uint32"]))
    cols = {"input_ids": [rng.integers(0, 30000, k).astype(id_type).tolist() for k in lengths]}
    types = {"input_ids": getattr(pa, id_type)()}
    if "int" in kinds:
        t = str(rng.choice(INT_TYPES))
        info = np.iinfo(t)
        cols["labels"] = [rng.integers(max(info.min, -1000), min(info.max, 1000), k).astype(t).tolist()
                          for k in lengths]
        types["labels"] = getattr(pa, t)()
    if "float" in kinds:
        t = str(rng.choice(FLOAT_TYPES))
        cols["weights"] = [rng.standard_normal(k).astype(t).tolist() for k in lengths]
        types["weights"] = {"float16": pa.float16(), "float32": pa.float32(), "float64": pa.float64()}[t]
    if "bool" in kinds:
        cols["mask"] = [(rng.random(k) < 0.5).tolist() for k in lengths]
        types["mask"] = pa.bool_()
    if "nested" in kinds:
        cols["boxes"] = [[rng.integers(0, 9, rng.integers(0, 3)).tolist() for _ in range(k)] for k in lengths]
        types["boxes"] = pa.list_(pa.int64())
    if "string" in kinds:
        cols["pieces"] = [[f"w{int(x)}" for x in rng.integers(0, 99, k)] for k in lengths]
        types["pieces"] = pa.string()
    order = list(cols)
    rng.shuffle(order)  # input_ids need not come first: the output keeps the input's order
    return {c: cols[c] for c in order}, {c: types[c] for c in order}


def make_dataset(columns: dict, types: dict, *, large: bool = False):
    import datasets
    import pyarrow as pa

    lst = pa.large_list if large else pa.list_
    table = pa.table({c: pa.array(v, type=lst(types[c])) for c, v in columns.items()})
    return datasets.Dataset(table)
