"""Launch arithmetic at the largest sizes the ops allow (issue 48, fix 4), without allocating them: every launcher
driven with fake tensors (FakeTensorMode: shapes only) and a recorder in place of the launch. Grids stay within
what a device accepts (grid.x <= 2^31 - 1, nothing in y / z), size arguments reach the kernels untruncated (the
layout's item count at 2^31 - 1, where its old i32 loop counter wrapped and never ended: the loops now count in
int64, which tools/triton_aot.py checks in every kernel's TTIR), and the host refuses one past each limit."""
from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - conftest.py already ignores us
    pytest.skip("needs TRITON_INTERPRET=1 set before triton is imported", allow_module_level=True)
pytest.importorskip("triton")

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from packkit.triton_kernels import common, context_parallel, layout, pack, pack_batch, tree_pack, unpack  # noqa: E402

pytestmark = pytest.mark.full

FAMILIES = (layout, pack, pack_batch, unpack, context_parallel, tree_pack)
MAX = 2**31 - 1


@pytest.fixture
def launches(monkeypatch, guarded_outputs):
    log = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                names = self.kernel.arg_names
                log.append((self.kernel.__name__, grid, dict(zip(names, args), **kwargs)))
            return launch

    for family in FAMILIES:
        monkeypatch.setattr(family, "wrap_triton", Recorder)
        monkeypatch.setattr(family, "torch", torch)  # fake outputs, not guarded_outputs' real buffers
    return log


def _fake(mode, n, dtype):
    with mode:
        return torch.empty(n, dtype=dtype)


def _grid_ok(grid):
    assert 1 <= len(grid) <= 3 and 1 <= grid[0] <= MAX and all(1 <= g <= 65535 for g in grid[1:]), grid


def test_grid_refused_past_grid_x():
    assert common._grid_1d("pack", MAX * 2, 2) == (MAX,)
    with pytest.raises(ValueError, match="packkit::triton_pack: .* more than the 2147483647 a grid may have"):
        common._grid_1d("pack", MAX * 2 + 1, 2)


def test_layout_and_pack_batch_at_2_31_items(launches):
    """A flat row of 2^31 - 1 tokens in 2^31 - 2 segments: the layout walks 2^31 - 1 items (its old loop's wrap
    range), the gather's last program starts past 2^31 - 2,048 (positions int64 in the kernel)."""
    mode = FakeTensorMode()
    nseg = MAX - 1
    seg_length, bins = _fake(mode, nseg, torch.int64), torch.tensor([0, nseg])
    with mode:
        bins = mode.from_tensor(bins)
        ids = torch.empty(MAX, dtype=torch.int64)
        offs = torch.empty(2, dtype=torch.int64)
        seg_seq, seg_start = torch.empty(nseg, dtype=torch.int64), torch.empty(nseg, dtype=torch.int64)
        pack.pack_batch(ids, None, offs, seg_seq, seg_start, seg_length, bins, 1, MAX, True, nseg + 2)
    (lay, lay_grid, lay_args), (gather, grid, args) = launches
    assert lay == "_layout_kernel" and lay_grid == (1,)
    assert lay_args["num_items"] == nseg + 1 == MAX and lay_args["num_out"] == nseg + 1 and lay_args["total"] == MAX
    assert gather == "_pack_batch_kernel" and args["num_positions"] == MAX
    _grid_ok(grid)
    assert (grid[0] - 1) * args["BLOCK"] < MAX <= grid[0] * args["BLOCK"]
    with pytest.raises(ValueError, match="num_rows \\* row_len must be < 2\\^31"):
        with mode:
            pack.pack_batch(ids, None, offs, seg_seq, seg_start, seg_length, bins, 1, MAX + 1, True, 2)


def test_pack_unpack_fill_at_the_largest_outputs(launches):
    mode = FakeTensorMode()
    with mode:
        src = torch.empty(MAX, dtype=torch.int8)
        idx = torch.empty(2, dtype=torch.int64)
        cu, cu_seg = torch.empty(2, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
        packed = pack.pack(src, idx, idx[:1], idx[:1], cu, cu_seg, 1, MAX, True, 0.0, None)
        pack.unpack_padded(packed, idx[:1], idx[:1], cu, cu_seg, True, 4096, 2**20, 0.0)  # 2^32 words filled
    names = [n for n, _, _ in launches]
    assert names == ["_pack_kernel", "_fill_kernel", "_unpack_kernel"], names
    for name, grid, args in launches:
        _grid_ok(grid)
    fill = launches[1][2]
    assert fill["n"] == 2**32  # an i64 argument; the kernel indexes in int64
    assert launches[2][2]["num_positions"] == MAX


def test_cp_shard_and_tree_pack_at_their_limits(launches):
    mode = FakeTensorMode()
    with mode:
        ids = torch.empty(8, dtype=torch.int64)
        cu = torch.empty(2, dtype=torch.int32)
        context_parallel.cp_shard(ids, ids, ids, cu, cu, 2, 1, False, MAX // 2, 0, -100)
        with pytest.raises(ValueError, match="out_len \\* cp_size must be in"):
            context_parallel.cp_shard(ids, ids, ids, cu, cu, 2, 1, False, MAX // 2 + 1, 0, -100)
        nodes = [torch.empty(3, dtype=torch.int64) for _ in range(5)]
        rows = 2**16
        tree_pack.tree_pack(ids, None, *nodes, torch.empty(rows + 1, dtype=torch.int64), rows, MAX // rows)
    (cp, cp_grid, _), (tp, tp_grid, tp_args) = launches
    _grid_ok(cp_grid)
    _grid_ok(tp_grid)
    assert tp_grid[0] * tp_args["BLOCK"] >= rows * (MAX // rows) + 3 + rows + 1
