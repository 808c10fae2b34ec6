"""Shared-prefix packing is exact on real HF models: per-token completion log-probs from ``pack_groups`` equal
per-sample ones (fp64, rel <= 1e-10) on every attention path that runs on the CPU, and GRPO token-mean and DPO
losses give the same parameter gradients (rel <= 1e-9), for a tiny random-init Llama and Qwen2, and for Gemma 2
(attention logit soft-capping) and GPT-OSS (attention sinks) against an exact fp64 per-sample reference attention.

transformers' RMSNorm computes in fp32 even in an fp64 model, which caps agreement at ~1e-7; the fixture makes
it compute in the input dtype so the model is fp64 end to end (REFERENCE §12). Controls that must fail: positions
restarting at 0 in a branch, a mask that lets siblings see each other, and an attention that drops the soft-cap or
the sinks.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from packkit import shared_prefix as sp

import attention_models
from shared_prefix_models import VOCAB, fp64_norms, per_sample_groups, tiny

pytestmark = [pytest.mark.core, pytest.mark.exactness]

transformers = pytest.importorskip("transformers")

REL_LOGP, REL_GRAD = 1e-10, 1e-9
PATHS = ["dense", "varlen", "flex"]
GRAD_PATHS = ["dense", "varlen"]  # FlexAttention has no CPU backward: its gradients are checked in tests/gpu/


@pytest.fixture(autouse=True)
def _fp64(monkeypatch):
    fp64_norms(monkeypatch)
    attention_models.fp64_norms(monkeypatch)


def groups(seed=0, num_groups=3, sizes=(3, 1, 4)):
    """Prompts 0-12 tokens (one empty), completions 0-9 tokens (some empty), G = 1 included."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, VOCAB, n).tolist() for n in (7, 0, 12)[:num_groups]]
    completions = [[rng.integers(1, VOCAB, int(rng.integers(0, 10))).tolist() for _ in range(g)] for g in sizes]
    completions[0][0] = []  # an empty completion
    return prompts, completions


def packed(model, prompts, completions, path, **kw):
    before = model.config._attn_implementation
    name = sp.register_attention()
    model.set_attn_implementation(name)
    batch, info = sp.pack_groups(prompts, completions, attention=path, **kw)
    with torch.set_grad_enabled(torch.is_grad_enabled() and path != "flex"):
        logits = model(**batch, use_cache=False).logits
    model.set_attn_implementation(before)
    return sp.completion_logprobs(logits, info), info


def worst(result, reference) -> float:
    err = 0.0
    for s, ref in enumerate(reference):
        got = result.padded[s, :len(ref)]
        mask = result.mask[s, :len(ref)]
        assert torch.isnan(ref[~mask]).all()  # masked exactly where the sample has no predictor
        if mask.any():
            scale = max(float(ref[mask].detach().abs().max()), 1e-12)
            err = max(err, float((got[mask] - ref[mask]).detach().abs().max()) / scale)
        assert not result.mask[s, len(ref):].any()
    return err


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("path", PATHS)
def test_completion_logprobs_equal_per_sample_groups(kind, path):
    model = tiny(kind)
    prompts, completions = groups()
    reference = per_sample_groups(model, prompts, completions)
    result, info = packed(model, prompts, completions, path)
    assert worst(result, reference) <= REL_LOGP
    assert info.tokens_forwarded == sum(len(p) + sum(map(len, g)) for p, g in zip(prompts, completions))


@pytest.mark.parametrize("path", PATHS)
def test_capacity_rows_and_split_groups_equal_per_sample_groups(path):
    """Several rows of capacity 24; group 2 (12-token prompt + 4 completions) is split and re-carries its prompt."""
    model = tiny("llama")
    prompts, completions = groups(seed=1, sizes=(3, 1, 4))
    completions[2] = [[5] * 9, [6] * 8, [7] * 9, [8] * 3]
    reference = per_sample_groups(model, prompts, completions)
    result, info = packed(model, prompts, completions, path, capacity=24)
    assert info.plan.report.split_groups == {2: 3}
    assert info.layout.num_rows >= 2
    assert worst(result, reference) <= REL_LOGP


def _grpo_reference_grads(model, prompts, completions, advantages):
    model.zero_grad(set_to_none=True)
    ref = per_sample_groups(model, prompts, completions)
    tokens = sum(int((~torch.isnan(r)).sum()) for r in ref)
    loss = sum(-(a * r[~torch.isnan(r)]).sum() for a, r in zip(advantages, ref)) / tokens
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _grpo_grads_both_ways(model, path):
    """The per-sample GRPO reference gradients; the packed run's gradients are left in ``model``'s ``.grad``."""
    prompts, completions = groups(seed=2)
    n = sum(len(g) for g in completions)
    advantages = torch.linspace(-1, 1, n, dtype=torch.float64)
    ref = _grpo_reference_grads(model, prompts, completions, advantages)
    model.zero_grad(set_to_none=True)
    result, _ = packed(model, prompts, completions, path)
    # On-policy GRPO: ratio 1, so the clipped surrogate's gradient is -adv * grad logp, token-mean.
    sp.grpo_token_mean_loss(result, advantages).backward()
    return ref


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("path", GRAD_PATHS)
def test_grpo_token_mean_gradients(kind, path):
    model = tiny(kind)
    ref = _grpo_grads_both_ways(model, path)
    got = {n: p.grad for n, p in model.named_parameters()}
    for name, g in ref.items():
        scale = max(float(g.abs().max()), 1e-30)
        assert float((got[name] - g).abs().max()) / scale <= REL_GRAD, name


@pytest.mark.parametrize("path", GRAD_PATHS)
def test_dpo_loss_gradients(path):
    model, reference_model = tiny("qwen2"), tiny("qwen2")
    with torch.no_grad():
        for p in reference_model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, VOCAB, n).tolist() for n in (9, 4, 0)]
    completions = [[rng.integers(1, VOCAB, int(rng.integers(1, 8))).tolist() for _ in range(2)] for _ in prompts]
    beta = 0.1

    def dpo(chosen, rejected, ref_chosen, ref_rejected):
        logits = beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
        return -torch.nn.functional.logsigmoid(logits).mean()

    def sums(m):
        ref = per_sample_groups(m, prompts, completions)
        return torch.stack([r[~torch.isnan(r)].sum() for r in ref])

    with torch.no_grad():
        ref_sums = sums(reference_model)
    model.zero_grad(set_to_none=True)
    s = sums(model)
    dpo(s[0::2], s[1::2], ref_sums[0::2], ref_sums[1::2]).backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    result, info = packed(model, prompts, completions, path)
    with torch.no_grad():
        ref_result, _ = packed(reference_model, prompts, completions, path)
    chosen, rejected = sp.dpo_logps(result, info)
    ref_chosen, ref_rejected = sp.dpo_logps(ref_result, info)
    assert torch.allclose(ref_chosen, ref_sums[0::2], rtol=1e-10, atol=0)
    dpo(chosen, rejected, ref_chosen, ref_rejected).backward()
    for name, g in expected.items():
        scale = max(float(g.abs().max()), 1e-30)
        assert float((model.get_parameter(name).grad - g).abs().max()) / scale <= REL_GRAD, name


def test_control_positions_restarting_in_a_branch_fail():
    model = tiny("llama")
    prompts, completions = groups()
    reference = per_sample_groups(model, prompts, completions)
    model.set_attn_implementation(sp.register_attention())
    batch, info = sp.pack_groups(prompts, completions, attention="dense")
    pos = batch["position_ids"].clone()
    lay = info.layout
    for p in range(len(lay.order)):  # every branch (depth 1) restarts at 0
        if lay.depth[p] == 1:
            pos[0, lay.dst[p]:lay.dst[p] + lay.length[p]] = torch.arange(int(lay.length[p]))
    with pytest.raises(ValueError, match="position_ids.*not the batch's own"):  # refused: not the packed tensor
        model(**{**batch, "position_ids": pos}, use_cache=False)
    with pytest.raises(ValueError, match="position_ids.*not the batch's own"):  # the same tensor, written in place
        batch["position_ids"].add_(0)
        model(**batch, use_cache=False)
    # With the check passed (an attention built for these positions), the comparison itself catches them.
    attn = batch["shared_prefix"]
    bad = sp.SharedPrefixAttention(lay, attn.subtree_end, attn.cu_seqlens, attn.node_idx, "dense", position_ids=pos)
    logits = model(**{**batch, "position_ids": pos, "shared_prefix": bad}, use_cache=False).logits
    assert worst(sp.completion_logprobs(logits, info._replace(attention=bad)), reference) > 1e-4


def test_control_siblings_seeing_each_other_fail():
    model = tiny("llama")
    prompts, completions = groups()
    reference = per_sample_groups(model, prompts, completions)
    model.set_attn_implementation(sp.register_attention())
    batch, info = sp.pack_groups(prompts, completions, attention="dense")
    attn = batch["shared_prefix"]
    lay = info.layout
    leaky = attn.subtree_end.clone()
    for p in range(len(lay.order)):  # a branch's keys stay visible until the end of its whole tree
        if lay.depth[p] == 1:
            root_end = int(lay.end[p - 1]) if lay.depth[p - 1] == 0 else int(lay.end[np.flatnonzero(
                (lay.depth[:p] == 0))[-1]])
            leaky[0, lay.dst[p]:lay.dst[p] + lay.length[p]] = root_end
    bad = sp.SharedPrefixAttention(lay, leaky, attn.cu_seqlens, attn.node_idx, "dense",
                                   position_ids=batch["position_ids"])
    logits = model(**{**batch, "shared_prefix": bad}, use_cache=False).logits
    assert worst(sp.completion_logprobs(logits, info._replace(attention=bad)), reference) > 1e-4


# --- Gemma 2 (softcap) and GPT-OSS (s_aux sinks): the arguments the Llama-shaped models never pass ----------------
SOFTCAP_SINKS = ["gemma2", "gpt_oss"]


@pytest.mark.parametrize("kind", SOFTCAP_SINKS)
def test_reference_attention_is_transformers_eager(kind):
    """The per-sample reference is transformers' own eager attention: exactly for GPT-OSS (its eager softmax runs in
    the input dtype), to fp32 rounding for Gemma 2 (its eager softmax runs in fp32)."""
    model = attention_models.tiny(kind)
    ids = torch.tensor([[5, 9, 2, 33, 7, 1, 18, 4, 60, 11, 3]])
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
        model.set_attn_implementation("eager")
        eager = model(input_ids=ids, use_cache=False).logits
    assert float((ref - eager).abs().max()) <= (1e-13 if kind == "gpt_oss" else 1e-6) * float(eager.abs().max())


@pytest.mark.parametrize("kind", SOFTCAP_SINKS)
@pytest.mark.parametrize("path", PATHS)
def test_softcap_and_sinks_logprobs_equal_per_sample(kind, path):
    model = attention_models.tiny(kind)
    prompts, completions = groups()
    reference = per_sample_groups(model, prompts, completions)
    result, _ = packed(model, prompts, completions, path)
    assert worst(result, reference) <= REL_LOGP


@pytest.mark.parametrize("kind", SOFTCAP_SINKS)
@pytest.mark.parametrize("path", GRAD_PATHS)
def test_softcap_and_sinks_gradients(kind, path):
    """Every parameter's gradient, the GPT-OSS sink logits and Gemma 2's soft-capped projections included."""
    model = attention_models.tiny(kind)
    ref = _grpo_grads_both_ways(model, path)
    if kind == "gpt_oss":
        assert float(ref["model.layers.0.self_attn.sinks"].abs().max()) > 1e-6  # the sinks are trained
    for name, g in ref.items():
        got = model.get_parameter(name).grad
        scale = max(float(g.abs().max()), 1e-30)
        assert float((got - g).abs().max()) / scale <= REL_GRAD, name


@pytest.mark.parametrize("kind, argument", [("gemma2", "softcap"), ("gpt_oss", "s_aux")])
def test_control_an_attention_dropping_softcap_or_sinks_fails(kind, argument, monkeypatch):
    """The issue's bug, reproduced: an attention that swallows the argument is caught by the comparison."""
    from packkit.shared_prefix import hf

    forward = hf.shared_prefix_attention_forward

    def dropping(*args, **kwargs):
        assert kwargs.pop(argument) is not None
        return forward(*args, **kwargs)

    monkeypatch.setattr(hf, "shared_prefix_attention_forward", dropping)
    model = attention_models.tiny(kind)
    prompts, completions = groups()
    reference = per_sample_groups(model, prompts, completions)
    result, _ = packed(model, prompts, completions, "varlen")
    assert worst(result, reference) > 1e-4
