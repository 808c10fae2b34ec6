"""The TRL DPO path: ``SharedPrefixCollator`` on TRL's tokenized preference examples gives the chosen / rejected
log-prob sums TRL computes from its own ``DataCollatorForPreference`` batch (padded rows, completion_mask, labels
shifted inside the model), each prompt forwarded once; ``dpo_loss`` is TRL's sigmoid loss. (TRL 1.16 computes the
DPO loss inside ``DPOTrainer._compute_loss`` with the trainer's state, so it cannot be called standalone; the
formula is checked against its documented form instead.) Unknown fields are refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from packkit import shared_prefix as sp

from shared_prefix_models import VOCAB, fp64_norms, tiny

pytestmark = pytest.mark.full

trl = pytest.importorskip("trl")


@pytest.fixture(autouse=True)
def _fp64(monkeypatch):
    fp64_norms(monkeypatch)


def examples(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [{"prompt_ids": rng.integers(1, VOCAB, int(rng.integers(1, 12))).tolist(),
             "chosen_ids": rng.integers(1, VOCAB, int(rng.integers(1, 8))).tolist(),
             "rejected_ids": rng.integers(1, VOCAB, int(rng.integers(1, 8))).tolist()} for _ in range(n)]


def trl_sums(model, feats):
    """What DPOTrainer does with DataCollatorForPreference's batch: per-token log-probs of completion tokens
    (labels = input_ids where completion_mask), summed; the batch is [chosen..., rejected...]."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    batch = DataCollatorForPreference(pad_token_id=0)(feats)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    sums = (logp * batch["completion_mask"][:, 1:]).sum(1)
    return sums.chunk(2)


def test_collator_sums_equal_trls_and_prompts_are_packed_once():
    model = tiny("llama")
    feats = examples()
    chosen_ref, rejected_ref = trl_sums(model, feats)
    model.set_attn_implementation(sp.register_attention())
    batch, info = sp.SharedPrefixCollator()(feats)
    result = sp.completion_logprobs(model(**batch, use_cache=False).logits, info)
    chosen, rejected = sp.dpo_logps(result, info)
    assert torch.allclose(chosen, chosen_ref, rtol=1e-10, atol=0)
    assert torch.allclose(rejected, rejected_ref, rtol=1e-10, atol=0)
    tokens = sum(len(f["prompt_ids"]) + len(f["chosen_ids"]) + len(f["rejected_ids"]) for f in feats)
    assert batch["input_ids"].numel() == tokens
    model.set_attn_implementation("sdpa")


def test_dpo_loss_is_the_sigmoid_loss():
    g = torch.Generator().manual_seed(0)
    c, r, rc, rr = (torch.randn(5, generator=g, dtype=torch.float64) for _ in range(4))
    z = 0.1 * ((c - rc) - (r - rr))
    assert torch.allclose(sp.dpo_loss(c, r, rc, rr), torch.log1p(torch.exp(-z)).mean(), rtol=1e-14)


def test_unknown_or_missing_fields_are_errors():
    feats = examples(2)
    with pytest.raises(ValueError, match="fields \\['score'\\]"):
        sp.SharedPrefixCollator()([{**feats[0], "score": 1.0}])
    batch, _ = sp.SharedPrefixCollator(ignore_keys=["score"])([{**feats[0], "score": 1.0}])
    assert batch["input_ids"].numel() > 0
    with pytest.raises(ValueError, match="lacks \\['rejected_ids'\\]"):
        sp.SharedPrefixCollator()([{"prompt_ids": [1], "chosen_ids": [2]}])
    with pytest.raises(ValueError, match="empty list"):
        sp.SharedPrefixCollator()([])
    grpo = sp.SharedPrefixCollator(completions_key="completion_ids")
    batch, info = grpo([{"prompt_ids": [1, 2], "completion_ids": [[3], [4, 5], [6]]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6]]
