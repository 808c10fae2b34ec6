"""TRL's SFTTrainer on a dataset packed by packkit.pack_dataset (TRL's pre-packed format).

    python examples/trl_sft_pack_dataset.py

packkit plans the whole dataset at once and writes one row per packed row plus `seq_lengths`; TRL's
padding-free collator restarts `position_ids` at every document. The tokenizer and the model are built
here (tiny, random): nothing is downloaded.
"""
from __future__ import annotations

import tempfile

import datasets
import numpy as np
import tokenizers
import torch
import transformers
import trl

import packkit

VOCAB, SEQ_LENGTH = 64, 64


def tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def counting_dataset(n: int = 160, seed: int = 0) -> datasets.Dataset:
    """Token ids that count up by one from a random start: learnable in a few steps."""
    rng = np.random.default_rng(seed)
    rows = [(2 + (s - 2 + np.arange(k)) % (VOCAB - 2)).tolist()
            for s, k in zip(rng.integers(2, VOCAB, n), rng.integers(4, 40, n))]
    return datasets.Dataset.from_dict({"input_ids": rows})


def main() -> list[float]:
    torch.manual_seed(0)
    packed, report = packkit.pack_dataset(counting_dataset(), SEQ_LENGTH, return_report=True)
    print(f"packed {report.sequences} sequences into {len(packed)} rows of {SEQ_LENGTH} "
          f"(efficiency {report.efficiency:.3f})")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, use_cache=False, pad_token_id=0))
    with tempfile.TemporaryDirectory() as out:
        args = trl.SFTConfig(output_dir=out, packing=False, padding_free=True, max_length=None,
                             per_device_train_batch_size=2, max_steps=10, learning_rate=1e-2, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0)
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=packed, processing_class=tiny_tokenizer())
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(f"steps {len(losses)}  first loss {np.mean(losses[:3]):.3f}  last loss {np.mean(losses[-3:]):.3f}")
    return losses


if __name__ == "__main__":
    main()
