"""``packkit::tree_pack`` (shared-prefix packing, issue 30): every backend equals tests/tree_pack_reference.py bit for
bit on random forests (several rows, empty nodes, full rows and padding tails; int32/int64 ids, labels or not), into
poisoned memory; opcheck; torch.compile(fullgraph=True); the CPU op refuses every inconsistent layout with a
message naming it. CUDA and Triton twins run on a GPU (tests/gpu/run.sh); the interpreted Triton kernel in
tests/triton_interp/test_tree_pack_triton.py."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import gpu_gate
import packkit  # noqa: F401  (loads the ops)
from gpu_gate import on
from shared_prefix_cases import forests, laid_out, make_case, op_args
from tree_pack_reference import reference_tree_pack

pytestmark = pytest.mark.core

BACKENDS = ["cpu", pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]


def op_for(backend):
    if backend == "triton":
        from packkit.triton_kernels import tree_pack as _registers  # noqa: F401

        return torch.ops.packkit.triton_tree_pack
    return torch.ops.packkit.tree_pack


def assert_equal(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w), (g, w)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(12))
def test_matches_the_reference_bit_for_bit(backend, seed):
    device = on(backend)
    forest, layout = make_case(seed, rows=1 + seed % 3)
    for id_dtype in (torch.int64, torch.int32):
        for labels in (False, True):
            args = op_args(forest, layout, id_dtype=id_dtype, labels=labels, device=device)
            torch.full((1 << 18,), 0x5A, dtype=torch.uint8, device=device)  # poison the allocator's next blocks
            got = op_for(backend)(*args, 7, -1)
            assert_equal(got, reference_tree_pack(*args, 7, -1))


@settings(max_examples=80, deadline=None)
@given(forests, st.integers(1, 4), st.integers(0, 3))
def test_property_cpu_equals_reference(spec, rows, slack):
    forest, layout = laid_out(spec, rows, slack)
    args = op_args(forest, layout, labels=bool(slack % 2))
    assert_equal(torch.ops.packkit.tree_pack(*args), reference_tree_pack(*args))


def test_opcheck():
    for seed in range(4):
        forest, layout = make_case(seed, rows=2)
        for labels in (False, True):
            torch.library.opcheck(torch.ops.packkit.tree_pack.default, op_args(forest, layout, labels=labels) + (0, -100))


def test_torch_compile_fullgraph():
    forest, layout = make_case(3, rows=2)
    args = op_args(forest, layout)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def packed(*a):
        ids, lab, pos, node, end, cu = torch.ops.packkit.tree_pack(*a)
        return ids + 0, pos * 1, end, cu

    got = packed(*args)
    want = reference_tree_pack(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[2]) and torch.equal(got[3], want[5])


def _bad(args, index, value):
    out = list(args)
    out[index] = value
    return out


@pytest.mark.parametrize("change, match", [
    (lambda a: _bad(a, 0, a[0].float()), "input_ids must be int64 or int32"),
    (lambda a: _bad(a, 0, a[0].view(1, -1)), "flat 1-D source"),
    (lambda a: _bad(a, 1, torch.zeros(1, dtype=torch.long)), "one label per source token"),
    (lambda a: _bad(a, 2, a[2][:-1]), "must have one entry per node"),
    (lambda a: _bad(a, 4, a[4].int()), "node_len must be int64"),
    (lambda a: _bad(a, 7, a[7][:-1]), "row_offsets needs num_rows \\+ 1"),
    (lambda a: _bad(a, 9, -1), "must be >= 0"),
    (lambda a: _bad(a, 9, 2 ** 31), "must fit int32"),
    (lambda a: _bad(a, 2, a[2] + 1000), "reads source tokens"),
    (lambda a: _bad(a, 3, a[3] + 1), "must start at"),
    (lambda a: _bad(a, 4, a[4] - 100), "is negative"),
    (lambda a: _bad(a, 5, a[5] - 100), "node_pos\\[0\\] = -"),
    (lambda a: _bad(a, 6, a[6] + 1000), "node_end\\[0\\]"),
    (lambda a: _bad(a, 7, a[7].flip(0)), "row_offsets must run from 0"),
    (lambda a: _bad(a, 9, 1), "need more than row_len"),
])
def test_bad_layouts_are_refused_on_the_cpu(change, match):
    forest, layout = make_case(5, rows=2)
    args = op_args(forest, layout, labels=True)
    assert int(args[4][0]) > 0  # the changes above assume a non-empty first node
    with pytest.raises(RuntimeError, match=match):
        torch.ops.packkit.tree_pack(*change(args))
