"""Every Triton launch runs under its tensors' device (issue 48, fix 2): Triton launches on the *current* CUDA device
and its stream, so cuda:1 tensors with cuda:0 current would run on the wrong device. One device here, so the seam:
each op family's ``_device_guard`` is replaced by a recorder, and each launch must happen inside a guard entered
with the device of the tensors it launches over."""
from __future__ import annotations

import contextlib
import os
import types

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - conftest.py already ignores us
    pytest.skip("needs TRITON_INTERPRET=1 set before triton is imported", allow_module_level=True)
pytest.importorskip("triton")

import torch  # noqa: E402

import packkit  # noqa: E402,F401
from packkit.triton_kernels import common  # noqa: E402
from packkit.triton_kernels import context_parallel, layout, pack, pack_batch, tree_pack, unpack  # noqa: E402
from shared_prefix_cases import make_case, op_args  # noqa: E402

pytestmark = pytest.mark.full

FAMILIES = (layout, pack, pack_batch, unpack, context_parallel, tree_pack)
OPS = torch.ops.packkit


@pytest.fixture
def guard_log(monkeypatch, isolated_launches):
    log = dict(active=[], launches=[])

    @contextlib.contextmanager
    def recorder(t):
        log["active"].append(t.device)
        try:
            yield
        finally:
            log["active"].pop()

    class Launch:
        def __init__(self, kernel):
            self.inner = isolated_launches(kernel)
            self.name = kernel.__name__

        def __getitem__(self, grid):
            run = self.inner[grid]

            def launch(*args, **kwargs):
                devices = {a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
                log["launches"].append((self.name, list(log["active"]), devices))
                run(*args, **kwargs)
            return launch

    for family in FAMILIES:
        monkeypatch.setattr(family, "_device_guard", recorder)
        monkeypatch.setattr(family, "wrap_triton", Launch)
    return log


def test_every_launch_is_inside_its_tensors_device_guard(guard_log):
    i64, i32 = dict(dtype=torch.int64), dict(dtype=torch.int32)
    offs, seg_seq, seg_start = torch.tensor([0, 3, 9], **i64), torch.tensor([0, 1, 1], **i64), torch.tensor([0, 0, 2], **i64)
    seg_length, bins = torch.tensor([3, 2, 4], **i64), torch.tensor([0, 2, 3], **i64)
    cu, cu_seg = torch.tensor([0, 3, 5, 8], **i32), torch.tensor([0, 1, -1], **i32)
    src = torch.arange(18, dtype=torch.float32).reshape(9, 2)
    pack.layout(seg_length, bins, 2, 8, False, 4)
    packed = pack.pack(src, offs, seg_seq, seg_start, cu, cu_seg, 2, 4, False, 0.0, None)
    pack.unpack(packed, offs, seg_seq, seg_start, cu, cu_seg, False, 9, 0.0)
    pack.unpack_padded(packed, seg_seq, seg_start, cu, cu_seg, False, 2, 6, 0.0)
    pack.pack_batch(torch.arange(9), None, offs, seg_seq, seg_start, seg_length, bins, 2, 8, False, 4)
    ids = torch.arange(9)
    OPS.triton_cp_shard(ids, ids, ids, torch.tensor([0, 3, 9], **i32), torch.tensor([0, 4, 12], **i32), 2, 1, True, 6)
    forest, lay = make_case(1)
    OPS.triton_tree_pack(*op_args(forest, lay))
    names = [name for name, _, _ in guard_log["launches"]]
    assert set(names) == {"_layout_kernel", "_pack_kernel", "_fill_kernel", "_unpack_kernel", "_pack_batch_kernel",
                          "_cp_shard_kernel", "_tree_pack_kernel"}, names
    for name, active, devices in guard_log["launches"]:
        assert active, f"{name} launched outside a device guard"
        assert devices == {active[-1]}, (name, active, devices)


def test_the_guard_makes_the_tensors_cuda_device_current():
    """The real guard: torch.cuda.device(t.device) for CUDA tensors (built, not entered: no GPU here), nothing for
    CPU tensors (the interpreter) and fake tensors (tracing)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    guard = common._device_guard(types.SimpleNamespace(device=torch.device("cuda", 1)))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert isinstance(common._device_guard(torch.zeros(1)), contextlib.nullcontext)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.zeros(2))
    assert isinstance(common._device_guard(fake), contextlib.nullcontext)
