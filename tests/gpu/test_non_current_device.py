"""Every op family (layout, pack, pack_batch, unpack, unpack_padded, cp_shard, tree_pack) on tensors on cuda:1 while
device 0 is current, CUDA and compiled Triton: the same result as on cuda:0, outputs on cuda:1, and the current
device left unchanged (issue 48 review items 1 and 2: a launch on the current device against cuda:1's stream and
pointers fails or faults). Needs two GPUs; the CPU twin is tests/test_device_guards.py (every launch wrapped in
the tensors' device guard, checked in the sources)."""
from __future__ import annotations

import pytest
import torch

import gpu_gate
from cp_fused_cases import op_args as cp_args
from gpu_gate import ops_for
from pack_samples import make_case
from shared_prefix_cases import make_case as make_forest, op_args as forest_args

pytestmark = [pytest.mark.full, pytest.mark.skipif(torch.cuda.device_count() < 2,
                                reason="needs two CUDA GPUs (tensors on cuda:1, device 0 current)")]
BACKENDS = [pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]


def _op(backend: str, name: str):
    if backend == "triton":
        from packkit.triton_kernels import context_parallel, tree_pack  # noqa: F401  (registers the ops)
    return getattr(ops_for(backend), name)


def _moved(args, device):
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def _same_on_cuda1(op, args) -> None:
    """op on cuda:0 (current) and on cuda:1 with device 0 still current: equal results, outputs on cuda:1."""
    torch.cuda.set_device(0)
    want = op(*_moved(args, "cuda:0"))
    assert torch.cuda.current_device() == 0
    got = op(*_moved(args, "cuda:1"))
    assert torch.cuda.current_device() == 0, "the op left another device current"
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    want, got = (x if isinstance(x, (tuple, list)) else (x,) for x in (want, got))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device == torch.device("cuda", 1), (i, g.device)
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w.cpu()), i


def _pack_case(seed):
    case = make_case(seed, dtype=torch.int64, flat=False, extra_rows=1, max_seqs=12)
    n_cu = case.layout.num_cu_seqlens
    cu, cu_seg = torch.ops.packkit.layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, False, n_cu)
    return case, n_cu, (case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [3, 5])
def test_pack_families_on_a_non_current_device(backend, seed):
    case, n_cu, seg = _pack_case(seed)
    _same_on_cuda1(_op(backend, "layout"), (case.seg_length, case.bin_offsets, case.num_rows, case.row_len, False, n_cu))
    _same_on_cuda1(_op(backend, "pack"), (case.src, *seg, case.num_rows, case.row_len, False, 0.0, None))
    _same_on_cuda1(_op(backend, "pack_batch"), (case.src, None, case.src_offsets, *case.plan_tensors, case.num_rows,
                                                case.row_len, False, n_cu))
    packed = torch.ops.packkit.pack(case.src, *seg, case.num_rows, case.row_len, False, 0.0, None)
    _same_on_cuda1(_op(backend, "unpack"), (packed, *seg, False, case.src.shape[0], 0.0))
    _same_on_cuda1(_op(backend, "unpack_padded"), (packed, *seg[1:], False, len(case.lengths), 40, 0.0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["zigzag", "contiguous"])
def test_cp_shard_on_a_non_current_device(backend, mode):
    _same_on_cuda1(_op(backend, "cp_shard"), cp_args(4, mode))


@pytest.mark.parametrize("backend", BACKENDS)
def test_tree_pack_on_a_non_current_device(backend):
    forest, layout = make_forest(3, rows=2)
    _same_on_cuda1(_op(backend, "tree_pack"), forest_args(forest, layout, labels=True) + (7, -1))
