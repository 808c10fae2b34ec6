"""Issue 48's static-review fixes of the CUDA kernels, on a GPU: the layout's defined fill past the produced
segments (CUDA equals Triton), the fused contiguous cp_shard with cu_seqlens not starting at 0, tree_pack with
nodes but no rows, and every launch of a kernel at its source's block size (the layout kernel's 1,024 threads
needed 90,112 registers on sm_90). The CPU side of the same contract: tests/test_op_bounds.py; the resource
check: tools/check_cuda_resources.py."""
from __future__ import annotations

import pytest
import torch

import gpu_gate
from gpu_gate import ops_for
from pack_samples import make_case

pytestmark = pytest.mark.full

BACKENDS = [pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flat", [False, True])
def test_layout_fills_entries_past_the_plan(backend, flat):
    """num_cu_seqlens larger than the plan's (only check_plan sees it on a device): the extra entries are empty
    padding segments at the end, cu = the packed token count and cu_seg = -1, on both device backends."""
    for seed in range(200):  # a plan with a full row, so the argument check allows a larger num_cu_seqlens
        case = make_case(seed, dtype=torch.int64, flat=flat, max_seqs=10).to("cuda")
        n_cu = case.layout.num_cu_seqlens
        extra = min(3, case.seg_length.numel() + (1 if flat else case.num_rows) + 1 - n_cu)
        if extra > 0:
            break
    assert extra > 0
    ops = ops_for(backend)
    cu, cu_seg = ops.layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, flat, n_cu)
    cu_big = torch.full((n_cu + extra,), 7777, dtype=torch.int32, device="cuda")
    seg_big = torch.full((n_cu + extra - 1,), 7777, dtype=torch.int32, device="cuda")
    ops.layout_out(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, flat, cu_big, seg_big)
    total = case.row_len if flat else case.num_rows * case.row_len
    assert torch.equal(cu_big[:n_cu - 1], cu[:-1]) and torch.equal(seg_big[:n_cu - 1], cu_seg)
    assert (cu_big[n_cu - 1:] == total).all() and (seg_big[n_cu - 1:] == -1).all()


def test_every_cuda_kernel_launches():
    """Each kernel at its block size: layout (one block of kLayoutThreads), the gathers, cp_shard, tree_pack."""
    ops = torch.ops.packkit
    if not gpu_gate.CUDA_KERNELS:
        pytest.skip(f"{gpu_gate.REQUIRED_TAG} needs a CUDA GPU and packkit's CUDA kernels (_ops_cuda.so)")
    case = make_case(3, dtype=torch.float32, feature=(3,), flat=False, max_seqs=40).to("cuda")
    n_cu = case.layout.num_cu_seqlens
    cu, cu_seg = ops.layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, False, n_cu)
    seg = (case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg)
    packed = ops.pack(case.src, *seg, case.num_rows, case.row_len, False, 0.0, None)
    ops.unpack(packed, *seg, False, case.src.shape[0], 0.0)
    torch.cuda.synchronize()


def test_fused_cp_shard_with_cu_seqlens_from_five_stays_inside():
    """The review's case: fused contiguous cp_shard with cu_seqlens [5, 10] read 5 tokens before input_ids.
    Now those positions are padding (compute-sanitizer in tests/gpu/run.sh would see an illegal read)."""
    if not gpu_gate.CUDA_KERNELS:
        pytest.skip(f"{gpu_gate.REQUIRED_TAG} needs a CUDA GPU and packkit's CUDA kernels (_ops_cuda.so)")
    ids = torch.arange(1, 11, device="cuda")
    cu = torch.tensor([5, 10], dtype=torch.int32, device="cuda")
    out = torch.ops.packkit.cp_shard(ids, ids.clone(), None, cu, torch.tensor([0, 10], dtype=torch.int32, device="cuda"),
                                     1, 0, False, 10, 0, -100, torch.tensor([0], device="cuda"), 0, None)
    torch.cuda.synchronize()
    assert (out[0][:5] == 0).all()  # before the segment: padding, not memory before input_ids


def test_tree_pack_with_nodes_but_no_rows_stays_inside():
    if not gpu_gate.CUDA_KERNELS:
        pytest.skip(f"{gpu_gate.REQUIRED_TAG} needs a CUDA GPU and packkit's CUDA kernels (_ops_cuda.so)")
    one = torch.tensor([0], device="cuda")
    out = torch.ops.packkit.tree_pack(torch.arange(4, device="cuda"), None, one, one, one + 2, one, one + 2,
                                      torch.tensor([0], device="cuda"), 0, 4, 0, -100)
    torch.cuda.synchronize()
    assert out[5].tolist() == [0, 0]  # cu_seqlens [M + num_rows + 1]: defined, no row read
