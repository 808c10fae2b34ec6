"""The shared-prefix FlexAttention path compiles with dynamic shapes (issue 48, item 8): a training run's batches of
other row counts and lengths reuse the compiled code. A static compile (``dynamic=False``, before) recompiled per
shape until Dynamo's recompile limit (8) dropped to eager flex, which forms the dense S x S scores.

Counted on the CPU through the real path (tree_block_mask + flex_tree_attention) with Dynamo's "eager" backend: the
graphs Dynamo captures are those inductor would compile, without generating code. The control shows the counter
sees a static compile's recompiles."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from packkit.shared_prefix.attention import masks

pytestmark = pytest.mark.core

WARM_UP = [(1, 128), (2, 128), (3, 256), (1, 384)]  # torch specialises sizes 0 / 1: one row, one block
NEW = [(4, 512), (2, 200), (5, 640)]  # then any other batch reuses what is compiled


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def run(rows: int, length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    # Each row one tree: a prefix (seen by every later token) and two sibling completions that never see each other.
    prefix, first = length // 2, length // 2 + length // 4
    subtree_end = torch.full((rows, length), length, dtype=torch.int32)
    subtree_end[:, prefix:first] = first
    q, k, v = (torch.randn(rows, 2, length, 16, generator=g) for _ in range(3))
    out = masks.flex_tree_attention(q, k, v, masks.tree_block_mask(subtree_end), 0.25)
    want = masks.dense_tree_attention(q, k, v, masks.dense_tree_mask(subtree_end), 0.25)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.fixture
def compile_on_cpu(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(masks, "COMPILE_ON", ("cuda", "cpu"))
    monkeypatch.setattr(masks, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(masks, "_compiled", {})
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex's "called without torch.compile" under the eager backend
        yield
    torch._dynamo.reset()


def test_new_batch_shapes_reuse_the_compiled_flex(compile_on_cpu):
    for i, (rows, length) in enumerate(WARM_UP):
        run(rows, length, i)
    warm = graphs()
    assert 0 < warm <= 4 * len(WARM_UP), warm
    for i, (rows, length) in enumerate(NEW):
        run(rows, length, 10 + i)
    assert graphs() == warm, f"{graphs() - warm} recompiles for {len(NEW)} new batch shapes"


def test_control_a_static_compile_recompiles_per_shape(compile_on_cpu):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    static = torch.compile(flex_attention, dynamic=False, backend="eager")
    before = graphs()
    for rows, length in NEW:
        q = torch.randn(rows, 2, length, 16)
        mask = create_block_mask(lambda b, h, i, j: j <= i, rows, None, length, length, device="cpu")
        static(q, q, q, block_mask=mask, scale=0.25)
    assert graphs() - before == len(NEW)
