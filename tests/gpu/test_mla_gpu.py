"""MLA head sizes on a GPU (issue 50 §3): FlashAttention takes one head size, so ``packkit_varlen`` (torch's
``varlen_attn``) and the shared-prefix two-pass path (torch's flash ops) get zero-padded heads. bf16 values and
gradients against the fp32 dense per-document reference, for value heads smaller and larger than the query/key
heads. Skipped without CUDA (a required skip under tests/gpu/run.sh)."""
from __future__ import annotations

import pytest
import torch

import gpu_gate
from packkit.training import doc_attention as da
from packkit.training import hf_attention

pytestmark = pytest.mark.full


def _reference(q, k, v, lengths, scale):
    outs, at = [], 0
    for n in lengths:
        s = torch.einsum("qhd,khd->hqk", q[at:at + n], k[at:at + n]) * scale
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v[at:at + n]))
        at += n
    return torch.cat(outs)


def _inputs(lengths, d_v, d_qk=64, heads=4):
    g = torch.Generator(device="cuda").manual_seed(0)
    t = sum(lengths)
    return [torch.randn(t, heads, d, device="cuda", generator=g, dtype=torch.float32) for d in (d_qk, d_qk, d_v)]


@gpu_gate.needs_cuda
@pytest.mark.parametrize("d_v", [32, 128])
@pytest.mark.parametrize("entry", ["doc_attention", "packkit_varlen"])
def test_mla_heads_on_flash_equal_the_reference_in_bf16(d_v, entry):
    lengths = [37, 300, 1, 129]
    q32, k32, v32 = _inputs(lengths, d_v)
    q, k, v = (x.to(torch.bfloat16).requires_grad_() for x in (q32, k32, v32))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    scale = 64 ** -0.5
    if entry == "doc_attention":
        out = da.doc_attention(q, k, v, da.spans(cu), scale)
    else:  # the HF function: [B=1, H, S, D] in, [1, S, H, Dv] out
        out = hf_attention.varlen_attention_forward(
            torch.nn.Module(), q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], None,
            cu_seq_lens_q=cu, max_length_q=max(lengths))[0][0]
    assert out.shape == (sum(lengths), 4, d_v)
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref = _reference(*leaves, lengths, scale)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k, v), grad.to(out.dtype))
    want = torch.autograd.grad(ref, leaves, grad)
    assert (out.float() - ref).abs().max() <= 2e-2 * ref.abs().max()
    for a, b in zip(got, want):
        assert a.shape == b.shape and (a.float() - b).abs().max() <= 5e-2 * b.abs().max()
