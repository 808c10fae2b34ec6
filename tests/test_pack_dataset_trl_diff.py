"""Differential test: packkit.pack_dataset against the installed trl.pack_dataset (issue 57) on seeded random
datasets in every form both take. Equal: the type returned, the columns and their order, the features (value
types, seq_lengths' type), the format, and the documents as multisets of token sequences (truncated under "bfd",
split under "bfd_split"); under "wrapped" the rows themselves. Row order (and, beyond TRL's 1,000-row map batch,
which documents share a row) is the one allowed difference."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import packkit
from pack_trl_checks import make_dataset, random_columns, row_multiset, segments, table_rows

pytestmark = pytest.mark.full

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
trl = pytest.importorskip("trl")


def both(ds, seq_length, strategy, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return packkit.pack_dataset(ds, seq_length, strategy, **kw), trl.pack_dataset(ds, seq_length, strategy, **kw)


def compare(ours, theirs, strategy):
    assert type(ours) is type(theirs)
    if isinstance(theirs, datasets.Dataset):
        assert ours.column_names == theirs.column_names
        assert ours.features == theirs.features
        assert ours.format == theirs.format
        assert len(ours) <= len(theirs) or strategy == "wrapped"  # one global plan: never more rows
    else:
        assert ours._formatting == theirs._formatting and ours.features == theirs.features
    a, b = table_rows(ours), table_rows(theirs)
    if strategy == "wrapped":
        assert row_multiset(a) == row_multiset(b)
    else:
        assert segments(a) == segments(b)
    if a and b:
        assert list(a[0]) == list(b[0])


def forms(ds, tmp_path):
    yield "plain", ds
    yield "shuffled", ds.shuffle(seed=2)
    yield "selected", ds.select(np.random.default_rng(0).permutation(len(ds))[: max(1, len(ds) // 2)])
    yield "sharded", ds.shard(num_shards=2, index=0)
    ds.save_to_disk(str(tmp_path), max_shard_size="50KB")
    yield "from_disk", datasets.load_from_disk(str(tmp_path))
    yield "numpy_float32", ds.with_format("numpy", dtype="float32")
    yield "torch_columns", ds.with_format("torch", columns=[ds.column_names[0]], output_all_columns=True)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("strategy", ["bfd", "bfd_split", "wrapped"])
def test_datasets_match_trl(tmp_path, seed, strategy):
    rng = np.random.default_rng(seed)
    kinds = [k for k in ("int", "float", "bool", "nested", "string") if rng.random() < 0.6]
    n = int(rng.choice([1, 7, 300, 2500]))  # 2,500 rows: three of TRL's map batches
    columns, types = random_columns(rng, n, kinds=kinds, max_len=int(rng.integers(1, 80)))
    base = make_dataset(columns, types, large=bool(rng.random() < 0.3))
    seq_length = int(rng.integers(1, 100))
    for name, ds in forms(base, tmp_path / "saved"):
        if len(ds) == 0 or (strategy == "bfd" and not any(len(r) for r in columns["input_ids"])):
            continue
        ours, theirs = both(ds, seq_length, strategy)
        compare(ours, theirs, strategy)


@pytest.mark.parametrize("strategy", ["bfd", "bfd_split", "wrapped"])
def test_iterable_and_dicts_match_trl(strategy):
    rng = np.random.default_rng(42)
    columns, types = random_columns(rng, 1500, kinds=("int", "float"))
    ds = make_dataset(columns, types)
    stream = ds.to_iterable_dataset(num_shards=3).with_format("numpy")
    map_kwargs = {"batch_size": 500}
    ours, theirs = both(stream, 50, strategy, map_kwargs=map_kwargs)  # TRL's batch = packkit's buffer here
    compare(ours, theirs, strategy)
    dd = datasets.DatasetDict({"train": ds, "test": ds.select(range(100))})
    ours, theirs = both(dd, 50, strategy)
    assert list(ours) == list(theirs)
    for split in dd:
        compare(ours[split], theirs[split], strategy)
    idd = datasets.IterableDatasetDict({"train": ds.to_iterable_dataset(), "test": ds.select(range(50)).to_iterable_dataset()})
    ours, theirs = both(idd, 50, strategy, map_kwargs=map_kwargs)
    for split in idd:
        compare(ours[split], theirs[split], strategy)


def test_rows_equal_trl_exactly_when_one_batch_and_shuffle_false_wrapped():
    rng = np.random.default_rng(3)
    columns, types = random_columns(rng, 900, kinds=("float",))
    ds = make_dataset(columns, types)
    ours, theirs = both(ds, 33, "wrapped")
    assert ours.to_dict() == theirs.to_dict()  # "wrapped": TRL's rows in TRL's order


def test_trl_example_and_format():
    trl = pytest.importorskip("trl")
    examples = {"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]],
                "attention_mask": [[1, 1, 1, 0, 0], [1, 0], [1, 1, 0], [1]]}
    ds = datasets.Dataset.from_dict(examples)
    ours = packkit.pack_dataset(ds, 4, overlong="truncate", shuffle=False)
    theirs = trl.pack_dataset(ds, 4, strategy="bfd")
    assert ours.features == theirs.features  # same columns and types: list<int64> ..., seq_lengths list<int32>
    # TRL's rows, in the order of each row's longest example (0, 1, 2), not TRL's longest-first order (issue 47).
    assert ours[:] == {"input_ids": [[1, 2, 3, 4], [6, 7], [8, 9, 10, 11]],
                       "attention_mask": [[1, 1, 1, 0], [1, 0], [1, 1, 0, 1]], "seq_lengths": [[4], [2], [3, 1]]}
    assert sorted(ours["input_ids"]) == sorted(theirs["input_ids"])
    split = packkit.pack_dataset(ds, 4, overlong="split", position_ids=True, shuffle=False)
    # inside a row the segments are in TRL's order: longest first, then source order (issue 57)
    assert split["seq_lengths"] == [[4], [2, 1], [3, 1]]
    assert split["position_ids"] == [[0, 1, 2, 3], [0, 1, 0], [0, 1, 2, 0]]
    assert split.features["position_ids"] == datasets.List(datasets.Value("int64"))
