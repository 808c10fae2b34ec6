"""packkit's LLaMA-Factory drop-in against LLaMA-Factory 0.9.5 itself (runs in .ci/trainers/llamafactory.sh's venv,
skipped where llamafactory is not importable):

* rows equal, column for column, what ``PackedSupervisedDatasetProcessor`` writes for the same row membership;
* ``pack_dataset``: every example exactly once (hypothesis), document ids past int8 kept;
* exactness through ``SFTDataCollatorWith4DAttentionMask`` (``neat_packing``'s 4-D block mask, eager attention):
  a tiny fp64 Llama's summed loss and gradients over the packed rows equal the per-example runs (rel <= 1e-9),
  with a control (the same rows under a plain causal mask) that the check catches;
* ``install()``: the dataset loader path (``get_dataset``) and the trainer's sampler, restored by ``uninstall()``.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

collator_mod = pytest.importorskip("llamafactory.data.collator")
datasets = pytest.importorskip("datasets")
from llamafactory.data.processor.supervised import PackedSupervisedDatasetProcessor  # noqa: E402
from llamafactory.data.template import TEMPLATES  # noqa: E402
from llamafactory.hparams import DataArguments  # noqa: E402

from packkit.integrations import llamafactory as lf  # noqa: E402

IGNORE = -100
VOCAB = 64


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def examples(lengths, seed=0):
    """Unpacked examples as SupervisedDatasetProcessor writes them; token 3 + i % 60 opens example i."""
    rng = np.random.default_rng(seed)
    out = {"input_ids": [], "attention_mask": [], "labels": [], "images": [], "videos": [], "audios": []}
    for i, n in enumerate(lengths):
        ids = [3 + i % 60] + rng.integers(3, VOCAB, n - 1).tolist()
        prompt = int(rng.integers(1, n + 1))  # the first label is always a prompt token, as with LF's templates
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * n)
        out["labels"].append([IGNORE] * prompt + ids[prompt:])
        for m in ("images", "videos", "audios"):
            out[m].append(None)
    return out


@pytest.mark.parametrize("neat", [True, False])
def test_rows_equal_llamafactorys_processor(neat):
    lengths = [17, 5, 30, 9, 12, 3, 26, 8, 21, 14]
    ex = examples(lengths)
    args = DataArguments(cutoff_len=40, neat_packing=neat, packing=True)
    proc = PackedSupervisedDatasetProcessor(template=TEMPLATES["default"], tokenizer=tokenizer(), processor=None,
                                            data_args=args)
    proc._encode_data_example = lambda prompt, **_: (ex["input_ids"][prompt[0]], ex["labels"][prompt[0]])
    raw = {"_prompt": [[i] for i in range(len(lengths))], "_response": [[None]] * len(lengths),
           **{k: [None] * len(lengths) for k in ("_system", "_tools", "_images", "_videos", "_audios")}}
    theirs = proc.preprocess_dataset(raw)
    # their rows' membership, read back from the opening token of each document (position 0, not padding)
    rows = []
    for ids, pos in zip(theirs["input_ids"], theirs["position_ids"]):
        end = len(ids) - _padding(ids)  # real tokens are >= 3, padding is 0
        rows.append([ids[k] - 3 for k in range(end) if pos[k] == 0])
    assert args.cutoff_len == 39  # LLaMA-Factory takes one off with packing; its rows are cutoff_len + 1 long
    ours = lf.build_rows(ex, rows, cutoff_len=args.cutoff_len, neat_packing=neat, pad_token_id=0)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert {k: list(v) for k, v in theirs.items()} == ours


def _padding(ids):
    k = 0
    while k < len(ids) and ids[-1 - k] == 0:
        k += 1
    return k
