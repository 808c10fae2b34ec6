"""The Triton tree-pack kernel (packkit.triton_kernels.tree_pack), run by the Triton interpreter on CPU tensors,
equals tests/tree_pack_reference.py bit for bit on random forests (many programs), under conftest.py's bounds
checker, with poisoned, guarded outputs."""
from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - conftest.py already ignores us
    pytest.skip("the Triton kernel tests need TRITON_INTERPRET=1 set before triton is imported",
                allow_module_level=True)
pytest.importorskip("triton")

import torch  # noqa: E402

import packkit  # noqa: E402,F401
from conftest import _GuardedTorch  # noqa: E402
from packkit.triton_kernels import tree_pack as ttp  # noqa: E402
from shared_prefix_cases import make_case, op_args  # noqa: E402
from tree_pack_reference import reference_tree_pack  # noqa: E402

pytestmark = pytest.mark.full


@pytest.fixture(autouse=True)
def guarded_outputs(monkeypatch):
    proxy = _GuardedTorch(torch)
    monkeypatch.setattr(ttp, "torch", proxy)
    yield proxy
    proxy.check_guards()


@pytest.mark.parametrize("block", [1024, 8])
@pytest.mark.parametrize("seed", range(6))
def test_triton_tree_pack_matches_reference(seed, block, monkeypatch):
    monkeypatch.setitem(ttp._CONFIG, "block", block)
    forest, layout = make_case(seed, rows=1 + seed % 3)
    args = op_args(forest, layout, id_dtype=torch.int32 if seed % 2 else torch.int64, labels=seed % 3 == 1)
    got = torch.ops.packkit.triton_tree_pack(*args, 5, -7)
    for g, w in zip(got, reference_tree_pack(*args, 5, -7)):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_triton_tree_pack_refuses_bad_metadata():
    forest, layout = make_case(1)
    args = list(op_args(forest, layout))
    args[7] = args[7][:-1]
    with pytest.raises(ValueError, match="row_offsets must be 1-D int64 with num_rows"):
        torch.ops.packkit.triton_tree_pack(*args)
