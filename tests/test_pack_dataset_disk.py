"""pack_dataset's output on disk: like Dataset.map, a dataset backed by Arrow files is packed into a cache
file beside them (written batch by batch, memory-mapped); the rows are the same as packed in memory."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import packkit
from test_pack_dataset import check_packed, source

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
from datasets.table import MemoryMappedTable  # noqa: E402

import packkit.datasets.hf_datasets as pk_datasets  # noqa: E402
from packkit.datasets import arrow_packing  # noqa: E402

pytestmark = pytest.mark.core

LENGTHS = [5, 0, 17, 3, 40, 12, 1, 29, 8, 33, 21, 2, 14, 9, 36, 6]
SEQ_LENGTH = 48


@pytest.fixture
def on_disk(tmp_path):
    source(LENGTHS).save_to_disk(str(tmp_path / "src"))
    return datasets.load_from_disk(str(tmp_path / "src"))


def same_rows(a, b):
    assert a.column_names == b.column_names and len(a) == len(b)
    assert a.data.table.equals(b.data.table)
    assert a.info.description == b.info.description


def test_an_on_disk_dataset_is_packed_into_a_cache_file_beside_it(on_disk):
    out = packkit.pack_dataset(on_disk, SEQ_LENGTH, overlong="split")
    [entry] = out.cache_files
    assert os.path.dirname(entry["filename"]) == os.path.dirname(on_disk.cache_files[0]["filename"])
    assert os.path.basename(entry["filename"]).startswith("cache-packkit-")
    assert isinstance(out.data, MemoryMappedTable)
    check_packed(out, LENGTHS, SEQ_LENGTH, "split")
    in_memory = packkit.pack_dataset(on_disk, SEQ_LENGTH, overlong="split", keep_in_memory=True)
    assert in_memory.cache_files == []
    same_rows(out, in_memory)
    assert not [f for f in os.listdir(os.path.dirname(entry["filename"])) if f.endswith(".tmp")]


@pytest.mark.parametrize("position_ids", [False, True])
def test_many_small_batches_give_the_same_rows(on_disk, monkeypatch, position_ids):
    monkeypatch.setattr(pk_datasets, "DISK_CHUNK_TOKENS", 7)  # a batch per row or two
    out = packkit.pack_dataset(on_disk, SEQ_LENGTH, overlong="truncate", position_ids=position_ids)
    assert out.data.table.to_batches() and len(out.data.table.to_batches()) > 3
    same_rows(out, packkit.pack_dataset(on_disk, SEQ_LENGTH, overlong="truncate", position_ids=position_ids,
                                        keep_in_memory=True))
    check_packed(out, LENGTHS, SEQ_LENGTH, "truncate")


def test_cache_file_name_for_an_in_memory_dataset_is_rewritten_each_call(tmp_path):
    ds = source(LENGTHS)
    assert ds.cache_files == []
    path = tmp_path / "nested" / "packed.arrow"
    out = packkit.pack_dataset(ds, SEQ_LENGTH, overlong="drop", cache_file_name=path)
    assert out.cache_files == [{"filename": str(path)}]
    same_rows(out, packkit.pack_dataset(ds, SEQ_LENGTH, overlong="drop"))
    again = packkit.pack_dataset(ds, 64, cache_file_name=str(path))  # not read back: packed afresh
    check_packed(again, LENGTHS, 64, "drop")
    assert len(again) < len(out)


def test_with_caching_disabled_the_file_goes_to_a_temporary_directory(on_disk):
    datasets.disable_caching()
    try:
        out = packkit.pack_dataset(on_disk, SEQ_LENGTH, overlong="split")
    finally:
        datasets.enable_caching()
    [entry] = out.cache_files
    assert os.path.dirname(entry["filename"]) != os.path.dirname(on_disk.cache_files[0]["filename"])
    check_packed(out, LENGTHS, SEQ_LENGTH, "split")


def test_a_failure_while_writing_leaves_no_file(on_disk, tmp_path, monkeypatch):
    monkeypatch.setattr(pk_datasets, "DISK_CHUNK_TOKENS", 7)
    calls = []
    real = arrow_packing.pack_values

    def failing(*args):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("disk full (simulated)")
        return real(*args)

    monkeypatch.setattr(arrow_packing, "pack_values", failing)
    path = tmp_path / "out" / "packed.arrow"
    with pytest.raises(RuntimeError, match="simulated"):
        packkit.pack_dataset(on_disk, SEQ_LENGTH, overlong="split", cache_file_name=path)
    assert os.listdir(path.parent) == []


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(keep_in_memory=True, cache_file_name="x.arrow"), ValueError, "not both"),
    (dict(keep_in_memory="yes"), TypeError, "keep_in_memory must be None, True or False"),
    (dict(cache_file_name=3), TypeError, "cache_file_name must be a path"),
])
def test_bad_output_options(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        packkit.pack_dataset(source(LENGTHS), SEQ_LENGTH, overlong="split", **kwargs)



@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=80), cuts=st.lists(st.integers(0, 80), max_size=12),
       batch_tokens=st.sampled_from([None, 5, 40]), overlong=st.sampled_from(["split", "truncate", "drop"]))
def test_a_column_in_many_chunks_is_gathered_per_batch_not_combined(lengths, cuts, batch_tokens, overlong):
    # Arrow chunks (empty ones included) at arbitrary row cuts; every column is gathered per output batch
    # from its chunks and must give the rows the same table in one chunk gives.
    whole = source(lengths).data.table
    bounds = sorted({0, len(lengths), *(min(c, len(lengths)) for c in cuts)}) + [len(lengths)]
    chunked = pa.Table.from_batches([b for a, z in zip(bounds[:-1], bounds[1:]) for b in whole.slice(a, z - a).to_batches()]
                                    or whole.to_batches(), schema=whole.schema)
    col = arrow_packing.token_column("input_ids", chunked.column("input_ids"))
    assert (col.values is None) == (chunked.column("input_ids").num_chunks > 1)
    with pytest.MonkeyPatch.context() as mp:
        if batch_tokens is not None:
            mp.setattr(arrow_packing, "GATHER_CHUNK_TOKENS", batch_tokens)
        out = packkit.pack_dataset(datasets.Dataset(chunked), 24, overlong=overlong)
    same_rows(out, packkit.pack_dataset(datasets.Dataset(whole.combine_chunks()), 24, overlong=overlong))
    check_packed(out, lengths, 24, overlong)
    np.testing.assert_array_equal(col.offsets, np.concatenate(([0], np.cumsum(lengths))))
