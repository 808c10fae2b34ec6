"""RL training semantics: per-token response log-probs from packkit-packed rollout micro-batches equal per-sample
log-probs (fp64, rel 1e-10) for a tiny random-init Llama and Qwen2, and a GRPO-style token-mean loss over the global
batch, accumulated over the micro-batches, gives the same gradients. Left-padded prompts included. A control that
does not restart positions (documents attend to each other) fails."""
from __future__ import annotations

import pytest
import torch

from packkit import rl
from shared_prefix_models import PROMPT, RESPONSE, VOCAB, per_sample_rollouts

pytestmark = pytest.mark.core

transformers = pytest.importorskip("transformers")

REL = 1e-10


def tiny(kind):
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, use_cache=False, attn_implementation="sdpa")
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    return model.to(torch.float64)


def rollouts(batch=10, seed=0):
    """verl's layout: prompt left-padded to PROMPT columns, response right-padded to RESPONSE columns."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, PROMPT + RESPONSE), generator=g)
    mask = torch.zeros_like(ids)
    for b in range(batch):
        p = int(torch.randint(1, PROMPT + 1, (1,), generator=g))
        r = int(torch.randint(1, RESPONSE + 1, (1,), generator=g))
        mask[b, PROMPT - p:PROMPT + r] = 1
    advantages = torch.randn(batch, generator=g, dtype=torch.float64)
    return ids * mask, mask, advantages


def packed_logprobs(model, ids, mask, indices, layout, restart=True):
    """verl's remove-padding path on a packkit micro-batch: logits of the packed row, log-prob of the next token
    (rolled ids), unpacked to [k, S], response columns taken as verl does ([-RESPONSE - 1:-1])."""
    batch, info = rl.pack_rollouts(ids, mask, indices, layout)
    pos = batch["position_ids"] if restart else torch.arange(batch["input_ids"].shape[1]).unsqueeze(0)
    logits = model(input_ids=batch["input_ids"], position_ids=pos, use_cache=False).logits[0]
    rolled = torch.roll(batch["input_ids"][0], -1)
    logp = torch.log_softmax(logits, -1).gather(1, rolled[:, None])[:, 0]
    full = rl.unpack_rollouts(logp, info)
    return full[:, -RESPONSE - 1:-1]


def grpo_loss_terms(logp, mask, advantages, total_tokens):
    """Token-mean over the global batch: -sum(adv * logp over response tokens) / all response tokens."""
    resp = mask[:, PROMPT:].to(torch.float64)
    return -(advantages[:, None] * logp * resp).sum() / total_tokens


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_packed_rollout_logprobs_and_grpo_gradients(kind):
    model = tiny(kind)
    ids, mask, adv = rollouts()
    resp = mask[:, PROMPT:] != 0
    total = int(resp.sum())
    layout = rl.rollout_layout(mask)
    plan = rl.micro_batches(layout.length, 32, dp_size=2, cost="attention")
    parts = [p for rank in plan.indices for p in rank if len(p)]
    assert len(parts) >= 3  # several micro-batches, each packing several rollouts

    model.zero_grad()
    ref = per_sample_rollouts(model, ids, mask)
    grpo_loss_terms(ref, mask, adv, total).backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    got = torch.zeros_like(ref)
    for part in parts:
        logp = packed_logprobs(model, ids, mask, part, layout)
        rows = torch.tensor(part)
        grpo_loss_terms(logp, mask[rows], adv[rows], total).backward()  # accumulated over micro-batches
        got[rows] = logp.detach()
    scale = ref[resp].abs().max()
    assert float((got[resp] - ref[resp]).abs().max() / scale) <= REL
    for n, p in model.named_parameters():
        err = float((p.grad - ref_grads[n]).abs().max() / ref_grads[n].abs().max().clamp_min(1e-300))
        assert err <= REL, (n, err)

    # Control: positions not restarted -> one long document, rollouts attend to each other: must fail.
    with torch.no_grad():
        leaked = torch.zeros_like(ref)
        for part in parts:
            leaked[torch.tensor(part)] = packed_logprobs(model, ids, mask, part, layout, restart=False)
    assert float((leaked[resp] - ref[resp]).abs().max() / scale) > 1e-3
