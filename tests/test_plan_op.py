"""torch.ops.packkit.plan: the C++ planner as a torch op (CSR tensors), its fake impl and tracing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packkit

pytestmark = pytest.mark.core


def sample_inputs():
    """One generator of sample inputs feeding every op test."""
    rng = np.random.default_rng(0)
    yield torch.tensor([5, 3, 9, 2], dtype=torch.int64), 10, {}
    yield torch.from_numpy(rng.integers(0, 300, 200)), 256, {"overlong": "split"}
    yield torch.from_numpy(rng.integers(1, 100, 64)), 128, {"algorithm": "ogbfd", "dp_size": 4, "cost_a": 0.0, "cost_b": 1.0}
    yield torch.from_numpy(rng.integers(1, 100, 64)), 128, {"algorithm": "nf", "dp_size": 2}
    yield torch.zeros(0, dtype=torch.int64), 8, {}


@pytest.mark.parametrize("case", list(sample_inputs()), ids=lambda c: str(c[2]))
def test_op_matches_python_api(case):
    lengths, capacity, kw = case
    seg_seq, seg_start, seg_length, bin_offsets = torch.ops.packkit.plan(lengths, capacity, **kw)
    cost = (kw.get("cost_a", 1.0), kw.get("cost_b", 0.0))
    plan = packkit.plan(lengths, capacity, algorithm=kw.get("algorithm", "obfd"), dp_size=kw.get("dp_size", 1),
                        overlong=kw.get("overlong", "error"), cost=cost)
    for got, want in zip((seg_seq, seg_start, seg_length, bin_offsets), plan.segments):
        assert got.dtype == torch.int64
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("case", list(sample_inputs()), ids=lambda c: str(c[2]))
def test_opcheck(case):
    lengths, capacity, kw = case
    torch.library.opcheck(torch.ops.packkit.plan.default, (lengths, capacity), kw)


def test_op_errors_are_clear():
    with pytest.raises(RuntimeError, match="longer than capacity"):
        torch.ops.packkit.plan(torch.tensor([5, 30]), 10)
    with pytest.raises(RuntimeError, match="negative"):
        torch.ops.packkit.plan(torch.tensor([5, -3]), 10)
    with pytest.raises(RuntimeError, match="unknown algorithm"):
        torch.ops.packkit.plan(torch.tensor([5]), 10, "magic")
    with pytest.raises(RuntimeError, match="int64"):
        torch.ops.packkit.plan(torch.tensor([5.0]), 10)
    with pytest.raises(RuntimeError, match="1-D"):
        torch.ops.packkit.plan(torch.tensor([[5]]), 10)


def test_op_accepts_non_contiguous_lengths():
    lengths = torch.arange(1, 41)[::2]  # 1, 3, ..., 39: a stride-2 view
    got = torch.ops.packkit.plan(lengths, 50)
    want = packkit.plan(lengths.contiguous(), 50).segments
    for g, w in zip(got, want):  # all four CSR arrays, not only seg_seq
        np.testing.assert_array_equal(g.numpy(), w)
    # Read with the stride (not the first 20 int64s of the storage): every sequence whole, once, rows <= 50.
    seg_seq, seg_start, seg_length, bin_offsets = (t.tolist() for t in got)
    assert sorted(seg_seq) == list(range(20)) and set(seg_start) == {0}
    assert [seg_length[seg_seq.index(i)] for i in range(20)] == list(range(1, 41, 2))
    assert all(sum(seg_length[a:b]) <= 50 for a, b in zip(bin_offsets, bin_offsets[1:]))


def test_compile_fullgraph_with_dynamic_output_sizes():
    import torch._dynamo

    def rows_and_tokens(lengths):
        seg_seq, seg_start, seg_length, bin_offsets = torch.ops.packkit.plan(lengths, 64)
        return bin_offsets.numel() - 1, seg_length.sum()

    # config.patch, not monkeypatch: undoing a monkeypatch deletes the entry, and torch then hides it
    # from every later compile in the process ("capture_dynamic_output_shape_ops does not exist").
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(rows_and_tokens, fullgraph=True, dynamic=True)
        rng = np.random.default_rng(1)
        for n in (10, 17, 33):
            lengths = torch.from_numpy(rng.integers(1, 64, n))
            rows, tokens = compiled(lengths)
            plan = packkit.plan(lengths, 64)
            assert int(rows) == plan.num_bins and int(tokens) == plan.kept_tokens
    torch._dynamo.reset()
