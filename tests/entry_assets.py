"""What the trainer entry-point tests (tests/test_*_entry.py) train on, made offline in the test: alpaca-style samples
in a local json, a byte-level BPE tokenizer trained on them with ``tokenizers``, and a tiny random-init causal LM
saved from a config (no hub path anywhere). Imports only numpy at module level: every trainer venv has the rest."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
WORDS = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"] + ["the", "and", "of", "to", "in"]
START_LINE = re.compile(r"packkit: (\d+) steps on (\d+) ranks, balance ([0-9.]+), efficiency ([0-9.]+)")


def alpaca_samples(n: int = 240, seed: int = 0) -> list[dict]:
    """``n`` alpaca records; response lengths lognormal (a few words to ~150), so rows pack several samples."""
    rng = np.random.default_rng(seed)

    def text(k):
        return " ".join(rng.choice(WORDS, int(k)))

    out = []
    for _ in range(n):
        k = int(np.clip(np.round(np.exp(rng.normal(np.log(25), 0.8))), 2, 150))
        out.append({"instruction": text(rng.integers(2, 12)), "input": text(rng.integers(0, 6)), "output": text(k)})
    return out


def write_dataset(path: Path, n: int = 240, seed: int = 0) -> list[dict]:
    samples = alpaca_samples(n, seed)
    path.write_text(json.dumps(samples))
    return samples


def train_tokenizer(samples: list[dict], vocab_size: int = 320):
    """A byte-level BPE tokenizer trained on the samples (``tokenizers``, offline), as a transformers fast
    tokenizer with bos ``<s>``, eos ``</s>``, pad ``<pad>`` and the chat markers Qwen templates use."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [" ".join(s.values()) for s in samples]
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=SPECIALS[4:])


def save_tiny_model(path: Path, tokenizer, family: str = "llama", seed: int = 0) -> None:
    """A random-init 2-layer causal LM (hidden 64) and its tokenizer, saved to ``path`` (fp32)."""
    import torch
    import transformers

    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    config = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[family](**common)
    torch.manual_seed(seed)
    model = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[family](config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> str:
    """Run a trainer's own command line; its stdout + stderr (raises with the tail on a non-zero exit)."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "WANDB_DISABLED": "true", "WANDB_MODE": "disabled", "DO_NOT_TRACK": "1", "AXOLOTL_DO_NOT_TRACK": "1",
                "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "CUDA_VISIBLE_DEVICES": "", **(env or {}),
                # as in an activated venv: trainers launch their own console scripts (axolotl: accelerate) by name
                "PATH": f"{Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if proc.returncode:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-6000:]}")
    return proc.stdout


def start_lines(output: str) -> list[tuple[int, int, float, float]]:
    """Every ``packkit: N steps on R ranks, balance B, efficiency E`` line of a trainer's output."""
    return [(int(n), int(r), float(b), float(e)) for n, r, b, e in START_LINE.findall(output)]


def bin_of(python: str, name: str) -> str:
    """The console script ``name`` beside ``python`` (the venv's own)."""
    return str(Path(python).parent / name)


PYTHON = sys.executable
