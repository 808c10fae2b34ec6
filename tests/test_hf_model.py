"""Proof on a real HF model: packed batches give the loss and gradients of unpacked training.

A tiny randomly initialised LlamaForCausalLM (no download, tests/llama_helpers.py), SDPA attention,
called with ``use_cache=False``: with a KV cache transformers skips its packed-sequence detection and
packed documents would attend to each other. Other attention paths, bf16 and the GPU:
tests/test_training_semantics.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packkit

from llama_helpers import CAPACITY, assert_close, loss_and_grads, sequences, tiny_llama, unpacked_reference

pytestmark = pytest.mark.core

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_packed_loss_and_gradients_equal_unpacked(layout):
    model = tiny_llama()
    seqs = sequences()
    ref_loss, ref_grads = unpacked_reference(model, seqs)
    collate = packkit.PackingCollator(CAPACITY, layout=layout, num_rows=7 if layout == "padded" else None)
    batch = collate([{"input_ids": s} for s in seqs])
    if layout == "padded":
        assert batch["input_ids"].shape == (7, CAPACITY)  # with extra all-padding rows
    loss, grads = loss_and_grads(model, lambda: model(**batch, use_cache=False).loss)
    assert_close(loss, ref_loss)
    for name, g in grads.items():
        assert_close(g, ref_grads[name])


def test_packing_without_document_masking_would_differ():
    """The check above can fail: hiding the boundaries (one long document) moves the gradients far
    beyond its tolerance (the loss of a random-init model moves less, ~5e-5 relative)."""
    model = tiny_llama()
    seqs = sequences()
    _, ref_grads = unpacked_reference(model, seqs)
    batch = packkit.PackingCollator()([{"input_ids": s} for s in seqs])
    position_ids = torch.arange(batch["input_ids"].shape[1])[None]
    _, grads = loss_and_grads(model, lambda: model(input_ids=batch["input_ids"], labels=batch["labels"],
                                                      position_ids=position_ids, use_cache=False).loss)
    worst = max(float((g - ref_grads[n]).abs().max()) / float(ref_grads[n].abs().max()) for n, g in grads.items())
    assert worst > 100 * 1e-5


def test_trainer_runs_20_steps_and_loss_decreases(tmp_path):
    model = tiny_llama(seed=1)
    rng = np.random.default_rng(0)
    # A learnable synthetic task: every sequence counts upwards from a random start.
    data = []
    for _ in range(400):
        n = int(rng.integers(4, 40))
        start = int(rng.integers(1, 50))
        data.append({"input_ids": [(start + i) % 96 + 1 for i in range(n)]})
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=16, max_steps=20,
                                          learning_rate=3e-3, logging_steps=1, save_strategy="no", report_to=[],
                                          remove_unused_columns=False, use_cpu=True, dataloader_num_workers=0,
                                          disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   data_collator=packkit.PackingCollator(128, layout="padded"))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 20
    assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses
