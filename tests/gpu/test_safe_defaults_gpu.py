"""On a GPU: what issue 48 made safe, on real CUDA tensors (the CPU twins: tests/test_backend_check.py,
tests/test_attention_args.py, tests/test_varlen_cpu.py).

* backend="auto" passes the CUDA self-check here and uses the CUDA kernels; PACKKIT_BACKEND=cpu (the last resort
  of a failed check) packs CUDA tensors through the CPU ops, bit-identical, outputs on the device, out= buffers too;
* packkit_varlen refuses fp32 on CUDA by name, before FlashAttention's own error;
* a sink folded into FlashAttention's lse = +inf (a query with no key) gives 0, not NaN."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gpu_gate
import packkit
from packkit.packing import backend_check

pytestmark = pytest.mark.full


def _sequences(seed, n=40, max_len=300):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 32000, int(k)).tolist() for k in rng.integers(1, max_len, n)]


@pytest.fixture
def fresh_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("PACKKIT_CACHE_DIR", str(tmp_path))
    backend_check._reset_for_tests()
    yield
    backend_check._reset_for_tests()


@gpu_gate.needs_cuda_kernels
def test_auto_checks_the_cuda_kernels_here_and_caches_the_verdict(fresh_choice, monkeypatch, tmp_path):
    monkeypatch.delenv("PACKKIT_BACKEND", raising=False)
    assert backend_check.auto_backend(torch.device("cuda", 0)) == "cuda"
    files = list(tmp_path.glob("backend-check-*.json"))
    assert len(files) == 1 and '"chosen": "cuda"' in files[0].read_text()


@gpu_gate.needs_cuda
@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_the_cpu_fallback_packs_cuda_tensors_bit_identically(fresh_choice, monkeypatch, layout):
    monkeypatch.setenv("PACKKIT_BACKEND", "cpu")
    seqs = _sequences(1)
    cpu, cpu_info = packkit.pack_sequences(seqs, capacity=1024, layout=layout, return_info=True)
    gpu, info = packkit.pack_sequences(seqs, capacity=1024, layout=layout, device="cuda", return_info=True)
    buffers = packkit.PackBuffers()
    out = packkit.pack_sequences(seqs, capacity=1024, layout=layout, device="cuda", out=buffers)
    for batch in (gpu, out):
        for key, value in cpu.items():
            if isinstance(value, torch.Tensor):
                assert batch[key].is_cuda and torch.equal(batch[key].cpu(), value), key
    back = packkit.unpack_sequences(gpu["input_ids"].float(), info)
    assert back.is_cuda and torch.equal(back.cpu(), packkit.unpack_sequences(cpu["input_ids"].float(), cpu_info))


@gpu_gate.needs_cuda
def test_varlen_refuses_fp32_on_cuda_by_name():
    from packkit.training import hf_attention

    class Module(torch.nn.Module):
        is_causal = True
        config = type("Config", (), {"model_type": "llama"})()

    q = torch.zeros(1, 4, 6, 8, device="cuda")
    with pytest.raises(ValueError, match="torch.float32 on CUDA is refused"):
        hf_attention.varlen_attention_forward(Module(), q, q, q, None, cu_seq_lens_q=torch.tensor([0, 6], device="cuda"),
                                              max_length_q=6)


@gpu_gate.needs_cuda
def test_flash_lse_of_a_query_with_no_key_folds_a_sink_into_zero():
    from packkit.training import doc_attention as da

    cu_q = torch.tensor([0, 3, 5], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 4, 4], dtype=torch.int32, device="cuda")  # document 1: two queries, no key
    p = da.spans(cu_q, cu_k, causal=False)
    q = torch.randn(5, 2, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (torch.randn(4, 2, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(2))
    sink = torch.tensor([0.3, -0.7], device="cuda", requires_grad=True)
    out = da.doc_attention(q, k, v, p, 0.125, sink=sink)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.equal(out[3:], torch.zeros_like(out[3:]))
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, sink))
