"""Regression tests for what the ASan + UBSan build found (tests/sanitize/run.sh). In a normal build
they check the results; under the sanitizers the bug itself aborts the run."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import packkit  # noqa: F401  (registers torch.ops.packkit)

pytestmark = pytest.mark.full

OPS = torch.ops.packkit


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.bool, torch.int32])
def test_unpack_to_an_empty_output(dtype):
    """UBSan (csrc/ops/pack_op.cpp fill_elements): memset(nullptr, pad, 0) for an empty 1-byte output,
    e.g. unpacking a batch that holds only padding; the CPU op must not pass a null pointer."""
    packed = torch.zeros(1, 4, dtype=dtype)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    cu_seg = torch.tensor([-1], dtype=torch.int32)
    none = torch.zeros(0, dtype=torch.int64)
    out = OPS.unpack(packed, torch.zeros(1, dtype=torch.int64), none, none, cu, cu_seg, False, 0, 0.0)
    assert out.shape == (0,) and out.dtype == dtype
    out = OPS.unpack_padded(packed, none, none, cu, cu_seg, False, 0, 3, 0.0)
    assert out.shape == (0, 3) and out.dtype == dtype


def test_plan_dp_size_that_overflows_the_row_count():
    """UBSan (csrc/planner/dp_layout.cpp round_up): signed overflow for dp_size = 2**63 - 1; now refused."""
    with pytest.raises(RuntimeError, match=r"dp_size must be in \[1, 16777216\]"):
        OPS.plan(torch.tensor([6] * 7), 10, "obfd", "error", 2**63 - 1)


def test_grouped_fit_at_capacity_int64_max():
    """UBSan (csrc/planner/group_fit.cpp): the least-load sentinels were capacity + 1, a signed overflow at
    capacity = 2^63 - 1 (found by the vlcost50 session's sanitized planner run). Under UBSan this fails on the old
    code; everywhere it checks the plan."""
    plan = packkit.plan([1, 2, 3, 5, 7], 2**63 - 1, algorithm="ogbfd", dp_size=2)
    seq = sorted(int(s) for s in plan.segments[0])
    assert seq == [0, 1, 2, 3, 4]


def test_split_near_int64_max_ends():
    """Fuzz finding (corpus/plan/oom-split-overflow): splitting a length within `capacity` of 2^63 overflowed
    the piece cursor (csrc/planner/overlong.cpp) and never ended, until out of memory."""
    cap = 2**62
    plan = packkit.plan([cap + 5, 219, 273], cap, algorithm="nf", overlong="split")
    seq, start, length, _ = plan.segments
    pieces = sorted((int(s), int(a), int(n)) for s, a, n in zip(seq, start, length))
    assert pieces == [(0, 0, cap), (0, cap, 5), (1, 0, 219), (2, 0, 273)]
    assert plan.split.tolist() == [0]


def test_layout_with_zero_row_len_and_huge_num_rows_ends():
    """Fuzz finding (tests/fuzz/corpus/ops/ops-timeout-zero-row-len): with row_len = 0 nothing bounded
    num_rows, and the CPU layout looped over 2^62 rows. Run in a child process so a regression cannot
    hang the suite."""
    code = ("import torch, packkit\n"
            "try:\n"
            "    torch.ops.packkit.layout(torch.zeros(0, dtype=torch.long), torch.zeros(1, dtype=torch.long),"
            " 2**62, 0, False, 2)\n"
            "except RuntimeError as e:\n"
            "    print('refused:', e)\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("layout with row_len=0 and num_rows=2**62 did not end within 60 s")
    assert proc.returncode == 0 and "refused: " in proc.stdout and "packkit::layout" in proc.stdout, proc.stderr


@pytest.mark.parametrize("overlong", ["split", "drop", "truncate"])
def test_many_split_pieces_near_int64_max(overlong):
    """CI fuzz finding (UBSan, csrc/planner/overlong.cpp make_items; corpus/plan/crash-split-pieces-overflow): counting the pieces of two lengths near
    2^63 at capacity 1 overflowed the piece count, under every policy. The count now saturates: "split" is
    refused (more pieces than a plan holds), "drop" and "truncate" are reported per sequence."""
    big = 2**63 - 2
    if overlong == "split":
        with pytest.raises(ValueError, match="a plan holds at most 2147483647 items"):
            packkit.plan([big, big], 1, algorithm="nf", overlong="split")
        return
    plan = packkit.plan([big, 3, big], 1, algorithm="nf", overlong=overlong)
    seq, _, length, _ = plan.segments
    if overlong == "drop":
        assert plan.dropped.tolist() == [0, 1, 2]
        assert seq.size == 0
    else:
        assert sorted(seq.tolist()) == [0, 1, 2] and length.tolist() == [1, 1, 1]

