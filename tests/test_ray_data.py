"""pack_dataset on Ray Data, on a local cluster (ray.init(num_cpus=2), started once for this module)."""
from __future__ import annotations

import numpy as np
import pytest

import packkit
from dataset_checks import decode_segments, expected_segments, make_rows

pytestmark = pytest.mark.full

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def tables(lengths, blocks):
    ids = make_rows(lengths)
    table = pa.table({"input_ids": pa.array(ids, type=pa.list_(pa.int64())),
                      "labels": pa.array([r * 2 + 1 for r in ids], type=pa.list_(pa.int64()))})
    cuts = np.linspace(0, len(lengths), blocks + 1).astype(int)
    return table, [table.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])]


def rows_of(ds):
    out = {"input_ids": [], "labels": [], "seq_lengths": []}
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        for k in out:
            out[k].extend(batch.column(k).to_pylist())
    return out


@pytest.mark.parametrize("num_blocks", [None, 1, 5])
def test_exactly_once_and_same_rows_as_single_process(num_blocks):
    lengths = np.random.default_rng(0).integers(0, 90, 700)
    table, parts = tables(lengths, 4)
    ds = ray.data.from_arrow(parts)
    out, report = packkit.pack_dataset(ds, 64, overlong="split", num_blocks=num_blocks, return_report=True)
    rows = rows_of(out)
    assert decode_segments(rows["input_ids"], rows["seq_lengths"], 64) == expected_segments(lengths, 64, "split")
    for ids, labels in zip(rows["input_ids"], rows["labels"]):
        assert np.array_equal(np.asarray(labels), np.asarray(ids) * 2 + 1)
    single, single_report = packkit.pack_dataset(datasets.Dataset(table), 64, overlong="split", return_report=True)
    assert out.count() == len(single) == report.rows
    # Ray plans its rows in content order (its block order is the scheduler's), the single process in dataset order:
    # the same plan of the same lengths, so row for row the same segment lengths, holding other documents of them.
    assert [sorted(r) for r in rows["seq_lengths"]] == [sorted(r) for r in single["seq_lengths"]]
    assert report.summary() == single_report.summary()
    for name in ("dropped", "truncated", "split", "zero_length"):
        assert np.array_equal(getattr(report, name), getattr(single_report, name)), name
    assert str(out.schema().base_schema.field("seq_lengths").type) == "list<item: int32>"


def test_blocks_are_read_in_the_datasets_order(monkeypatch):
    """The report's row indices follow the order the input blocks are read in; Ray's executor hands them over as its
    tasks finish unless ``preserve_order`` is set (a busy CI machine once gave other `split` / `zero_length` indices
    than the single-process report). The read must ask for the dataset's order, and leave the caller's context as it
    was."""
    seen = []
    real = ray.data.Dataset.to_arrow_refs

    def spy(self, *args, **kwargs):
        seen.append(self.context.execution_options.preserve_order)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ray.data.Dataset, "to_arrow_refs", spy)
    lengths = np.random.default_rng(2).integers(1, 60, 50)
    _, parts = tables(lengths, 3)
    ds = ray.data.from_arrow(parts)
    before = ds.context.execution_options.preserve_order
    packkit.pack_dataset(ds, 64)
    assert seen and all(seen), seen
    assert ds.context.execution_options.preserve_order == before


def test_deterministic_for_equal_input_and_seed_with_dp_steps():
    lengths = np.random.default_rng(1).integers(1, 200, 400)
    _, parts = tables(lengths, 3)
    a = rows_of(packkit.pack_dataset(ray.data.from_arrow(parts), 256, dp_size=2, cost="attention", seed=3))
    b = rows_of(packkit.pack_dataset(ray.data.from_arrow(parts), 256, dp_size=2, cost="attention", seed=3))
    c = rows_of(packkit.pack_dataset(ray.data.from_arrow(parts), 256, dp_size=2, cost="attention", seed=4))
    assert a == b and a["input_ids"] != c["input_ids"]
    assert decode_segments(a["input_ids"], a["seq_lengths"], 256) == expected_segments(lengths, 256, "error")


@pytest.mark.parametrize("shuffle", [True, False])
def test_same_rows_whatever_the_block_order_and_cut(shuffle, monkeypatch):
    """Issue 46: the blocks Ray hands over come in its scheduler's order. Here the order is shuffled on purpose
    (blocks permuted, the dataset cut into other blocks, the refs reversed as they come out of Ray): the packed
    rows are the same for the same rows and seed."""
    lengths = np.random.default_rng(5).integers(1, 200, 300)
    table, parts = tables(lengths, 4)
    kw = dict(dp_size=2, cost="attention", seed=11, shuffle=shuffle)
    reference = rows_of(packkit.pack_dataset(ray.data.from_arrow(parts), 256, **kw))
    assert decode_segments(reference["input_ids"], reference["seq_lengths"], 256) == expected_segments(
        lengths, 256, "error")
    permuted = [parts[i] for i in (2, 0, 3, 1)]
    assert rows_of(packkit.pack_dataset(ray.data.from_arrow(permuted), 256, **kw)) == reference
    _, recut = tables(lengths, 7)
    assert rows_of(packkit.pack_dataset(ray.data.from_arrow(recut[::-1]), 256, **kw)) == reference
    real = ray.data.Dataset.to_arrow_refs
    monkeypatch.setattr(ray.data.Dataset, "to_arrow_refs", lambda self: real(self)[::-1])
    assert rows_of(packkit.pack_dataset(ray.data.from_arrow(parts), 256, **kw)) == reference
    # Control: rows planned in the order the blocks came (keys that ignore the content) change with that order.
    from packkit.datasets import ray_data

    monkeypatch.setattr(ray_data, "content_order", lambda keys: np.arange(len(keys)))
    assert rows_of(packkit.pack_dataset(ray.data.from_arrow(parts), 256, **kw)) != reference


def test_content_keys_tell_rows_apart():
    from packkit.datasets.ray_data import row_keys

    table = pa.table({"input_ids": pa.array([[1, 2], [2, 1], [1, 2], [], [1, 2, 0], [3]]),
                      "labels": pa.array([[1, 2], [2, 1], [1, 5], [], [1, 2, 0], [3]])})
    keys = [tuple(k) for k in row_keys(table, ["input_ids", "labels"]).tolist()]
    assert len(set(keys)) == 6  # order, labels, length and a trailing 0 all count
    again = [tuple(k) for k in row_keys(pa.concat_tables([table.slice(0, 2), table.slice(2)]),
                                        ["input_ids", "labels"]).tolist()]
    assert again == keys  # not the chunking


def test_errors_name_global_rows_and_return_nothing():
    parts = [pa.table({"input_ids": pa.array([[1, 2], [3]]), "labels": pa.array([[1, 2], [3]])}),
             pa.table({"input_ids": pa.array([[4, 5, 6], [7]]), "labels": pa.array([[4, 5], [7]])})]
    with pytest.raises(ValueError, match=r"column 'labels', row 2: 2 values but input_ids has 3"):
        packkit.pack_dataset(ray.data.from_arrow(parts), 8)
    with pytest.raises(ValueError, match="longer than"):
        packkit.pack_dataset(ray.data.from_arrow(parts[:1]), 1, overlong="error")
    with pytest.raises(ValueError, match="seq_length must be a positive integer"):
        packkit.pack_dataset(ray.data.from_arrow(parts[:1]), 0)
    with pytest.raises(ValueError, match="empty"):
        packkit.pack_dataset(ray.data.from_arrow(parts[:1]).filter(lambda r: False), 8)
    with pytest.raises(TypeError, match="keep_in_memory and cache_file_name are for a datasets.Dataset"):
        packkit.pack_dataset(ray.data.from_arrow(parts[:1]), 8, cache_file_name="x.arrow")
    text = ray.data.from_items([{"input_ids": [1, 2], "text": "a b"}])
    with pytest.raises(ValueError, match="column 'text' is not per-token"):
        packkit.pack_dataset(text, 8)
    assert packkit.pack_dataset(text, 8, columns=["input_ids"]).count() == 1


@pytest.mark.parametrize("as_column", [True, False])
def test_extra_cost_column_or_array_is_balanced_on_the_cluster(as_column):
    """extra_cost on Ray: a numeric column (read by the tasks, not packed) or an array in the dataset's order. The
    balance recomputed from the packed rows (tokens + each row's extra cost) is the report's; a plan on tokens alone
    is the control."""
    from test_pack_dataset_extra_cost import step_balance, vlm_like

    lengths, extra = vlm_like(400, 0)
    table, _ = tables(lengths, 1)
    table = table.append_column("image_flops", pa.array(extra))
    cuts = np.linspace(0, len(lengths), 5).astype(int)
    ds = ray.data.from_arrow([table.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])])
    out, report = packkit.pack_dataset(ds, 512, dp_size=4, extra_cost="image_flops" if as_column else extra,
                                       return_report=True, columns=["input_ids", "labels"])
    rows = rows_of(out)
    assert decode_segments(rows["input_ids"], rows["seq_lengths"], 512) == expected_segments(lengths, 512, "error")
    assert "image_flops" not in out.schema().names and report.excluded_columns == ["image_flops"]
    assert step_balance(rows["input_ids"], extra, 4) == pytest.approx(report.balance, rel=1e-9)
    assert report.balance < 1.15
    control = rows_of(packkit.pack_dataset(ds, 512, dp_size=4, columns=["input_ids", "labels"]))
    assert step_balance(control["input_ids"], extra, 4) > 1.5
    with pytest.raises(TypeError, match="extra_cost column 'labels' must hold one number per row"):
        packkit.pack_dataset(ds, 512, extra_cost="labels")
    with pytest.raises(ValueError, match="extra_cost has 3 entries for 400"):
        packkit.pack_dataset(ds, 512, extra_cost=[1.0, 2.0, 3.0], columns=["input_ids", "labels"])
