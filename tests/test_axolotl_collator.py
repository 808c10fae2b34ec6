"""AxolotlPackingCollator without axolotl: axolotl's items (bins of sample dicts) -> one flat row with per-document
positions and cu_seq_lens; what it refuses, by name. (Exactness through axolotl's trainer: test_axolotl_plugin.py.)"""
from __future__ import annotations

import pytest
import torch

from packkit.integrations.axolotl.collator import AxolotlPackingCollator

pytestmark = pytest.mark.full


class Tokenizer:
    pad_token_id = 0


def sample(ids, labels=None, positions=True):
    out = {"input_ids": ids, "labels": labels if labels is not None else list(ids), "length": len(ids)}
    if positions:
        out["position_ids"] = list(range(len(ids)))
    return out


def test_item_of_two_bins_becomes_one_row():
    collate = AxolotlPackingCollator(Tokenizer(), padding=True, pad_to_multiple_of=8, return_tensors="pt")
    batch = collate([[sample([5, 6, 7]), sample([8, 9])], [sample([3, 4])]])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 3, 4, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, 4, -100]]  # first label of each document ignored
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 7, 8] and torch.equal(batch["cu_seq_lens_q"],
                                                                                batch["cu_seq_lens_k"])
    assert "length" not in batch


@pytest.mark.parametrize("kwargs, feature, match", [
    (dict(padding="max_length"), None, "padding"),
    (dict(return_tensors="np"), None, "return_tensors"),
    (dict(max_length=16), None, "max_length"),
    ({}, {"input_ids": [1, 2], "labels": [1, 2], "position_ids": [3, 4]}, "position_ids must be 0..len-1"),
    ({}, {"input_ids": [1, 2], "labels": [1, 2], "token_type": "x"}, "token_type"),
])
def test_refusals_name_the_argument(kwargs, feature, match):
    with pytest.raises((ValueError, TypeError), match=match):
        AxolotlPackingCollator(Tokenizer(), **kwargs)([[feature]])
