"""packkit.pack_dataset as a drop-in for TRL's packing: SFTTrainer(padding_free=True) and a plain HF Trainer
train a tiny random Llama on CPU (no downloads: the tokenizer is built here with ``tokenizers``).

Every source sequence counts up by one token id (mod the vocabulary) from a random start: the loss can fall
within 10 steps, and a position_ids segment that spans two documents shows as a break in the count.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packkit

pytestmark = pytest.mark.full

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = 64
SEQ_LENGTH = 64


def tiny_tokenizer(tmp_path):
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(tmp_path / "tok")  # a local folder, as a user's tokenizer would be
    return transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      use_cache=False, attn_implementation="sdpa", pad_token_id=0)
    return transformers.LlamaForCausalLM(config)


def counting_dataset(n=160, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 40, n)
    starts = rng.integers(2, VOCAB, n)
    rows = [(2 + (s - 2 + np.arange(k)) % (VOCAB - 2)).tolist() for s, k in zip(starts, lengths)]
    return datasets.Dataset.from_dict({"input_ids": rows})


def restarts_ok(ids, pos):
    """Positions restart at 0 in every document: inside a positions run the ids count up by one."""
    ids, pos = np.asarray(ids).reshape(-1), np.asarray(pos).reshape(-1)
    assert pos[0] == 0
    inside = pos[1:] != 0
    step = (ids[1:] - 2 - (ids[:-1] - 2 + 1)) % (VOCAB - 2)
    return bool((step[inside] == 0).all()) and bool((np.diff(pos)[inside] == 1).all())


class Spy:
    """Records the position_ids/input_ids the model is called with."""

    def __init__(self, model):
        self.calls = []
        model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.calls.append((kwargs["input_ids"].clone(), kwargs.get("position_ids")))


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_sft_trainer_padding_free_on_packkit_dataset(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path)
    packed = packkit.pack_dataset(counting_dataset(), SEQ_LENGTH)
    model = tiny_llama()
    spy = Spy(model)
    args = trl.SFTConfig(output_dir=str(tmp_path / "sft"), packing=False, padding_free=True, max_length=None,
                         per_device_train_batch_size=2, max_steps=10, learning_rate=1e-2, logging_steps=1,
                         report_to=[], save_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=packed, processing_class=tokenizer)
    # the collator TRL picked reads seq_lengths: positions restart at every segment of the rows
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    expected = np.concatenate([np.arange(n) for i in range(3) for n in packed[i]["seq_lengths"]])
    assert np.array_equal(batch["position_ids"].reshape(-1).numpy(), expected)
    assert (batch["labels"].reshape(-1)[torch.from_numpy(expected == 0)] == -100).all()
    trainer.train()
    loss = losses(trainer)
    assert len(loss) == 10 and np.mean(loss[-3:]) < 0.8 * np.mean(loss[:3]), loss
    assert len(spy.calls) >= 10
    for ids, pos in spy.calls:
        assert pos is not None and int((pos == 0).sum()) > 1  # several documents per batch, each restarting
        assert restarts_ok(ids, pos)


def test_control_restart_check_fails_without_seq_lengths():
    """The restart check can fail: rows without seq_lengths get one position run across documents."""
    packed = packkit.pack_dataset(counting_dataset(), SEQ_LENGTH)
    collate = trl.trainer.sft_trainer.DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    rows = [{"input_ids": packed[i]["input_ids"]} for i in range(3)]
    batch = collate(rows)
    assert not restarts_ok(batch["input_ids"], batch["position_ids"])


def test_hf_trainer_with_packing_collator(tmp_path):
    packed = packkit.pack_dataset(counting_dataset(), SEQ_LENGTH)
    model = tiny_llama()
    spy = Spy(model)
    collate = packkit.PackedRowsCollator(packkit.PackingCollator(return_num_items=True))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=2, max_steps=10,
                                          learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no",
                                          use_cpu=True, remove_unused_columns=False, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=packed, data_collator=collate)
    trainer.train()
    loss = losses(trainer)
    assert len(loss) == 10 and np.mean(loss[-3:]) < 0.8 * np.mean(loss[:3]), loss
    for ids, pos in spy.calls:
        assert restarts_ok(ids, pos)
    with pytest.raises(ValueError, match="no 'seq_lengths'"):
        collate([{"input_ids": [1, 2, 3]}])
