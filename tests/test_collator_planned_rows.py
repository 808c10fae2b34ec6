"""PackingCollator(planned_rows=True): rows planned once reach the model exactly as planned (issue 42 §2)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packkit
from packkit import PackingCollator

pytestmark = pytest.mark.core

CAPACITY = 64


def dataset(lengths, seed=0):
    """Every sample is distinct: its id ``i`` first, then counting tokens (so a row's samples can be read back)."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": [1000 + i] + rng.integers(2, 999, n - 1).tolist()} for i, n in enumerate(lengths)]


def rows_of(batch) -> list[list[int]]:
    """Each row's documents as sample ids (their first token), read from position_ids restarts and padding."""
    return [[t - 1000 for t, p in zip(ids, pos) if p == 0 and t >= 1000]
            for ids, pos in zip(batch["input_ids"].tolist(), batch["position_ids"].tolist())]


def row_tokens(batch) -> list[list[int]]:
    return [[t for t in row if t != 0] for row in batch["input_ids"].tolist()]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, CAPACITY), min_size=1, max_size=120), st.integers(1, 9),
       st.sampled_from(["obfd", "ffd", "nf", "ogbfd"]), st.booleans())
def test_rows_are_exactly_the_planned_rows(lengths, batch_rows, algorithm, pad_to_capacity):
    ds = dataset(lengths)
    rows = [b.tolist() for b in packkit.plan(lengths, CAPACITY, algorithm=algorithm, dp_size=3).bins]
    collate = PackingCollator(CAPACITY, layout="padded", planned_rows=True, pad_to_capacity=pad_to_capacity,
                              return_num_items=True)
    seen = []
    for start in range(0, len(rows), batch_rows):
        planned = rows[start:start + batch_rows]
        batch = collate([[ds[i] for i in row] for row in planned])
        assert batch["input_ids"].shape[0] == len(planned)  # one row per planned row, never re-planned
        assert rows_of(batch) == planned
        assert row_tokens(batch) == [[t for i in row for t in ds[i]["input_ids"]] for row in planned]
        assert int(batch["num_items_in_batch"]) == sum(len(ds[i]["input_ids"]) - 1 for r in planned for i in r)
        seen.extend(planned)
    assert seen == rows


def test_control_default_collator_replans_grouped_rows():
    """The issue's finding, which the checks above would catch: 8 planned rows handed to the plain padded collator
    come back as more rows, with other contents."""
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(288), 0.932, 400))), 1, 2048).astype(np.int64).tolist()
    ds = dataset(lengths)
    rows = [b.tolist() for b in packkit.plan(lengths, 2048, algorithm="ogbfd", dp_size=8, cost="attention").bins]
    replanned = given_rows = 0
    for start in range(0, len(rows) - 7, 8):
        planned = rows[start:start + 8]
        plain = PackingCollator(2048, layout="padded")([ds[i] for row in planned for i in row])
        replanned += plain["input_ids"].shape[0] != 8 or rows_of(plain) != planned
        given_rows += PackingCollator(2048, layout="padded", planned_rows=True)(
            [[ds[i] for i in row] for row in planned])["input_ids"].shape[0] == 8
    assert replanned > 0 and given_rows == len(rows) // 8


def test_flat_layout_keeps_rows_in_order_and_empty_rows_pad():
    ds = dataset([5, 3, 7, 2])
    batch = PackingCollator(16, planned_rows=True)([[ds[2], ds[0]], [ds[3]], [ds[1]]])
    assert rows_of(batch) == [[2, 0, 3, 1]]
    padded = PackingCollator(16, layout="padded", planned_rows=True)([[ds[2], ds[0]], [], [ds[1]]])
    assert rows_of(padded) == [[2, 0], [], [1]]
    assert (padded["input_ids"][1] == 0).all() and (padded["labels"][1] == -100).all()


def test_pre_packed_rows_from_pack_dataset():
    datasets = pytest.importorskip("datasets")
    lengths = np.random.default_rng(3).integers(1, 40, 90)
    ds = dataset(lengths)
    packed = packkit.pack_dataset(datasets.Dataset.from_dict({"input_ids": [d["input_ids"] for d in ds]}), CAPACITY,
                                  position_ids=True)
    rows = [packed[i] for i in range(len(packed))]
    for start in range(0, len(rows), 4):
        group = rows[start:start + 4]
        batch = PackingCollator(CAPACITY, layout="padded", planned_rows=True)(group)
        assert batch["input_ids"].shape[0] == len(group)
        for r, row in enumerate(group):
            n = len(row["input_ids"])
            assert batch["input_ids"][r, :n].tolist() == row["input_ids"]
            assert batch["position_ids"][r, :n].tolist() == row["position_ids"]  # restarts at every document


@pytest.mark.parametrize("features, error, match", [
    ([{"input_ids": [1, 2]}], TypeError, "feature 0 is a dict without 'seq_lengths'"),
    ([[{"input_ids": [1] * 10}, {"input_ids": [2] * 7}]], ValueError, "planned row 0 holds 17 tokens"),
    ([{"input_ids": [1, 2, 3], "seq_lengths": [1, 1]}], ValueError, "'input_ids' has 3 values but its seq_lengths"),
    ([{"input_ids": [1, 2], "seq_lengths": [3, -1]}], ValueError, "seq_lengths must be non-negative"),
    ([7], TypeError, "feature 0 is a int"),
])
def test_bad_planned_rows(features, error, match):
    with pytest.raises(error, match=match):
        PackingCollator(16, layout="padded", planned_rows=True)(features)


def test_bad_planned_rows_options():
    with pytest.raises(TypeError, match="planned_rows"):
        PackingCollator(16, planned_rows=1)
    with pytest.raises(ValueError, match="planned_rows=True does not support context_parallel"):
        PackingCollator(16, planned_rows=True, context_parallel=(2, 0))
    with pytest.raises(ValueError, match="needs 3 rows"):
        PackingCollator(16, layout="padded", num_rows=2, planned_rows=True)([[{"input_ids": [1]}]] * 3)


def test_hf_trainer_forwards_exactly_the_planned_rows(tmp_path):
    """Trainer(per_device_train_batch_size=3, gradient_accumulation_steps=2) on rows planned once: every row the
    model is called with is one planned row, each planned row once per epoch. Control: the plain padded collator
    on the same batches forwards other rows."""
    transformers = pytest.importorskip("transformers")
    from llama_helpers import tiny_llama

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 30, 24)
    ds = [{"input_ids": rng.integers(1, 97, n).tolist()} for n in lengths]  # no 0: the padding id
    rows = [b.tolist() for b in packkit.plan(lengths, 48, algorithm="ogbfd", dp_size=6, cost="attention").bins]
    planned = sorted(tuple(t for i in row for t in ds[i]["input_ids"]) for row in rows)

    def forwarded(collate):
        model = tiny_llama()
        calls = []
        model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].clone()), with_kwargs=True)
        args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3,
                                              gradient_accumulation_steps=2, num_train_epochs=1, report_to=[],
                                              save_strategy="no", use_cpu=True, logging_steps=1, seed=0,
                                              dataloader_num_workers=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=[[ds[i] for i in r] for r in rows],
                                       data_collator=collate)
        trainer.train()
        assert all(np.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)
        return sorted(tuple(t for t in row.tolist() if t != 0) for batch in calls for row in batch)

    assert forwarded(PackingCollator(48, layout="padded", planned_rows=True, return_num_items=True)) == planned

    class Flatten:  # the same batches of rows, handed to the re-planning collator
        collate = PackingCollator(48, layout="padded", return_num_items=True)

        def __call__(self, features):
            return self.collate([f for row in features for f in row])

    assert forwarded(Flatten()) != planned


def test_sampler_rows_through_a_dataloader_keep_their_steps():
    """PackedBatchSampler(rows_per_step=4)'s rows for one rank, 2 per micro-batch: each batch is 2 of its planned
    rows, in order, so every optimizer step (2 micro-batches) holds exactly the sampler's 4 rows of that step."""
    from torch.utils.data import DataLoader

    lengths = np.random.default_rng(2).integers(1, CAPACITY, 150)
    ds = dataset(lengths)
    sampler = packkit.PackedBatchSampler(lengths, CAPACITY, rank=1, world_size=2, rows_per_step=4, seed=3)
    rows = list(sampler)
    loader = DataLoader([[ds[i] for i in r] for r in rows], batch_size=2, shuffle=False,
                        collate_fn=PackingCollator(CAPACITY, layout="padded", planned_rows=True))
    got = [r for batch in loader for r in rows_of(batch)]
    assert got == rows and len(loader) == 2 * sampler.num_steps
