"""packkit.pack_dataset takes what trl.pack_dataset takes and returns what it returns (issue 57), checked
against TRL's documented behaviours without importing trl: its own test cases as our tests (rows compared as
multisets: row order is the one documented difference), every form of dataset, every list column whatever its
name and value type, the input's format and column order restored, every token kept exactly once.
The differential test against the installed trl is tests/test_pack_dataset_trl_diff.py (tier full)."""
from __future__ import annotations

import collections

import numpy as np
import pytest

import packkit
from pack_trl_checks import (expected_segments, freeze, make_dataset, random_columns, row_multiset, segments,
                             table_rows)

pytestmark = pytest.mark.core

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")


def same_rows(got: dict, expected: dict) -> bool:
    """Two column dicts hold the same rows, in any order (values compared as numbers)."""
    if list(got) != list(expected):
        return False
    as_rows = lambda d: collections.Counter(  # noqa: E731
        tuple(freeze(np.asarray(d[k][i], dtype=np.float64)) for k in d) for i in range(len(d[next(iter(d))])))
    return as_rows(got) == as_rows(expected)


# ---- TRL's own cases (trl tests/test_data_utils.py, TestPackDatasetWrapped / TestPackDatasetBfd), rewritten ----

EXAMPLES = {"input_ids": [[1, 2, 3], [4, 5, 6, 7], [8]], "attention_mask": [[0, 1, 1], [0, 0, 1, 1], [1]]}


def test_wrapped_dataset_exact_rows_and_format():
    ds = datasets.Dataset.from_dict(EXAMPLES).with_format("numpy", dtype="float32")
    fmt = ds.format
    out = packkit.pack_dataset(ds, 3, strategy="wrapped")
    # "wrapped" keeps TRL's rows and TRL's order (shuffle defaults to False for it)
    assert out.to_dict() == {"input_ids": [[1, 2, 3], [4, 5, 6], [7, 8]],
                             "attention_mask": [[0, 1, 1], [0, 0, 1], [1, 1]]}
    assert out.format == fmt
    assert out[0]["input_ids"].dtype == np.float32


def test_wrapped_iterable_dataset():
    ds = datasets.Dataset.from_dict(EXAMPLES).to_iterable_dataset().with_format("numpy")
    formatting = ds._formatting
    out = packkit.pack_dataset(ds, 3, strategy="wrapped")
    assert isinstance(out, datasets.IterableDataset)
    assert next(iter(out.with_format(None).batch(batch_size=3))) == {
        "input_ids": [[1, 2, 3], [4, 5, 6], [7, 8]], "attention_mask": [[0, 1, 1], [0, 0, 1], [1, 1]]}
    assert out._formatting == formatting


def test_bfd_dataset_and_format_columns():
    ds = datasets.Dataset.from_dict({"input_ids": EXAMPLES["input_ids"]}).with_format("numpy", dtype="float32")
    fmt = ds.format
    out = packkit.pack_dataset(ds, 4, strategy="bfd")
    assert same_rows(out.to_dict(), {"input_ids": [[4, 5, 6, 7], [1, 2, 3, 8]], "seq_lengths": [[4], [3, 1]]})
    got = out.format
    assert got["columns"] == ["input_ids", "seq_lengths"]
    got["columns"] = ["input_ids"]
    assert got == fmt


def test_bfd_iterable_dataset():
    ds = datasets.Dataset.from_dict({"input_ids": EXAMPLES["input_ids"]}).to_iterable_dataset().with_format("numpy")
    formatting = ds._formatting
    out = packkit.pack_dataset(ds, 4, strategy="bfd")
    assert same_rows(next(iter(out.with_format(None).batch(batch_size=3))),
                     {"input_ids": [[4, 5, 6, 7], [1, 2, 3, 8]], "seq_lengths": [[4], [3, 1]]})
    assert out._formatting == formatting


@pytest.mark.parametrize("examples, seq_length, strategy, expected", [
    ({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11], [12]]}, 4, "bfd_split",
     {"input_ids": [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7, 5, 12]], "seq_lengths": [[4], [4], [2, 1, 1]]}),
    ({"col1": [[1, -2, 3, -4, 5, -6], [7, -8, 9], [-10, 11, -12], [13, -14, 15, -16]],
      "col2": [[-1, 2, -3, 4, -5, 6], [-7, 8, -9], [10, -11, 12], [-13, 14, -15, 16]]}, 4, "bfd_split",
     {"col1": [[1, -2, 3, -4], [13, -14, 15, -16], [7, -8, 9], [-10, 11, -12], [5, -6]],
      "col2": [[-1, 2, -3, 4], [-13, 14, -15, 16], [-7, 8, -9], [10, -11, 12], [-5, 6]],
      "seq_lengths": [[4], [4], [3], [3], [2]]}),
    ({"input_ids": [[1, 2, 3, 4, 5], [6], [7, 8, 9, 10], [11, 12, 13]]}, 5, "bfd_split",
     {"input_ids": [[1, 2, 3, 4, 5], [7, 8, 9, 10, 6], [11, 12, 13]], "seq_lengths": [[5], [4, 1], [3]]}),
    ({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11], [12]]}, 4, "bfd",
     {"input_ids": [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7, 12]], "seq_lengths": [[4], [4], [2, 1]]}),
    ({"input_ids": [[1, 2], [], [3, 4, 5], [], [6]]}, 4, "bfd_split",
     {"input_ids": [[3, 4, 5, 6], [1, 2]], "seq_lengths": [[3, 1], [2]]}),
], ids=["overlong_0", "two_columns_no_input_ids", "non_power_of_2", "default_no_split", "empty_sequences"])
def test_trl_bfd_cases(examples, seq_length, strategy, expected):
    ds = datasets.Dataset.from_dict(examples)
    for shuffle in (True, False):
        out = packkit.pack_dataset(ds, seq_length, strategy=strategy, shuffle=shuffle)
        assert same_rows(out.to_dict(), expected), out.to_dict()
    if strategy == "bfd":  # the default strategy is "bfd"
        assert same_rows(packkit.pack_dataset(ds, seq_length).to_dict(), expected)


def test_docstring_example():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]],
                                     "attention_mask": [[1, 1, 1, 0, 0], [1, 0], [1, 1, 0], [1]]})
    assert same_rows(packkit.pack_dataset(ds, seq_length=4, strategy="bfd")[:], {
        "input_ids": [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7]], "attention_mask": [[1, 1, 1, 0], [1, 1, 0, 1], [1, 0]],
        "seq_lengths": [[4], [3, 1], [2]]})
    # "bfd_split" keeps every token; which pieces share a row is the planner's (TRL: [8, 9, 10, 5], [6, 7, 11])
    out = packkit.pack_dataset(ds, 4, "bfd_split")
    assert segments(table_rows(out)) == expected_segments(ds.to_dict(), 4, "bfd_split")
    assert sorted(len(r) for r in out["input_ids"]) == [3, 4, 4]


# ---- every form, every column type ----

def check_bfd(out, columns, seq_length, strategy, *, names=None):
    rows = table_rows(out)
    assert segments(rows) == expected_segments(columns, seq_length, strategy)
    assert all(len(r[next(iter(columns))]) <= seq_length for r in rows)
    for r in rows:  # inside a row, TRL's order: longest first
        assert list(r["seq_lengths"]) == sorted(r["seq_lengths"], reverse=True)
    if names is not None:
        assert all(list(r) == names for r in rows)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("strategy", ["bfd", "bfd_split"])
def test_every_column_type_packs_once_in_input_order(seed, strategy):
    rng = np.random.default_rng(seed)
    columns, types = random_columns(rng, int(rng.integers(1, 120)))
    large = bool(seed % 2)
    ds = make_dataset(columns, types, large=large)
    seq_length = int(rng.integers(1, 48))
    out = packkit.pack_dataset(ds, seq_length, strategy)
    assert out.column_names == list(columns) + ["seq_lengths"]  # the input's order; input_ids not moved
    for c in columns:
        assert out.data.schema.field(c).type == ds.data.schema.field(c).type  # value types and list kind kept
    # seq_lengths as TRL types it: the first column's length type (list -> int32, large_list -> int64)
    assert out.data.schema.field("seq_lengths").type == pa.list_(pa.int64() if large else pa.int32())
    check_bfd(out, columns, seq_length, strategy, names=list(columns) + ["seq_lengths"])


def test_wrapped_cuts_each_map_batch_like_trl():
    rng = np.random.default_rng(4)
    columns, types = random_columns(rng, 2500, max_len=9, kinds=("float",))
    ds = make_dataset(columns, types)
    out = packkit.pack_dataset(ds, 7, "wrapped")
    stream = lambda rows, c: [x for r in rows for x in r[c]]  # noqa: E731
    for batch_size, rows in [(1000, None), (None, None), (333, None)]:
        kw = {} if batch_size == 1000 else {"map_kwargs": {"batch_size": batch_size}}
        got = packkit.pack_dataset(ds, 7, "wrapped", **kw).to_list()
        step = batch_size or len(ds)
        want = []
        for b0 in range(0, len(ds), step):  # TRL: each batch's tokens one after another, cut every 7
            flat = {c: [x for r in columns[c][b0:b0 + step] for x in r] for c in columns}
            n = len(flat["input_ids"])
            want += [{c: flat[c][i:i + 7] for c in columns} for i in range(0, n, 7)]
        assert [{c: list(r[c]) for c in columns} for r in got] == [{c: list(r[c]) for c in columns} for r in want]
    assert "seq_lengths" not in out.column_names
    assert stream(out.to_list(), "input_ids") == [x for r in columns["input_ids"] for x in r]
    shuffled = packkit.pack_dataset(ds, 7, "wrapped", shuffle=True, seed=3)
    assert row_multiset(shuffled.to_list()) == row_multiset(out.to_list()) and shuffled[:5] != out[:5]


def _forms(ds, tmp_path):
    yield "plain", ds
    yield "shuffled", ds.shuffle(seed=1)
    yield "selected", ds.select(range(len(ds) - 1, -1, -3))
    yield "sharded", ds.shard(num_shards=3, index=1)
    yield "concatenated", datasets.concatenate_datasets([ds.select(range(0, len(ds) // 2)),
                                                         ds.select(range(len(ds) // 2, len(ds)))])
    ds.save_to_disk(str(tmp_path / "saved"), max_shard_size="20KB")
    yield "from_disk", datasets.load_from_disk(str(tmp_path / "saved"))


@pytest.mark.parametrize("strategy", ["bfd", "bfd_split"])
def test_dataset_forms(tmp_path, strategy):
    rng = np.random.default_rng(11)
    columns, types = random_columns(rng, 300)
    base = make_dataset(columns, types)
    for name, ds in _forms(base, tmp_path / strategy):
        out = packkit.pack_dataset(ds, 32, strategy)
        check_bfd(out, ds.to_dict(), 32, strategy)
        assert out.column_names == ds.column_names + ["seq_lengths"], name


@pytest.mark.parametrize("fmt", [
    dict(type="numpy"), dict(type="numpy", dtype="float32"), dict(type="torch"), dict(type="pandas"),
    dict(type="numpy", columns=["input_ids"]), dict(type="torch", columns=["input_ids"], output_all_columns=True),
    dict(type=None, columns=["labels", "input_ids"]), dict(type="arrow"),
])
def test_format_restored(fmt):
    ds = datasets.Dataset.from_dict({"labels": [[1, 2, 3], [4, 5], [6]], "input_ids": [[1, 2, 3], [4, 5], [6]]})
    ds = ds.with_format(**fmt)
    want = dict(ds.format)
    out = packkit.pack_dataset(ds, 4)
    got = out.format
    assert got["columns"] == want["columns"] + ["seq_lengths"]  # TRL adds seq_lengths to the format's columns
    got["columns"] = want["columns"]
    assert got == want
    wrapped = packkit.pack_dataset(ds, 4, "wrapped")
    assert wrapped.format == want


def test_iterable_dataset_streams_in_bounded_buffers():
    rng = np.random.default_rng(5)
    columns, types = random_columns(rng, 500, kinds=("int", "float"))
    ds = make_dataset(columns, types)
    stream = ds.to_iterable_dataset(num_shards=4).with_format("numpy")
    calls = []
    real = packkit.datasets.streamed.BufferPacker.__call__

    def spy(self, table, indices):
        calls.append(len(table))
        return real(self, table, indices)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packkit.datasets.streamed.BufferPacker, "__call__", spy)
        out = packkit.pack_dataset(stream, 40, "bfd_split", buffer_size=64)
        assert isinstance(out, datasets.IterableDataset) and out._formatting == stream._formatting
        rows = table_rows(out)
    assert max(calls) <= 64 and sum(calls) == 500  # each buffer of at most 64 rows planned alone
    assert segments(rows) == expected_segments(columns, 40, "bfd_split")
    assert all(list(r) == list(columns) + ["seq_lengths"] for r in rows)
    again = table_rows(packkit.pack_dataset(stream, 40, "bfd_split", buffer_size=64))
    assert again == rows  # seeded: the same stream packs the same way
    other = table_rows(packkit.pack_dataset(stream, 40, "bfd_split", buffer_size=64, seed=9))
    assert row_multiset(other) != row_multiset(rows) or other != rows
    # map_kwargs' batch_size sets the buffer, as it sets TRL's map batch
    calls.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packkit.datasets.streamed.BufferPacker, "__call__", spy)
        table_rows(packkit.pack_dataset(stream, 40, map_kwargs={"batch_size": 100}))
    assert max(calls) <= 100


def test_dataset_dicts():
    rng = np.random.default_rng(6)
    parts = {}
    for split in ("train", "test"):
        columns, types = random_columns(rng, 80, kinds=("float",))
        parts[split] = (columns, make_dataset(columns, types))
    dd = datasets.DatasetDict({k: v[1] for k, v in parts.items()}).with_format("numpy")
    out, reports = packkit.pack_dataset(dd, 30, return_report=True)
    assert isinstance(out, datasets.DatasetDict) and list(out) == ["train", "test"] and set(reports) == set(out)
    for split, (columns, _) in parts.items():
        assert out[split].format["type"] == "numpy"
        check_bfd(out[split], columns, 30, "bfd")
    idd = datasets.IterableDatasetDict({k: v[1].to_iterable_dataset() for k, v in parts.items()})
    out = packkit.pack_dataset(idd, 30, "bfd_split")
    assert isinstance(out, datasets.IterableDatasetDict)
    for split, (columns, _) in parts.items():
        assert isinstance(out[split], datasets.IterableDataset)
        check_bfd(out[split], columns, 30, "bfd_split")


def test_shuffle_false_is_deterministic_in_source_order():
    rng = np.random.default_rng(7)
    columns, types = random_columns(rng, 200, kinds=())
    ds = make_dataset(columns, types)
    a = packkit.pack_dataset(ds, 64, shuffle=False)
    b = packkit.pack_dataset(ds.select(range(len(ds))), 64, shuffle=False)
    assert a["input_ids"] == b["input_ids"]
    # rows in the dataset order of their longest (first) document
    first = {tuple(columns["input_ids"][i][:64]): i for i in range(len(ds)) if columns["input_ids"][i]}
    keys = [first[tuple(r[:s[0]])] for r, s in zip(a["input_ids"], a["seq_lengths"])]
    assert keys == sorted(keys)
    s1, s2 = packkit.pack_dataset(ds, 64, seed=1), packkit.pack_dataset(ds, 64, seed=1)
    assert s1["input_ids"] == s2["input_ids"] and row_multiset(s1.to_list()) == row_multiset(a.to_list())


def test_null_rows_and_values_are_kept_as_trl_keeps_them():
    table = pa.table({"input_ids": pa.array([[1, 2], None, [3, 4, 5]], type=pa.list_(pa.int64())),
                      "weights": pa.array([[0.5, None], None, [1.0, 2.0, None]], type=pa.list_(pa.float32()))})
    out = packkit.pack_dataset(datasets.Dataset(table), 8, shuffle=False)
    assert out.to_dict() == {"input_ids": [[3, 4, 5, 1, 2]], "weights": [[1.0, 2.0, None, 0.5, None]],
                             "seq_lengths": [[3, 2]]}


def test_position_ids_column_is_packed_unless_written():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]], "position_ids": [[0, 1], [0]]})
    out = packkit.pack_dataset(ds, 4, shuffle=False)
    assert out.column_names == ["input_ids", "position_ids", "seq_lengths"]
    assert out["position_ids"] == [[0, 1, 0]]
    with pytest.raises(ValueError, match="'position_ids' is reserved"):
        packkit.pack_dataset(ds, 4, position_ids=True)


def test_extra_options_still_work_under_trl_arguments():
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in range(1, 40)], "text": ["x"] * 39})
    with pytest.raises(TypeError, match="column 'text' is not per-token"):
        packkit.pack_dataset(ds, 16, "bfd")
    out, report = packkit.pack_dataset(ds, 16, "bfd_split", {"num_proc": 2, "desc": "packing"},
                                       columns=["input_ids"], dp_size=2, return_report=True)
    assert report.excluded_columns == ["text"] and report.overlong == "split" and report.dp_size == 2
    assert sum(map(len, out["input_ids"])) == sum(range(1, 40))
    kept = packkit.pack_dataset(ds, 16, map_kwargs={"keep_in_memory": True}, columns=["input_ids"])
    assert not kept.cache_files
