"""Inconsistent plans through the device ops on a GPU: no fault (an illegal address would surface at the
synchronize after every case and poison the context for the rest of the module), every inconsistency
reported by ``packkit.check_plan`` on the device, consistent plans equal to the reference.

tests/gpu/run.sh runs this module under ``compute-sanitizer --tool memcheck`` (and racecheck), which
also catches accesses that stay inside the allocation pool and would go unnoticed otherwise.
PACKKIT_SAFETY_EXAMPLES sets the number of plans per backend (default 300).
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpu_gate
import packkit
from gpu_gate import ops_for
from pack_reference import reference_pack, reference_pack_batch, reference_unpack
from plan_perturb import bad_case

pytestmark = pytest.mark.full

EXAMPLES = int(os.environ.get("PACKKIT_SAFETY_EXAMPLES", "300"))
BACKENDS = [pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]


def _raises_on_cpu(fn):
    try:
        fn()
    except RuntimeError:
        return True
    return False


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1))
def test_inconsistent_plans_never_fault_and_are_reported(backend, seed):
    ops = ops_for(backend)
    host = bad_case(seed)
    c = host.to("cuda")
    args = (c.src, None, c.src_offsets, c.seg_seq, c.seg_start, c.seg_length, c.bin_offsets, c.num_rows, c.row_len,
            c.flat)
    status = packkit.check_plan(c.src_offsets, c.seg_seq, c.seg_start, c.seg_length, c.bin_offsets,
                                num_rows=c.num_rows, row_len=c.row_len, flat=c.flat, num_cu_seqlens=c.num_cu_seqlens,
                                num_src_tokens=c.src.shape[0], sync=False)
    assert status.is_cuda
    try:
        out = ops.pack_batch(*args, c.num_cu_seqlens)
    except (RuntimeError, ValueError):  # metadata checked on the host, before any launch
        out = None
    lay = packkit.check_plan(c.src_offsets, c.seg_seq, c.seg_start, num_rows=c.num_rows, row_len=c.row_len,
                             flat=c.flat, cu_seqlens=c.cu_seqlens, cu_seg=c.cu_seg, num_src_tokens=c.src.shape[0],
                             sync=False)
    seg_args = (c.src_offsets, c.seg_seq, c.seg_start, c.cu_seqlens, c.cu_seg)
    packed = ops.pack(c.src, *seg_args, c.num_rows, c.row_len, c.flat, -1.0, None)
    back = ops.unpack(packed, *seg_args, c.flat, c.src.shape[0], -7.0)
    ops.unpack_padded(packed, c.seg_seq, c.seg_start, c.cu_seqlens, c.cu_seg, c.flat, c.src_offsets.numel() - 1, 5,
                      -7.0)
    torch.cuda.synchronize()  # a fault in any launch above raises here

    host_args = (host.src, None, host.src_offsets, host.seg_seq, host.seg_start, host.seg_length, host.bin_offsets,
                 host.num_rows, host.row_len, host.flat)
    cpu_rejects = _raises_on_cpu(lambda: torch.ops.packkit.pack_batch(*host_args, host.num_cu_seqlens))
    assert (int(status) != 0) == cpu_rejects, host.changes
    if not cpu_rejects and out is not None:
        for got, want in zip(out, reference_pack_batch(*host_args, 0, -100, True, 0)):
            assert torch.equal(got.cpu(), want), host.changes
    if int(lay) == 0:
        host_seg = (host.src_offsets, host.seg_seq, host.seg_start, host.cu_seqlens, host.cu_seg)
        assert torch.equal(packed.cpu(), reference_pack(host.src, *host_seg, host.num_rows, host.row_len, host.flat,
                                                        -1.0)), host.changes
        if int(host.src_offsets[-1]) == host.src.shape[0]:
            assert torch.equal(back.cpu(), reference_unpack(packed.cpu(), *host_seg, host.flat, -7.0)), host.changes
