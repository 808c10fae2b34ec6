"""Device paths a training loop takes, on a GPU, for both device backends: zero host syncs, the
collator and pack_on_device equal to the CPU path, tensors on a non-current device, backend choice.
Bit-exactness of every op against the reference, opcheck, torch.compile and CUDA graphs run for the
same backends in tests/test_pack_ops.py (parametrized over cpu / cuda / triton)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gpu_gate
import packkit
from gpu_gate import ops_for
from pack_samples import make_case

pytestmark = pytest.mark.full

BACKENDS = [pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]


def _sequences(seed, n=48, max_len=300):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 32000, int(k)).tolist() for k in rng.integers(1, max_len, n)]


def _equal_batches(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key].cpu(), b[key].cpu()), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_op_runs_without_a_host_sync(backend):
    ops = ops_for(backend)
    case = make_case(5, dtype=torch.int64, flat=False, extra_rows=1, max_seqs=12).to("cuda")
    n_cu = case.layout.num_cu_seqlens

    def run():
        out = ops.pack_batch(case.src, None, case.src_offsets, *case.plan_tensors, case.num_rows, case.row_len, False,
                             n_cu)
        cu, cu_seg = ops.layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, False, n_cu)
        seg = (case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg)
        packed = ops.pack(case.src, *seg, case.num_rows, case.row_len, False, 0.0, None)
        ops.unpack(packed, *seg, False, case.src.shape[0], 0.0)
        ops.unpack_padded(packed, case.seg_seq, case.seg_start, cu, cu_seg, False, len(case.lengths), 16, 0.0)
        packkit.check_plan(case.src_offsets, *case.plan_tensors, num_rows=case.num_rows, row_len=case.row_len,
                           flat=False, num_cu_seqlens=n_cu, cu_seqlens=cu, cu_seg=cu_seg,
                           num_src_tokens=case.src.shape[0], sync=False)
        return out

    run()  # warm up: module loading, Triton compilation, allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_collator_on_cuda_equals_cpu(backend, layout):
    features = [{"input_ids": s} for s in _sequences(1)]
    kwargs = dict(layout=layout, return_num_items=True)
    cpu = packkit.PackingCollator(1024, **kwargs)(features)
    gpu = packkit.PackingCollator(1024, device="cuda", backend=backend, **kwargs)(features)
    assert gpu["input_ids"].is_cuda and gpu["cu_seq_lens_q"].is_cuda
    _equal_batches(cpu, gpu)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pack_on_device_equals_cpu_and_round_trips(backend):
    seqs = _sequences(2, n=64)
    lengths = torch.tensor([len(s) for s in seqs])
    flat = torch.tensor([t for s in seqs for t in s])
    cpu, _ = packkit.pack_on_device(flat, lengths, 1024, overlong="split")
    gpu, info = packkit.pack_on_device(flat.cuda(), lengths.cuda(), 1024, overlong="split", backend=backend)
    _equal_batches(cpu, gpu)
    logits = gpu["input_ids"].unsqueeze(-1).to(torch.float32) * torch.tensor([1.0, -1.0], device="cuda")
    back = packkit.unpack_sequences(logits, info, backend=backend)
    assert torch.equal(back[:, 0].cpu(), flat.to(torch.float32))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (non-current device)")
@pytest.mark.parametrize("backend", BACKENDS)
def test_tensors_on_a_non_current_device(backend):
    seqs = _sequences(3)
    cpu = packkit.pack_sequences(seqs, capacity=1024, layout="padded")
    torch.cuda.set_device(0)
    other = packkit.pack_sequences(seqs, capacity=1024, layout="padded", device="cuda:1", backend=backend)
    assert other["input_ids"].device == torch.device("cuda", 1)
    assert torch.cuda.current_device() == 0
    _equal_batches(cpu, other)


@gpu_gate.needs_cuda_kernels
def test_auto_backend_uses_the_cuda_kernels():
    from packkit.packing.sequences import _backend_for

    assert _backend_for(torch.device("cuda", 0), "auto") == "cuda"


# --- Context parallelism, fused pack + shard (packkit.pack_context_parallel; CPU twin: tests/test_cp_fused.py) ---
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["zigzag", "contiguous"])
def test_fused_cp_matches_reference_and_cpu(backend, mode):
    from cp_fused_cases import check_reference, make_case

    for seed in range(10):
        seqs, lengths, kw = make_case(seed)
        for cp in (1, 2, 3):
            for rank in range(cp):
                torch.full((1 << 20,), 0x5A, dtype=torch.uint8, device="cuda")  # poison the next blocks
                out = packkit.pack_context_parallel(seqs, cp, rank, mode, device="cuda", backend=backend, **kw)
                check_reference(out, seqs, lengths, kw, cp, rank, mode)
                _equal_batches(packkit.pack_context_parallel(seqs, cp, rank, mode, **kw), out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_cp_runs_in_one_launch_without_a_host_sync(backend):
    flat = torch.randint(1, 32000, (5000,))
    lengths = np.random.default_rng(0).multinomial(5000 - 40, np.ones(40) / 40) + 1

    def run():
        return packkit.pack_context_parallel(flat, 4, 1, "zigzag", lengths=lengths, capacity=4096, layout="padded",
                                             device="cuda", backend=backend)

    run()  # warm up: Triton compilation, allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _equal_batches(packkit.pack_context_parallel(flat, 4, 1, "zigzag", lengths=lengths, capacity=4096,
                                                 layout="padded"), out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_collator_fused_cp_on_cuda_equals_cpu(backend):
    features = [{"input_ids": s, "labels": s[::-1]} for s in _sequences(3, n=24)]
    for mode in ("zigzag", "contiguous"):
        kwargs = dict(layout="flat", return_num_items=True, context_parallel=(4, 3, mode))
        cpu = packkit.PackingCollator(1024, **kwargs)(features)
        gpu = packkit.PackingCollator(1024, device="cuda", backend=backend, **kwargs)(features)
        _equal_batches(cpu, gpu)
