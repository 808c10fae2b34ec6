"""Shared-prefix packing on a GPU (issue 30 / 32 §3b): pack_groups on CUDA and Triton equals the CPU op bit for bit
with no host sync after the host layout; the two-pass FlashAttention-varlen path (bf16 / fp16, torch's flash ops)
and compiled FlexAttention (fp32) equal dense tree attention, values and gradients; a tiny Llama's completion
log-probs equal per-sample ones on the GPU. Skipped without CUDA (a required skip under tests/gpu/run.sh)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gpu_gate
from packkit import shared_prefix as sp
from packkit.shared_prefix.attention.masks import dense_tree_mask, flex_tree_attention, tree_block_mask
from packkit.shared_prefix.attention.two_pass import two_pass_attention, varlen_passes

pytestmark = pytest.mark.full

BACKENDS = [pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]


def grpo(groups=3, g=8, prompt=(200, 600), completion=(1, 300), seed=0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, 32000, int(rng.integers(*prompt))).tolist() for _ in range(groups)]
    completions = [[rng.integers(1, 32000, int(rng.integers(*completion))).tolist() for _ in range(g)]
                   for _ in range(groups)]
    return prompts, completions


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("capacity", [None, 2048])
def test_pack_groups_on_gpu_equals_cpu_without_a_sync(backend, capacity):
    prompts, completions = grpo()
    want, _ = sp.pack_groups(prompts, completions, capacity=capacity)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got, info = sp.pack_groups(prompts, completions, capacity=capacity, device="cuda", backend=backend)
        got["shared_prefix"].passes(torch.device("cuda"))  # the attention metadata: one copy, no sync
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for key in ("input_ids", "position_ids"):
        assert torch.equal(got[key].cpu(), want[key]), key
    a, b = got["shared_prefix"], want["shared_prefix"]
    assert torch.equal(a.subtree_end.cpu(), b.subtree_end) and torch.equal(a.cu_seqlens.cpu(), b.cu_seqlens)


def _case(dtype, seed=0):
    prompts, completions = grpo(groups=2, g=4, prompt=(50, 200), completion=(1, 120), seed=seed)
    batch, info = sp.pack_groups(prompts, completions, device="cuda")
    meta = batch["shared_prefix"]
    t = batch["input_ids"].numel()
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(t, 4, 64, generator=g, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    return meta, q, k, v


def _dense(meta, q, k, v, scale):
    mask = dense_tree_mask(meta.subtree_end)
    as_bhsd = lambda x: x.float().transpose(0, 1).unsqueeze(0)  # noqa: E731
    out = torch.nn.functional.scaled_dot_product_attention(as_bhsd(q), as_bhsd(k), as_bhsd(v), attn_mask=mask,
                                                           scale=scale)
    return out[0].transpose(0, 1)


@gpu_gate.needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_two_pass_flash_varlen_equals_dense(dtype):
    meta, q, k, v = _case(dtype)
    ref = _dense(meta, q, k, v, 0.125)
    grad = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    out = two_pass_attention(q, k, v, varlen_passes(meta.layout, q.device), 0.125)
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    assert (out.float() - ref).abs().max() <= tol
    grads = torch.autograd.grad(out, (q, k, v), grad.to(dtype))
    for got, want in zip(grads, ref_grads):
        assert (got.float() - want).abs().max() <= 5 * tol * max(1.0, float(want.abs().max()))


@gpu_gate.needs_cuda
def test_compiled_flex_fp32_equals_dense():
    meta, q, k, v = _case(torch.float32, seed=1)
    ref = _dense(meta, q, k, v, 0.125)
    as_bhsd = lambda x: x.transpose(0, 1).unsqueeze(0)  # noqa: E731
    out = flex_tree_attention(as_bhsd(q), as_bhsd(k), as_bhsd(v), tree_block_mask(meta.subtree_end), 0.125)
    assert (out[0].transpose(0, 1) - ref).abs().max() <= 1e-4


@gpu_gate.needs_cuda
@pytest.mark.parametrize("path", ["varlen", "flex"])
def test_tiny_llama_logprobs_on_gpu(path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    dtype = torch.bfloat16 if path == "varlen" else torch.float32
    model = transformers.LlamaForCausalLM(config).to("cuda", dtype)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 512, 40).tolist(), rng.integers(1, 512, 9).tolist()]
    completions = [[rng.integers(1, 512, int(n)).tolist() for n in (5, 17, 1)], [rng.integers(1, 512, 30).tolist()]]
    ref = []
    with torch.no_grad():
        for p, cs in zip(prompts, completions):
            for c in cs:
                ids = torch.tensor([p + c], device="cuda")
                logits = model(input_ids=ids).logits[0, :-1].float()
                ref.append(torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0][len(p) - 1:])
        model.set_attn_implementation(sp.register_attention())
        batch, info = sp.pack_groups(prompts, completions, device="cuda", attention=path)
        result = sp.completion_logprobs(model(**batch, use_cache=False).logits, info)
    tol = 0.1 if dtype == torch.bfloat16 else 1e-4
    for s, want in enumerate(ref):
        assert (result.per_sequence[s].float() - want).abs().max() <= tol
