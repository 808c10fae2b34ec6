"""MLA head sizes (DeepSeek-V3, Kimi-K2: value heads smaller or larger than query/key heads) through packkit's
per-document attention, ``packkit_varlen`` and the shared-prefix attention.

The fused kernels (torch's CPU flash kernel, FlashAttention on CUDA) take one head size ("Q/K/V should have the
same head size"): ``doc_attention`` pads the smaller side with zero columns, which add nothing to ``Q K^T`` (the
scale is passed, never derived from the padded size), and cuts the output and gradients back.

* The helper against the dense reference (its einsums take any value head size), fp64, values and gradients,
  for value heads smaller and larger than the query/key heads, on the CPU kernel (grouped and single documents)
  and the matmul path (soft-cap).
* A tiny DeepSeek-V3 with ``v_head_dim != qk_head_dim``: packed (``packkit_varlen``; the shared-prefix varlen and
  dense paths) equals every sample alone, log-probs and gradients, fp64.
* Control: without the padding the kernel raises the error users saw.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from packkit.training import doc_attention as da
from test_varlen_cpu import _rel, dense_reference

pytestmark = [pytest.mark.core, pytest.mark.exactness]

transformers = pytest.importorskip("transformers")
model_zoo = pytest.importorskip("model_zoo")


def _mla_inputs(lengths, dv, dqk=8, heads=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    return [torch.randn(t, heads, d, generator=g, dtype=torch.float64).requires_grad_() for d in (dqk, dqk, dv)]


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(1, 19), min_size=1, max_size=5), dv=st.sampled_from([3, 5, 12, 16]),
       seed=st.integers(0, 1000), window=st.none() | st.integers(1, 6), softcap=st.none() | st.floats(0.5, 4.0),
       sink=st.booleans())
def test_doc_attention_value_heads_of_another_size_fp64(lengths, dv, seed, window, softcap, sink):
    q, k, v = _mla_inputs(lengths, dv, seed=seed)
    s = torch.randn(3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).requires_grad_() \
        if sink else None
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    out = da.doc_attention(q, k, v, da.spans(cu), 0.3, softcap, s, window)
    assert out.shape == (sum(lengths), 3, dv)
    ref = dense_reference(q, k, v, lengths, 0.3, True, window, None, softcap, s)
    leaves = [q, k, v] + ([s] if sink else [])
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad_out)
    want = torch.autograd.grad(ref, leaves, grad_out)
    assert _rel(out, ref, 1.0) <= 1e-12
    for a, b in zip(got, want):
        assert a.shape == b.shape and _rel(a, b, 1.0) <= 1e-12


def test_control_the_fused_kernel_refuses_unequal_heads_unpadded(monkeypatch):
    """The padding is what makes it run: without it, torch's CPU flash kernel raises the error users reported."""
    monkeypatch.setattr(da, "_padded", lambda x, dim: x)
    q, k, v = _mla_inputs([4, 3], dv=5)
    with pytest.raises(RuntimeError, match="same head size"):
        da.doc_attention(q, k, v, da.spans(torch.tensor([0, 4, 7], dtype=torch.int32)), 0.3)


# --- through a tiny DeepSeek-V3 -----------------------------------------------------------------------------------
SEQS = [[3, 9, 4, 17, 22, 5, 8], [11, 2, 6], [7, 30, 12, 1, 9, 40, 41, 2, 8], [5], [60, 61, 62, 63, 1, 2]]


@pytest.fixture
def zoo():
    with model_zoo.zoo_session():
        yield


def _deepseek(v_head_dim: int):
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "deepseek_v3", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=v_head_dim, head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
        max_position_embeddings=128, use_cache=False, attention_dropout=0.0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                          experts_implementation="eager").to(torch.float64).eval()
    model_zoo.fp64_everywhere(model, model_zoo._SESSION[-1])
    return model


def _logp(logits, ids):
    return torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("v_head_dim", [8, 24])  # qk head size 16: value heads smaller, then larger
def test_deepseek_v3_mla_packkit_varlen_equals_per_sample_fp64(zoo, v_head_dim):
    model = _deepseek(v_head_dim)
    ref = torch.cat([_logp(model(input_ids=torch.tensor([s])).logits[0], torch.tensor(s)) for s in SEQS])
    ref_grads = _grads(model, ref.sum())
    model.set_attn_implementation(packkit.register_varlen_attention())
    batch = packkit.PackingCollator(32, layout="padded")([{"input_ids": s} for s in SEQS])
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
    flat, ids = logits.reshape(-1, logits.shape[-1]), batch["input_ids"].reshape(-1)
    cu = batch["cu_seq_lens_q"].tolist()
    parts = {}
    for a, b in zip(cu, cu[1:]):
        doc = ids[a:b].tolist()
        if doc in SEQS:
            parts[SEQS.index(doc)] = _logp(flat[a:b], ids[a:b])
    got = torch.cat([parts[i] for i in range(len(SEQS))])
    grads = _grads(model, got.sum())
    assert _rel(got, ref) <= 1e-10
    for name, g in ref_grads.items():
        assert _rel(grads[name], g) <= 1e-9, name


@pytest.mark.parametrize("path", ["varlen", "dense"])
def test_deepseek_v3_mla_shared_prefix_equals_per_sample_fp64(zoo, path):
    from packkit import shared_prefix as sp

    model = _deepseek(8)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 64, n).tolist() for n in (7, 12)]
    completions = [[rng.integers(1, 64, int(n)).tolist() for n in (4, 6, 2)], [rng.integers(1, 64, 5).tolist()]]
    reference = []
    for p, group in zip(prompts, completions):
        for c in group:
            seq = torch.tensor([p + c])
            reference.append(_logp(model(input_ids=seq).logits[0], seq[0])[len(p) - 1:])
    model.set_attn_implementation(sp.register_attention())
    batch, info = sp.pack_groups(prompts, completions, attention=path)
    result = sp.completion_logprobs(model(**batch, use_cache=False).logits, info)
    for s, ref in enumerate(reference):
        assert bool(result.mask[s, :len(ref)].all())
        assert _rel(result.padded[s, :len(ref)], ref) <= 1e-10
