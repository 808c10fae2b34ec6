"""verl GRPO with shared prefixes (``packkit.integrations.verl_shared_prefix``): the actor's ``(entropy,
log_probs)`` in verl's response layout equal per-sample ones (fp64 tiny Llama and Qwen2), for the actor pass
(differentiable: the GRPO token-mean loss gives per-sample gradients) and the reference pass (no grad)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from packkit.integrations.verl_shared_prefix import shared_prefix_log_probs

from shared_prefix_models import PROMPT, RESPONSE, fp64_norms, grpo_rollouts, per_sample_rollouts, tiny

pytestmark = pytest.mark.full

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _fp64(monkeypatch):
    fp64_norms(monkeypatch)


def per_sample_entropy(model, ids, mask, temperature):
    out = torch.zeros(ids.shape[0], RESPONSE, dtype=torch.float64)
    for b in range(ids.shape[0]):
        cols = torch.nonzero(mask[b]).flatten()
        logits = model(input_ids=ids[b, cols].unsqueeze(0), use_cache=False).logits[0] / temperature
        logp = torch.log_softmax(logits, -1)
        ent = -(logp.exp() * logp).sum(-1)
        full = torch.zeros(PROMPT + RESPONSE, dtype=torch.float64)
        full[cols[1:]] = ent[:-1]  # the entropy of the distribution that predicted the token at each column
        out[b] = full[PROMPT:]
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_actor_and_reference_passes_equal_per_sample(kind):
    model = tiny(kind)
    ids, mask, uids = grpo_rollouts(num_groups=3, group_size=4, seed=1)
    micro = {"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:]}
    advantages = torch.linspace(-1, 1, ids.shape[0], dtype=torch.float64)
    resp = mask[:, PROMPT:].to(torch.float64)

    model.zero_grad(set_to_none=True)
    ref = per_sample_rollouts(model, ids, mask)
    (-(advantages[:, None] * ref * resp).sum() / resp.sum()).backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    entropy, log_probs = shared_prefix_log_probs(model, micro, uids, temperature=0.7, calculate_entropy=True)
    assert model.config._attn_implementation == "sdpa"  # restored
    with torch.no_grad():
        ref_t = per_sample_entropy(model, ids, mask, 0.7)
        _, logp_t = shared_prefix_log_probs(model, micro, uids, temperature=0.7)
    assert float((entropy - ref_t * resp).abs().max()) <= 1e-10 * float(ref_t.abs().max())
    _, log_probs = shared_prefix_log_probs(model, micro, uids)
    assert float((log_probs - ref * resp).abs().max()) <= 1e-10 * float(ref.abs().max())
    (-(advantages[:, None] * log_probs * resp).sum() / resp.sum()).backward()
    for name, g in expected.items():
        assert float((model.get_parameter(name).grad - g).abs().max()) <= 1e-9 * max(float(g.abs().max()), 1e-30), name
    assert logp_t.shape == (ids.shape[0], RESPONSE) and not torch.equal(logp_t, log_probs.detach())


def test_uids_as_numpy_objects_and_ints_agree():
    model = tiny("llama")
    ids, mask, uids = grpo_rollouts(seed=2)
    micro = {"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:]}
    _, a = shared_prefix_log_probs(model, micro, uids)
    _, b = shared_prefix_log_probs(model, micro, np.unique(uids, return_inverse=True)[1])
    assert torch.equal(a, b)
