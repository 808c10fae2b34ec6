"""Proof on a real HF model: packed batches give the loss and gradients of unpacked training.

A tiny randomly initialised LlamaForCausalLM (no download), SDPA attention, called with
``use_cache=False``: with a KV cache transformers skips its packed-sequence detection and packed
documents would attend to each other.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packkit

transformers = pytest.importorskip("transformers")
CAPACITY = 48


def tiny_llama(seed=0, attn="sdpa"):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      use_cache=False, attn_implementation=attn)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.config.use_cache = False
    return model


def sequences(seed=0):
    rng = np.random.default_rng(seed)
    lengths = [2, CAPACITY, 17, 5, 31, 9, 44, 3, 23]  # a 2-token sequence and one of exactly capacity
    return [rng.integers(1, 97, n).tolist() for n in lengths]


def loss_and_grads(model, run):
    model.zero_grad(set_to_none=True)
    loss = run()
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def unpacked_reference(model, seqs):
    """Each sequence alone; per-token mean over the whole batch (sum of token losses / token count)."""
    def run():
        total, count = 0.0, 0
        for s in seqs:
            ids = torch.tensor([s])
            out = model(input_ids=ids, labels=ids, use_cache=False)
            total = total + out.loss * (len(s) - 1)
            count += len(s) - 1
        return total / count
    return loss_and_grads(model, run)


def assert_close(a, b, rel=1e-5):
    scale = max(float(b.abs().max()), 1e-12)
    assert float((a - b).abs().max()) <= rel * scale + 1e-7, (float((a - b).abs().max()), scale)


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
