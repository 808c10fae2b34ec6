"""The drop-in contract at its edges (issue 63): packkit.pack_dataset against the installed trl.pack_dataset on
Dataset and IterableDataset, "wrapped" and "bfd", at 0, 1, 999, 1,000, 1,001 and 2,001 rows (around TRL's
1,000-row map batch). "wrapped": the same rows as TRL, in TRL's order (a streamed buffer is cut per map batch as
TRL cuts it, not per 10,000-row buffer). "bfd": the same documents (truncated), never more rows. Empty input:
0 rows on every strategy (TRL 1.16 gives 0 rows for "wrapped" and raises for "bfd" on an empty Dataset)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import packkit
from pack_trl_checks import expected_segments, row_multiset, segments, table_rows

pytestmark = pytest.mark.full

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

FEATURES = {"input_ids": datasets.List(datasets.Value("int64")), "labels": datasets.List(datasets.Value("int32"))}
SIZES = [0, 1, 999, 1000, 1001, 2001]


def columns_of(n: int, seed: int, *, max_len: int = 9):
    """n rows of 0..max_len tokens (some empty), ids unique per token so a lost or doubled token shows."""
    lengths = np.random.default_rng(seed).integers(0, max_len + 1, n)
    cum = np.concatenate(([0], np.cumsum(lengths))).astype(int)
    ids = [list(range(a, b)) for a, b in zip(cum[:-1], cum[1:])]
    return {"input_ids": ids, "labels": [[-x for x in r] for r in ids]}


def dataset_of(columns, streamed: bool):
    ds = datasets.Dataset.from_dict(columns, features=datasets.Features(FEATURES))
    if not streamed:
        return ds
    if len(ds):  # Arrow-backed, 2 shards: map batches run across the shard boundary
        return ds.to_iterable_dataset(num_shards=min(2, len(ds)))
    return datasets.IterableDataset.from_generator(lambda: iter([]), features=datasets.Features(FEATURES))


def run(fn, ds, seq_length, strategy, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return table_rows(fn(ds, seq_length, strategy, **kw))


def trl_wrapped_rows(columns, seq_length: int, batch: int | None = 1000):
    """TRL's "wrapped", by its documentation: each map batch's tokens one after another, cut every seq_length."""
    n = len(columns["input_ids"])
    step = batch or max(n, 1)
    out = []
    for b0 in range(0, n, step):
        flat = {c: [x for r in columns[c][b0:b0 + step] for x in r] for c in columns}
        out += [{c: flat[c][i:i + seq_length] for c in columns} for i in range(0, len(flat["input_ids"]), seq_length)]
    return out


@pytest.mark.parametrize("streamed", [False, True], ids=["Dataset", "IterableDataset"])
@pytest.mark.parametrize("n", SIZES)
def test_wrapped_rows_equal_trl(n, streamed):
    columns = columns_of(n, seed=n)
    ds = dataset_of(columns, streamed)
    ours, theirs = run(packkit.pack_dataset, ds, 7, "wrapped"), run(trl.pack_dataset, ds, 7, "wrapped")
    assert len(ours) == len(theirs)
    assert ours == theirs  # TRL's rows in TRL's order
    assert ours == trl_wrapped_rows(columns, 7)  # and what TRL documents (not only what both happen to do)
    tokens = [x for r in ours for x in r["input_ids"]]
    assert tokens == [x for r in columns["input_ids"] for x in r]  # every token once, in order


@pytest.mark.parametrize("streamed", [False, True], ids=["Dataset", "IterableDataset"])
@pytest.mark.parametrize("n", SIZES)
def test_bfd_documents_equal_trl(n, streamed):
    columns = columns_of(n, seed=100 + n)
    ds = dataset_of(columns, streamed)
    ours = run(packkit.pack_dataset, ds, 7, "bfd")
    if n == 0 and not streamed:  # TRL 1.16 raises here (its format restore asks for a seq_lengths never written)
        with pytest.raises(ValueError, match="seq_lengths"):
            run(trl.pack_dataset, ds, 7, "bfd")
        assert ours == []
        return
    theirs = run(trl.pack_dataset, ds, 7, "bfd")
    assert segments(ours) == segments(theirs)  # the same documents, each once
    assert len(ours) <= len(theirs)  # one plan per 10,000-row buffer, never more rows than TRL's 1,000-row batches
    assert all(sum(r["seq_lengths"]) <= 7 for r in ours)
    # and what TRL documents: each non-empty row's first 7 tokens, every column alike
    assert segments(ours, names=["input_ids", "labels"]) == expected_segments(columns, 7, "bfd")


@pytest.mark.parametrize("strategy", ["bfd", "bfd_split", "wrapped"])
def test_empty_input_is_zero_rows(strategy):
    typed = datasets.Dataset.from_dict({"input_ids": [], "labels": []}, features=datasets.Features(FEATURES))
    untyped = datasets.Dataset.from_dict({"input_ids": []})  # column type null: nothing says what it holds
    only_empty = datasets.Dataset.from_dict({"input_ids": [[], []], "labels": [[], []]},
                                            features=datasets.Features(FEATURES))
    for ds in (typed, untyped, only_empty, dataset_of(columns_of(0, 0), streamed=True)):
        out = packkit.pack_dataset(ds, 8, strategy)
        assert table_rows(out) == []
        if isinstance(ds, datasets.Dataset):
            want = list(ds.column_names) + ([] if strategy == "wrapped" else ["seq_lengths"])
            assert out.column_names == want
            assert all(out.features[c] == ds.features[c] for c in ds.column_names)  # types kept (null too)
    for ds in (typed, untyped):
        if strategy == "wrapped":  # TRL's own answer on an empty Dataset
            theirs = trl.pack_dataset(ds, 8, strategy)
            out = packkit.pack_dataset(ds, 8, strategy)
            assert len(theirs) == 0 and out.features == theirs.features and out.format == theirs.format
    _, report = packkit.pack_dataset(typed, 8, strategy, return_report=True)
    assert (report.sequences, report.rows, report.tokens) == (0, 0, 0)


def test_streamed_wrapped_cuts_per_map_batch_like_trl():
    """The issue's case: 1,001 rows of 3 tokens at seq_length 7 (TRL 430 rows; a 10,000-row buffer gave 429)."""
    columns = {"input_ids": [[i, i, i] for i in range(1001)], "labels": [[1, 2, 3]] * 1001}
    stream = dataset_of(columns, streamed=True)
    ours = run(packkit.pack_dataset, stream, 7, "wrapped")
    assert len(ours) == len(run(trl.pack_dataset, stream, 7, "wrapped")) == 430
    for batch in (250, 333, None, 0):  # map_kwargs' batch_size as TRL passes it to map (None, <= 0: one batch)
        kw = {"map_kwargs": {"batch_size": batch}}
        got = run(packkit.pack_dataset, stream, 7, "wrapped", **kw)
        assert got == run(trl.pack_dataset, stream, 7, "wrapped", **kw) == trl_wrapped_rows(columns, 7, batch)
    # a buffer of whole map batches cuts the same rows; any other buffer is refused by name
    assert run(packkit.pack_dataset, stream, 7, "wrapped", buffer_size=3000) == ours
    shuffled = run(packkit.pack_dataset, stream, 7, "wrapped", buffer_size=2000, shuffle=True, seed=1)
    assert row_multiset(shuffled) == row_multiset(ours) and shuffled != ours
    for bad, kw in [(1500, {}), (10, {"map_kwargs": {"batch_size": 4}}), (1000, {"map_kwargs": {"batch_size": None}})]:
        with pytest.raises(ValueError, match="buffer_size"):
            packkit.pack_dataset(stream, 7, "wrapped", buffer_size=bad, **kw)
    sharded = datasets.Dataset.from_dict(columns).to_iterable_dataset(num_shards=3)  # map batches span shards
    assert run(packkit.pack_dataset, sharded, 7, "wrapped") == run(trl.pack_dataset, sharded, 7, "wrapped")
