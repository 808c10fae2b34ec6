"""packkit.PackedIterableDataset: on-the-fly packing, exactly once, across workers and resumes."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from packkit.training.streaming import PackedIterableDataset
from streaming_helpers import MODEL_KEYS, as_array, check_items, expected_pieces, make_examples

pytestmark = pytest.mark.core

FORMS = ("list", "numpy", "tensor", "bare")


def source_of(seed, n, max_len, form, labels=False, min_len=1):
    examples = make_examples(seed, n, max_len, min_len=min_len, labels=labels and form != "bare",
                             form="list" if form == "bare" else form)
    return [ex["input_ids"] for ex in examples] if form == "bare" else examples


def same_item(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


config = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32 - 1),
    "n": st.integers(0, 60),
    "capacity": st.integers(4, 64),
    "long": st.sampled_from([0.5, 1.0, 2.5]),  # longest example, as a multiple of capacity
    "buffer_size": st.integers(1, 40),
    "rows_per_item": st.sampled_from([None, 1, 3]),
    "layout": st.sampled_from(["padded", "flat"]),
    "overlong": st.sampled_from(["drop", "truncate", "split"]),
    "algorithm": st.sampled_from(["obfd", "nf", "ffd", "ogbfd"]),
    "carry_threshold": st.sampled_from([0.0, 0.9, 0.99, 1.0]),
    "max_carries": st.sampled_from([0, 1, 8]),
    "form": st.sampled_from(FORMS),
    "labels": st.booleans(),
    "mask_first_label": st.booleans(),  # False was untested (audit, issue 27)
})


def build(cfg, **extra):
    src = source_of(cfg["seed"], cfg["n"], max(1, int(cfg["capacity"] * cfg["long"])), cfg["form"], cfg["labels"])
    kwargs = {k: cfg[k] for k in ("buffer_size", "rows_per_item", "layout", "overlong", "algorithm",
                                  "carry_threshold", "max_carries", "mask_first_label")}
    kwargs["max_carry"] = min(cfg["buffer_size"] - 1, cfg["buffer_size"] // 2)
    return src, PackedIterableDataset(src, cfg["capacity"], return_example_ids=True, **{**kwargs, **extra})


def check(cfg, items, src, **kw):
    return check_items(items, src, cfg["capacity"], overlong=cfg["overlong"], layout=cfg["layout"],
                       rows_per_item=cfg["rows_per_item"], mask_first_label=cfg.get("mask_first_label", True), **kw)


@settings(max_examples=60, deadline=None)
@given(cfg=config)
def test_every_piece_delivered_exactly_once(cfg):
    src, ds = build(cfg)
    items = list(ds)
    check(cfg, items, src)  # by example_ids and by content; items == pack_sequences of their rows
    stats = ds.stats
    assert stats["examples"] == len(src) and stats["items"] == len(items)
    assert stats["tokens"] == sum(len(ids) for ids, _ in expected_pieces(src, cfg["capacity"], cfg["overlong"]).values())


@pytest.mark.parametrize("layout", ["padded", "flat"])
def test_default_items_hold_only_model_keys(layout):
    src = source_of(1, 50, 40, "numpy", labels=True)
    items = list(PackedIterableDataset(src, 64, buffer_size=16, layout=layout))
    assert all(set(item) == MODEL_KEYS for item in items)
    check_items(items, src, 64, layout=layout, with_ids=False)
    if layout == "padded":
        assert all(item["input_ids"].shape == (1, 64) for item in items)


@settings(max_examples=40, deadline=None)
@given(cfg=config, stop=st.floats(0, 1), json_state=st.booleans())
def test_resume_mid_epoch_delivers_the_rest_exactly_once(cfg, stop, json_state):
    src, ds = build(cfg)
    full = list(ds)
    k = int(stop * len(full))
    _, first = build(cfg)
    it = iter(first)
    head = [next(it) for _ in range(k)]
    state = first.state_dict()
    if json_state:
        state = json.loads(json.dumps(state))  # ints and lists only: no tokens
    _, second = build(cfg)
    second.load_state_dict(state)
    tail = list(second)
    check(cfg, head + tail, src)
    # The resumed stream is the uninterrupted one, item for item.
    assert len(head) + len(tail) == len(full)
    assert all(same_item(a, b) for a, b in zip(head + tail, full))


def test_resume_through_a_dataloader_with_changed_buffer_size():
    src = source_of(7, 400, 100, "list", labels=True)
    ds = PackedIterableDataset(src, 128, buffer_size=64, rows_per_item=2, return_example_ids=True)
    loader = iter(DataLoader(ds, batch_size=None))
    head = [next(loader) for _ in range(25)]
    state = ds.state_dict()
    assert 0 < state["next_position"] < len(src)
    # Anything but the source, capacity, over-long policy and sharding may change on resume.
    resumed = PackedIterableDataset(src, 128, buffer_size=20, rows_per_item=2, carry_threshold=0.5,
                                    return_example_ids=True, algorithm="ffd")
    resumed.load_state_dict(state)
    tail = list(DataLoader(resumed, batch_size=None))
    check_items(head + tail, src, 128, rows_per_item=2)


class Reiterable:
    """A re-iterable stream without __len__ that records the epochs it was asked for."""

    def __init__(self, examples):
        self.examples, self.epochs = examples, []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        return iter(self.examples)


def make_source(kind, examples):
    if kind == "list":
        return examples
    if kind == "factory":
        return lambda: iter(examples)
    if kind == "generator":
        return (ex for ex in examples)  # one-shot: a fresh one is passed on resume
    if kind == "reiterable":
        return Reiterable(examples)
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_list(examples)
    if kind == "hf_dataset":
        return table
    if kind == "hf_iterable":
        return table.to_iterable_dataset(num_shards=2)
    if kind == "hf_iterable_shuffled":
        return table.to_iterable_dataset(num_shards=4).shuffle(seed=3, buffer_size=16)
    raise AssertionError(kind)


KINDS = ["list", "factory", "generator", "reiterable", "hf_dataset", "hf_iterable", "hf_iterable_shuffled"]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_every_source_kind(kind):
    examples = make_examples(11, 150, 60, labels=True)
    kw = dict(buffer_size=32, return_example_ids=True)
    ds = PackedIterableDataset(make_source(kind, examples), 96, **kw)
    ds.set_epoch(1)  # a shuffled HF stream reads another order in epoch 1; resume must read that one again
    it = iter(DataLoader(ds, batch_size=None))
    head = [next(it) for _ in range(20)]
    state = ds.state_dict()
    assert state["epoch"] == 1
    resumed = PackedIterableDataset(make_source(kind, examples), 96, **kw)
    resumed.load_state_dict(state)
    tail = list(resumed)
    if kind == "hf_iterable_shuffled":  # positions are positions in the stream: epoch 1's order
        stream = make_source(kind, examples)
        stream.set_epoch(1)
        examples = [{"input_ids": ex["input_ids"], "labels": ex["labels"]} for ex in stream]
        assert [ex["input_ids"] for ex in examples] != [ex["input_ids"] for ex in make_examples(11, 150, 60, labels=True)]
    check_items(head + tail, examples, 96)


@pytest.mark.parametrize("kind", ["list", "factory", "hf_dataset", "hf_iterable"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_workers_deliver_each_example_once(kind, num_workers):
    examples = make_examples(3, 300, 80, labels=True)
    ds = PackedIterableDataset(make_source(kind, examples), 128, buffer_size=24, rows_per_item=2,
                               return_example_ids=True)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers,
                        multiprocessing_context="fork" if num_workers else None)
    items = list(loader)
    check_items(items, examples, 128, rows_per_item=2)


def test_ranks_and_workers_shard_the_source():
    examples = make_examples(4, 200, 50)
    items = []
    for rank in range(2):
        ds = PackedIterableDataset(examples, 64, buffer_size=16, rank=rank, world_size=2, return_example_ids=True)
        mine = list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
        ids = {i for item in mine for i in item["example_ids"]}
        assert {i % 4 for i in ids} == {2 * rank, 2 * rank + 1}  # shard = rank * num_workers + worker, of 4
        items += mine
    check_items(items, examples, 64)


def test_per_worker_state_resumes_each_worker(monkeypatch):
    """What a per-worker checkpointing loader (torchdata's StatefulDataLoader) does: state_dict() inside
    each worker, load_state_dict() into that worker's copy before it iterates again."""
    import types

    examples = make_examples(13, 150, 40, labels=True)
    items = []
    for worker in range(3):
        monkeypatch.setattr(torch.utils.data, "get_worker_info",
                            lambda w=worker: types.SimpleNamespace(id=w, num_workers=3))
        ds = PackedIterableDataset(examples, 64, buffer_size=12, rows_per_item=2, return_example_ids=True)
        it = iter(ds)
        items += [next(it) for _ in range(3)]
        state = ds.state_dict()
        assert (state["shard"], state["num_shards"]) == (worker, 3)
        resumed = PackedIterableDataset(examples, 64, buffer_size=12, rows_per_item=2, return_example_ids=True)
        resumed.load_state_dict(state)
        items += list(resumed)
    check_items(items, examples, 64, rows_per_item=2)


def test_persistent_workers_serve_every_epoch():
    examples = make_examples(14, 120, 40)
    ds = PackedIterableDataset(examples, 64, buffer_size=16, return_example_ids=True)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context="fork")
    for _ in range(2):
        check_items(list(loader), examples, 64)


def test_array_and_tensor_sources_of_bare_rows():
    rows = np.random.default_rng(15).integers(1, 1000, (40, 12))
    for source in (rows, torch.from_numpy(rows)):
        items = list(PackedIterableDataset(source, 32, buffer_size=8, return_example_ids=True))
        check_items(items, [list(r) for r in rows], 32)
        assert all(item["input_ids"].shape == (1, 32) for item in items)


@settings(max_examples=40, deadline=None)  # was 15 (audit, issue 27)
@given(seed=st.integers(0, 2**32 - 1), world=st.integers(2, 4), stop=st.floats(0, 1))
def test_each_rank_resumes_its_own_shard(seed, world, stop):
    examples = make_examples(seed, 120, 40)
    items = []
    for rank in range(world):
        kw = dict(buffer_size=8, rank=rank, world_size=world, return_example_ids=True)
        ds = PackedIterableDataset(examples, 48, **kw)
        full = list(PackedIterableDataset(examples, 48, **kw))
        it = iter(ds)
        head = [next(it) for _ in range(int(stop * len(full)))]
        resumed = PackedIterableDataset(examples, 48, **kw)
        resumed.load_state_dict(ds.state_dict())
        tail = list(resumed)
        assert all(same_item(a, b) for a, b in zip(head + tail, full)) and len(head) + len(tail) == len(full)
        items += head + tail
    check_items(items, examples, 48)


def test_flush_at_the_end_pads_the_last_item():
    examples = make_examples(5, 5, 20, min_len=20)  # one example per row: 5 rows
    items = list(PackedIterableDataset(examples, 32, buffer_size=1000, rows_per_item=4, return_example_ids=True))
    check_items(items, examples, 32, rows_per_item=4)
    assert [item["input_ids"].shape for item in items] == [(4, 32), (4, 32)]
    # static shape: empty rows fill the last item (its one row is any example: rows come in a seeded order)
    assert len(items[-1]["example_ids"][0]) == 1 and items[-1]["example_ids"][1:] == [[], [], []]
    assert (items[-1]["input_ids"][1:] == 0).all() and (items[-1]["labels"][1:] == -100).all()
    flat = list(PackedIterableDataset(examples, 32, buffer_size=2, rows_per_item=4, layout="flat"))
    assert [item["input_ids"].shape for item in flat] == [(1, 80), (1, 20)]  # flat: no padding
    one = list(PackedIterableDataset([[5, 6, 7]], 8, return_example_ids=True))
    assert len(one) == 1 and one[0]["input_ids"].tolist() == [[5, 6, 7, 0, 0, 0, 0, 0]]
    assert one[0]["labels"].tolist() == [[-100, 6, 7, -100, -100, -100, -100, -100]]
    assert list(PackedIterableDataset([], 8)) == []


def test_efficiency_on_a_long_stream_of_short_examples():
    rng = np.random.default_rng(0)
    examples = [rng.integers(1, 1000, int(n)) for n in rng.integers(16, 257, 5000)]
    tokens = sum(len(e) for e in examples)
    for buffer_size in (64, 512):
        ds = PackedIterableDataset(examples, 2048, buffer_size=buffer_size)
        rows = sum(item["input_ids"].shape[0] for item in ds)
        assert rows >= -(-tokens // 2048)
        assert tokens / (rows * 2048) >= 0.98, (buffer_size, tokens / (rows * 2048))
        assert ds.state_dict()["stats"]["items"] == 0  # after the pass: the start of the next epoch
        assert ds.stats["rows"] == rows


def test_epochs_and_set_epoch():
    examples = make_examples(8, 40, 30)
    source = Reiterable(examples)
    ds = PackedIterableDataset(source, 32, buffer_size=8, return_example_ids=True)
    first, second = list(ds), list(ds)
    assert source.epochs == [0, 1]
    check_items(first, examples, 32)
    check_items(second, examples, 32)
    assert ds.state_dict()["epoch"] == 2 and ds.state_dict()["next_position"] == 0
    ds.set_epoch(5)
    list(ds)
    assert source.epochs[-1] == 5
    # A state taken right after the last item resumes to an empty rest of that epoch.
    ds = PackedIterableDataset(examples, 32, buffer_size=8)
    it = iter(ds)
    n = sum(1 for _ in range(len(first)) if next(it) is not None)
    state = ds.state_dict()
    resumed = PackedIterableDataset(examples, 32, buffer_size=8)
    resumed.load_state_dict(state)
    assert n == len(first) and list(resumed) == []
    assert resumed.state_dict()["epoch"] == 1


def test_zero_length_and_dropped_examples_are_counted_not_delivered():
    examples = [[1, 2], [], [3] * 20, [4, 5, 6], []]
    ds = PackedIterableDataset(examples, 8, overlong="drop", return_example_ids=True)
    items = list(ds)
    check_items(items, examples, 8, overlong="drop")
    ds = PackedIterableDataset(examples, 8, overlong="drop")
    it = iter(ds)
    next(it)
    stats = ds.state_dict()["stats"]
    assert (stats["examples"], stats["zero_length"], stats["dropped"]) == (5, 2, 1)


def test_state_holds_positions_not_tokens():
    examples = make_examples(9, 2000, 200, form="numpy")
    ds = PackedIterableDataset(examples, 512, buffer_size=256)
    it = iter(ds)
    for _ in range(50):
        next(it)
    state = ds.state_dict()
    text = json.dumps(state)
    assert len(text) < 20_000
    assert set(state) == {"format", "epoch", "shard", "num_shards", "next_position", "capacity", "overlong",
                          "carry", "ready", "stats", "pad_to_multiple_of"}
    assert len(state["carry"]) <= 128 and all(len(p) == 3 for p in state["carry"])


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(capacity=0), ValueError, "capacity must be a positive integer"),
    (dict(capacity=-5), ValueError, "capacity must be a positive integer"),
    (dict(capacity=8.0), TypeError, "capacity must be a positive integer"),
    (dict(buffer_size=0), ValueError, "buffer_size must be a positive integer"),
    (dict(algorithm="best"), ValueError, "unknown algorithm 'best'"),
    (dict(overlong="wrap"), ValueError, "unknown overlong policy 'wrap'"),
    (dict(layout="ragged"), ValueError, "unknown layout 'ragged'"),
    (dict(rows_per_item=0), ValueError, "rows_per_item must be a positive integer"),
    (dict(carry_threshold=1.5), ValueError, "carry_threshold must be a number in"),
    (dict(max_carry=-1), ValueError, "max_carry must be a non-negative int"),
    (dict(buffer_size=4, max_carry=4), ValueError, "max_carry must be < buffer_size"),
    (dict(max_carries=-1), ValueError, "max_carries must be"),
    (dict(rank=0), ValueError, "pass both rank and world_size"),
    (dict(rank=2, world_size=2), ValueError, r"rank must be an int in \[0, world_size=2\)"),
    (dict(pad_token_id=0.5), TypeError, "pad_token_id must be an int"),
    (dict(source="some text"), TypeError, "source must be an iterable of examples"),
    (dict(source=42), TypeError, "source must be an iterable of examples"),
    (dict(source={"input_ids": [1]}), TypeError, "source must be an iterable of examples"),
])
def test_bad_arguments(kwargs, error, message):
    args = {"source": [[1, 2]], "capacity": 8, **kwargs}
    with pytest.raises(error, match=message):
        PackedIterableDataset(args.pop("source"), args.pop("capacity"), **args)


@pytest.mark.parametrize("bad, error, message", [
    ({"text": "hello"}, ValueError, r"example 2 has no 'input_ids' key \(keys: 'text'\)"),
    ({"input_ids": [1.0, 2.0]}, TypeError, "example 2: input_ids must be integer token ids, got dtype float64"),
    ({"input_ids": [1, "a"]}, TypeError, "example 2: input_ids must be integer token ids"),
    ({"input_ids": [True, False]}, TypeError, "example 2: input_ids must be integer token ids"),
    ({"input_ids": torch.ones(3)}, TypeError, "example 2: input_ids must be integer token ids, got a tensor"),
    ({"input_ids": [[1, 2], [3, 4]]}, ValueError, "example 2: input_ids must be 1-D"),
    ({"input_ids": "hello"}, TypeError, "example 2: input_ids is a str; examples must be tokenized"),
    ({"input_ids": [1, 2, 3], "labels": [1, 2]}, ValueError, "example 2 has 3 input_ids but 2 labels"),
    (7, TypeError, "example 2 is a int"),
    (list(range(1, 40)), ValueError, r"example 2 has 39 tokens, more than capacity=16; pass overlong="),
])
def test_bad_examples_name_their_position(bad, error, message):
    examples = [{"input_ids": [1, 2]}, {"input_ids": [3]}, bad, {"input_ids": [4]}]
    ds = PackedIterableDataset(examples, 16)
    with pytest.raises(error, match=message):
        list(ds)


def test_bad_example_in_a_worker_is_reraised_with_its_position():
    examples = [{"input_ids": [1, 2]}, {"input_ids": [3]}, {"input_ids": [1.5]}, {"input_ids": [4]}]
    it = iter(DataLoader(PackedIterableDataset(examples, 16), batch_size=None, num_workers=2,
                         multiprocessing_context="fork"))
    try:
        with pytest.raises(TypeError, match="example 2: input_ids must be integer token ids"):
            list(it)
    finally:
        it._shutdown_workers()  # else torch waits ~10 s for the workers when the iterator is collected


def test_state_after_an_error_loses_nothing():
    examples = make_examples(16, 30, 10) + [{"input_ids": [1.5]}] + make_examples(17, 30, 10)
    ds = PackedIterableDataset(examples, 16, buffer_size=8, return_example_ids=True)
    items = []
    with pytest.raises(TypeError, match="example 30"):
        for item in ds:
            items.append(item)
    state = ds.state_dict()
    assert state["next_position"] == 30  # the bad example is read again on resume
    examples[30] = {"input_ids": [7, 7]}  # fixed in the source
    resumed = PackedIterableDataset(examples, 16, buffer_size=8, return_example_ids=True)
    resumed.load_state_dict(state)
    check_items(items + list(resumed), examples, 16)


def test_input_key_and_missing_labels():
    examples = [{"tokens": [1, 2, 3]}, {"tokens": [4, 5], "target": [9, 9]}]
    items = list(PackedIterableDataset(examples, 8, input_key="tokens", label_key="target"))
    assert items[0]["labels"].tolist() == [[-100, 2, 3, -100, 9, -100, -100, -100]]


def test_bad_states():
    examples = make_examples(2, 30, 20)
    ds = PackedIterableDataset(examples, 32, buffer_size=8)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    with pytest.raises(ValueError, match="not a PackedIterableDataset state"):
        ds.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="capacity=32, overlong='error' but this dataset has capacity=64"):
        PackedIterableDataset(examples, 64).load_state_dict(state)
    with pytest.raises(ValueError, match="state pieces must be"):
        PackedIterableDataset(examples, 32).load_state_dict({**state, "ready": [[[1, -2]]]})
    # A state of shard 1 of 2 cannot resume an unsharded pass.
    sharded = PackedIterableDataset(examples, 32, rank=1, world_size=2)
    it = iter(sharded)
    next(it)
    plain = PackedIterableDataset(examples, 32)
    plain.load_state_dict(sharded.state_dict())
    with pytest.raises(ValueError, match="saved by shard 1 of 2 but this pass is shard 0 of 1"):
        list(plain)
    # The state names examples the source no longer has.
    short = PackedIterableDataset(examples[:2], 32)
    short.load_state_dict({**state, "carry": [], "ready": [[[25, 0]]], "next_position": 26})
    with pytest.raises(ValueError, match="next_position is 26 but the source has 2 examples"):
        list(short)


def test_one_shot_iterator_serves_one_pass():
    examples = make_examples(6, 20, 10)
    ds = PackedIterableDataset(iter(examples), 16, return_example_ids=True)
    check_items(list(ds), examples, 16)
    with pytest.raises(TypeError, match="one-shot iterator"):
        list(ds)


def test_matches_tokenized_hf_pipeline():
    """Examples straight from an HF tokenizer + datasets pipeline: dicts with extra columns."""
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(12)
    rows = [{"input_ids": rng.integers(1, 1000, int(n)).tolist(), "attention_mask": [1] * int(n), "text": "x"}
            for n in rng.integers(1, 70, 120)]
    table = datasets.Dataset.from_list(rows).with_format("torch")
    with pytest.raises(ValueError, match="field 'text' is not per-token"):  # unknown columns are never dropped silently
        list(PackedIterableDataset(table, 128, buffer_size=40))
    items = list(PackedIterableDataset(table, 128, buffer_size=40, return_example_ids=True, extra_fields="drop"))
    check_items(items, [{"input_ids": r["input_ids"]} for r in rows], 128)
    assert "attention_mask" not in items[0] and "text" not in items[0]
    assert all(isinstance(as_array(item["input_ids"]), np.ndarray) for item in items)


def test_set_epoch_mid_pass_keeps_or_resets_the_resume_point():
    """set_epoch to the pass's own epoch keeps where it stands; another epoch starts that epoch from its first
    example (kills a mutmut survivor that swapped the two; docs/mutation.md)."""
    examples = make_examples(3, 40, 30)
    ds = PackedIterableDataset(examples, 32, buffer_size=8)
    it = iter(ds)
    next(it), next(it)
    mid = ds.state_dict()
    assert mid["epoch"] == 0 and mid["next_position"] > 0
    ds.set_epoch(0)
    assert ds.state_dict() == mid
    ds.set_epoch(3)
    fresh = ds.state_dict()
    assert fresh["epoch"] == 3 and fresh["next_position"] == 0
