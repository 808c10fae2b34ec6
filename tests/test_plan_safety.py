"""Inconsistent plans handed to the raw ops: the CPU ops raise exactly when ``packkit.check_plan``
reports a problem, and both agree with the reference when the plan is consistent.

The same generator (tests/plan_perturb.py) drives the Triton kernels under the interpreter's
bounds checker (tests/triton_interp/test_plan_safety_triton.py) and the CUDA kernels
(tests/gpu/test_cuda_plan_safety.py, which tests/gpu/run.sh also runs under compute-sanitizer).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import packkit
from pack_reference import reference_pack, reference_pack_batch, reference_unpack
from packkit.planning.plan_check import PLAN_ERRORS, plan_errors
from plan_perturb import bad_case

pytestmark = pytest.mark.core

OPS = torch.ops.packkit


def plan_status(c) -> int:
    return int(packkit.check_plan(c.src_offsets, c.seg_seq, c.seg_start, c.seg_length, c.bin_offsets,
                                  num_rows=c.num_rows, row_len=c.row_len, flat=c.flat, num_cu_seqlens=c.num_cu_seqlens,
                                  num_src_tokens=c.src.shape[0], sync=False))


def layout_status(c, num_src_tokens) -> int:
    return int(packkit.check_plan(c.src_offsets, c.seg_seq, c.seg_start, num_rows=c.num_rows, row_len=c.row_len,
                                  flat=c.flat, cu_seqlens=c.cu_seqlens, cu_seg=c.cu_seg,
                                  num_src_tokens=num_src_tokens, sync=False))


def outcome(fn):
    try:
        return fn()
    except RuntimeError:
        return None


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_pack_batch_raises_exactly_when_check_plan_reports(seed):
    c = bad_case(seed)
    status = plan_status(c)
    args = (c.src, None, c.src_offsets, c.seg_seq, c.seg_start, c.seg_length, c.bin_offsets, c.num_rows, c.row_len,
            c.flat, c.num_cu_seqlens)
    out = outcome(lambda: OPS.pack_batch(*args))
    assert (out is None) == (status != 0), (c.changes, plan_errors(status))
    if out is not None:
        ref = reference_pack_batch(*args[:-1], 0, -100, True, 0)
        for got, want in zip(out, ref):
            assert torch.equal(got, want), c.changes


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
@example(seed=41764)  # a bad seg_seq entry that no cu_seg entry names: not an error for pack/unpack
def test_pack_and_unpack_raise_exactly_when_check_plan_reports(seed):
    c = bad_case(seed)
    status = layout_status(c, c.src.shape[0])
    pack_args = (c.src, c.src_offsets, c.seg_seq, c.seg_start, c.cu_seqlens, c.cu_seg, c.num_rows, c.row_len, c.flat)
    out = outcome(lambda: OPS.pack(*pack_args, -1.0, None))
    assert (out is None) == (status != 0), (c.changes, plan_errors(status))
    if out is not None:
        assert torch.equal(out, reference_pack(*pack_args, -1.0))
    shape = (c.row_len,) if c.flat else (c.num_rows, c.row_len)
    packed = torch.arange(c.num_rows * c.row_len, dtype=torch.int64).reshape(shape)
    num_src = max(int(c.src_offsets[-1]), 0) if abs(int(c.src_offsets[-1])) < 2**20 else c.src.shape[0]
    status = layout_status(c, num_src)
    back = outcome(lambda: OPS.unpack(packed, c.src_offsets, c.seg_seq, c.seg_start, c.cu_seqlens, c.cu_seg, c.flat,
                                      num_src, -7.0))
    assert (back is None) == (status != 0), (c.changes, plan_errors(status))
    if back is not None:
        assert torch.equal(back, reference_unpack(packed, c.src_offsets, c.seg_seq, c.seg_start, c.cu_seqlens,
                                                  c.cu_seg, c.flat, -7.0))


def test_generator_makes_both_kinds_and_every_error_kind():
    """Control: the properties above are only meaningful if both outcomes (and every error bit) occur."""
    seen, consistent = 0, 0
    for seed in range(600):
        c = bad_case(seed)
        status = plan_status(c) | layout_status(c, c.src.shape[0])
        seen |= status
        consistent += status == 0
    assert 0.05 * 600 < consistent < 0.6 * 600
    assert seen == sum(PLAN_ERRORS), plan_errors(sum(PLAN_ERRORS) & ~seen)


def test_check_plan_raises_with_every_problem_named():
    good = packkit.plan(torch.tensor([3, 5, 2]).numpy(), 8)
    seq, start, length, offsets = (torch.from_numpy(a.copy()) for a in good.segments)
    src_offsets = torch.tensor([0, 3, 8, 10])
    kwargs = dict(num_rows=good.num_bins, row_len=8, flat=False, num_src_tokens=10)
    num_cu = packkit.pack_layout(good.segments, flat=False, row_len=8).num_cu_seqlens
    assert packkit.check_plan(src_offsets, seq, start, length, offsets, num_cu_seqlens=num_cu, **kwargs) is None
    length[0] += 1
    with pytest.raises(ValueError, match="inside its sequence") as err:
        packkit.check_plan(src_offsets, seq, start, length, offsets, num_cu_seqlens=num_cu, **kwargs)
    assert "num_cu_seqlens" not in str(err.value)
    with pytest.raises(TypeError, match="seg_seq must be int64"):
        packkit.check_plan(src_offsets, seq.int(), start, length, offsets, num_cu_seqlens=num_cu, **kwargs)
    with pytest.raises(ValueError, match="go together"):
        packkit.check_plan(src_offsets, seq, start, length, **kwargs)
    # Two problems at once: both are named, each in PLAN_ERRORS' words.
    offsets[-1] += 1
    with pytest.raises(ValueError) as err:
        packkit.check_plan(src_offsets, seq, start, length, offsets, num_cu_seqlens=num_cu, **kwargs)
    assert PLAN_ERRORS[4] in str(err.value) and PLAN_ERRORS[8] in str(err.value), str(err.value)


def test_reported_asan_reproducer_raises_before_reading():
    """Issue 14's reproducer: one bin_offsets entry out of order made the CPU op walk past seg_length."""
    import numpy as np

    lens = np.array([39, 4, 35, 39, 33, 10, 27, 18, 18, 31, 20])
    seg_seq = torch.tensor([0, 3, 1, 2, 4, 9, 5, 6, 7, 10, 8])
    seg_start = torch.zeros(11, dtype=torch.long)
    seg_len = torch.tensor([39, 39, 4, 35, 33, 31, 10, 27, 18, 20, 18])
    src = torch.randint(0, 100, (int(lens.sum()),))
    offs = torch.from_numpy(np.concatenate(([0], np.cumsum(lens))))
    for bad in ([0, 1, 2, 4, 5, 56, 8, 10, 11], [0, 1, 2, 4, 5, 2**40, 8, 10, 11], [0, 1, 2, 4, -5, 6, 8, 10, 11]):
        with pytest.raises(RuntimeError, match="bin_offsets"):
            OPS.pack_batch(src, None, offs, seg_seq, seg_start, seg_len, torch.tensor(bad), 1, 274, True, 12)
    huge = seg_len.clone()
    huge[3] = 2**62
    with pytest.raises(RuntimeError, match="does not fit|do not fit"):
        OPS.pack_batch(src, None, offs, seg_seq, seg_start, huge, torch.tensor([0, 1, 2, 4, 5, 6, 8, 10, 11]), 1,
                       274, True, 12)
