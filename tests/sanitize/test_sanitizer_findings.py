"""Regression tests for what the ASan + UBSan build found (tests/sanitize/run.sh). In a normal build
they check the results; under the sanitizers the bug itself aborts the run."""
from __future__ import annotations

import pytest
import torch

import packkit  # noqa: F401  (registers torch.ops.packkit)

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
