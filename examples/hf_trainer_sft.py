"""Supervised fine-tuning with the HF Trainer and packkit.PackingCollator on a tiny random Llama.

    python examples/hf_trainer_sft.py

Each example's tokens count up by one from a random start, so a model that sees its documents
separately (positions restart at every document) learns the rule in a few steps. The collator packs
each batch of examples into rows of 128 tokens; no attention_mask, no padding inside a document.
"""
from __future__ import annotations

import tempfile

import numpy as np
import torch
import transformers

import packkit

VOCAB, CAPACITY = 64, 128


def counting_examples(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"input_ids": (2 + (start + np.arange(length)) % (VOCAB - 2)).tolist()}
            for start, length in zip(rng.integers(0, VOCAB, n), rng.integers(4, 40, n))]


def main() -> list[float]:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, use_cache=False))
    collate = packkit.PackingCollator(CAPACITY, layout="padded", return_num_items=True)
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=16, max_steps=20,
                                              learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no",
                                              use_cpu=True, seed=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=counting_examples(400),
                                       data_collator=collate)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(f"steps {len(losses)}  first loss {np.mean(losses[:3]):.3f}  last loss {np.mean(losses[-3:]):.3f}")
    return losses


if __name__ == "__main__":
    main()
