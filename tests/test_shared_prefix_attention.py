"""Tree attention over random forests of multi-level trees (empty nodes, single tokens, G = 1 chains, several trees
and rows, padding tails): the dense mask is the ancestor relation; FlexAttention and the two-pass varlen math equal
dense masked attention in fp64, values and gradients; the passes copy nothing and do no filler work. With a logit
soft-cap (Gemma 2) and per-head sink logits (GPT-OSS), every path equals a masked softmax written from the definition
(the sink as one more softmax column), the sinks' gradient included."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from packkit import shared_prefix as sp
from packkit.shared_prefix.attention.masks import (dense_tree_attention, dense_tree_mask, flex_tree_attention,
                                                   tree_block_mask)
from packkit.shared_prefix.attention.two_pass import two_pass_attention, varlen_passes
from packkit.shared_prefix.layout import tree_layout

from shared_prefix_cases import forests, laid_out as base_laid_out

pytestmark = [pytest.mark.core, pytest.mark.exactness]


def laid_out(spec, rows: int):
    forest, layout = base_laid_out(spec, rows)
    row_len = layout.row_len
    subtree_end = torch.full((rows, row_len), row_len, dtype=torch.int32)
    node_of = torch.full((rows * row_len,), -1, dtype=torch.long)
    for p in range(len(layout.order)):
        if layout.length[p] == 0:
            continue
        r, off = divmod(int(layout.dst[p]), row_len)
        subtree_end[r, off:off + int(layout.length[p])] = int(layout.end[p])
        node_of[layout.dst[p]:layout.dst[p] + layout.length[p]] = p
    return forest, layout, subtree_end, node_of


def ancestor_mask(layout, node_of, rows, row_len) -> torch.Tensor:
    """From the definition: q sees k iff k's node is an ancestor of q's node, or the same node and k <= q; padding
    sees its own row's padding causally."""
    parent = np.full(len(layout.order), -1)
    stack = []
    for p in range(len(layout.order)):  # packed preorder: the parent is the last shallower node before p
        while stack and layout.depth[stack[-1]] >= layout.depth[p]:
            stack.pop()
        parent[p] = stack[-1] if stack and layout.depth[p] > 0 else -1
        stack.append(p)
    out = torch.zeros(rows, 1, row_len, row_len, dtype=torch.bool)
    for r in range(rows):
        for q in range(row_len):
            nq = int(node_of[r * row_len + q])
            for k in range(q + 1):
                nk = int(node_of[r * row_len + k])
                if nq < 0:
                    out[r, 0, q, k] = bool(nk < 0)
                    continue
                a = nq
                while a >= 0 and a != nk:
                    a = parent[a]
                out[r, 0, q, k] = bool(a == nk and nk >= 0)
    return out


@settings(max_examples=60, deadline=None)
@given(forests, st.integers(1, 3))
def test_dense_mask_is_the_ancestor_relation(spec, rows):
    _, layout, subtree_end, node_of = laid_out(spec, rows)
    assert torch.equal(dense_tree_mask(subtree_end), ancestor_mask(layout, node_of, rows, layout.row_len))


def dense_attention(q, k, v, mask, scale):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def qkv(rows, row_len, heads=2, dim=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, heads, row_len, dim, generator=g, dtype=dtype, requires_grad=True) for _ in range(3)]


def flat(x):  # [B, H, S, D] -> [B*S, H, D]
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d)


@settings(max_examples=60, deadline=None)
@given(forests, st.integers(1, 3), st.integers(0, 2 ** 16))
def test_two_pass_equals_dense_values_and_gradients_fp64(spec, rows, seed):
    forest, layout, subtree_end, _ = laid_out(spec, rows)
    q, k, v = qkv(rows, layout.row_len, seed=seed)
    scale = 0.7
    ref = dense_attention(q, k, v, dense_tree_mask(subtree_end), scale)
    grad = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    passes = varlen_passes(layout, torch.device("cpu"))
    assert len(passes) == 1 + (int(layout.depth.max()) if len(layout.depth) else 0)
    out = two_pass_attention(flat(q), flat(k), flat(v), passes, scale)
    got = out.reshape(rows, layout.row_len, *out.shape[1:]).transpose(1, 2)
    assert torch.allclose(got, ref, rtol=0, atol=1e-12)
    grads = torch.autograd.grad(got, (q, k, v), grad)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=0, atol=1e-11)


@settings(max_examples=25, deadline=None)
@given(forests, st.integers(1, 2))
def test_two_pass_fp32(spec, rows):
    _, layout, subtree_end, _ = laid_out(spec, rows)
    q, k, v = qkv(rows, layout.row_len, dtype=torch.float32)
    ref = dense_attention(q, k, v, dense_tree_mask(subtree_end), 0.5)
    out = two_pass_attention(flat(q), flat(k), flat(v), varlen_passes(layout, torch.device("cpu")), 0.5)
    got = out.reshape(rows, layout.row_len, *out.shape[1:]).transpose(1, 2)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(forests, st.integers(1, 3))
def test_flex_equals_dense_fp64(spec, rows):
    _, layout, subtree_end, _ = laid_out(spec, rows)
    q, k, v = (t.detach() for t in qkv(rows, layout.row_len))
    ref = dense_attention(q, k, v, dense_tree_mask(subtree_end), 0.3)
    got = flex_tree_attention(q, k, v, tree_block_mask(subtree_end, block_size=8), 0.3)
    assert torch.allclose(got, ref, rtol=0, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(forests, st.integers(1, 3))
def test_passes_copy_nothing_and_fillers_do_no_work(spec, rows):
    _, layout, subtree_end, _ = laid_out(spec, rows)
    total = rows * layout.row_len
    passes = varlen_passes(layout, torch.device("cpu"))
    mask = dense_tree_mask(subtree_end)[:, 0]
    pairs_needed = int(mask.sum())  # (query, key) pairs the tree attention must compute
    causal_work = 0
    cross_work = 0
    for i, p in enumerate(passes):
        for cu in (p.host_cu_q, p.host_cu_k):
            assert cu[0] == 0 and cu[-1] == total and (np.diff(cu) >= 0).all()  # partitions [0, T] on both axes
        lq, lk = np.diff(p.host_cu_q), np.diff(p.host_cu_k)
        if i == 0:
            assert (lq == lk).all() and p.causal
            causal_work += int((lq * (lq + 1) // 2).sum())
        else:
            assert not p.causal
            cross_work += int((lq * lk).sum())  # fillers have one empty side: they add nothing
            covered = np.zeros(total, bool)
            for j in range(len(lq)):
                if lq[j] and lk[j]:
                    covered[p.host_cu_q[j]:p.host_cu_q[j + 1]] = True
            assert np.array_equal(covered, p.query_mask.numpy())
    assert causal_work + cross_work == pairs_needed


def _tiny_tree():
    """A 7-token tree (prompt of 3, completions of 2 and 1), its passes and fp64 q, k, v for gradcheck."""
    forest = sp.groups_forest([[1, 2, 3]], [[[4, 5], [6]]])
    passes = varlen_passes(tree_layout(forest, [forest.roots()], 7), torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    return (passes, *(torch.randn(7, 2, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)))


def test_gradcheck_tiny_tree():
    passes, q, k, v = _tiny_tree()
    assert torch.autograd.gradcheck(lambda a, b, c: two_pass_attention(a, b, c, passes, 0.5), (q, k, v))


def test_control_a_mask_letting_siblings_see_each_other_differs():
    forest = sp.groups_forest([[1, 2, 3]], [[[4, 5], [6, 7]]])
    layout = tree_layout(forest, [forest.roots()], 7)
    subtree_end = torch.tensor([[7, 7, 7, 5, 5, 7, 7]], dtype=torch.int32)
    leaky = torch.tensor([[7, 7, 7, 7, 7, 7, 7]], dtype=torch.int32)  # branch 1's keys visible to branch 2
    q, k, v = qkv(1, 7)
    ref = dense_attention(q, k, v, dense_tree_mask(subtree_end), 0.5)
    out = two_pass_attention(flat(q), flat(k), flat(v), varlen_passes(layout, torch.device("cpu")), 0.5)
    assert torch.allclose(out.reshape(1, 7, 2, 4).transpose(1, 2), ref, atol=1e-12)
    assert not torch.allclose(dense_attention(q, k, v, dense_tree_mask(leaky), 0.5), ref, atol=1e-3)


def capped_sink_reference(q, k, v, mask, scale, softcap, sink):
    """From the definitions: scores soft-capped, masked; the sink one more softmax column, dropped after it."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sink is None:
        return torch.softmax(scores, -1) @ v
    column = sink.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1] @ v


def sinks(heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(heads, generator=g, dtype=torch.float64)).requires_grad_(True)


CAP_SINK = [(0.8, True), (0.8, False), (None, True)]


@settings(max_examples=40, deadline=None)
@given(forests, st.integers(1, 3), st.integers(0, 2 ** 16), st.sampled_from(CAP_SINK))
def test_two_pass_softcap_and_sinks_equal_reference_values_and_gradients(spec, rows, seed, case):
    softcap, with_sink = case
    _, layout, subtree_end, _ = laid_out(spec, rows)
    q, k, v = qkv(rows, layout.row_len, seed=seed)
    sink = sinks(seed=seed) if with_sink else None
    inputs = (q, k, v) + ((sink,) if with_sink else ())
    scale = 1.7  # scores of several units: the soft-cap bends them
    ref = capped_sink_reference(q, k, v, dense_tree_mask(subtree_end), scale, softcap, sink)
    grad = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, inputs, grad)
    out = two_pass_attention(flat(q), flat(k), flat(v), varlen_passes(layout, torch.device("cpu")), scale, softcap,
                             sink)
    got = out.reshape(rows, layout.row_len, *out.shape[1:]).transpose(1, 2)
    assert torch.allclose(got, ref, rtol=0, atol=1e-12)
    for g, r in zip(torch.autograd.grad(got, inputs, grad), ref_grads):
        assert torch.allclose(g, r, rtol=0, atol=1e-11)
    dense = dense_tree_attention(q, k, v, dense_tree_mask(subtree_end), scale, softcap, sink)
    assert torch.allclose(dense, ref, rtol=0, atol=1e-12)
    for g, r in zip(torch.autograd.grad(dense, inputs, grad), ref_grads):
        assert torch.allclose(g, r, rtol=0, atol=1e-11)


@settings(max_examples=15, deadline=None)
@given(forests, st.integers(1, 3), st.sampled_from(CAP_SINK))
def test_flex_softcap_and_sinks_equal_reference(spec, rows, case):
    softcap, with_sink = case
    _, layout, subtree_end, _ = laid_out(spec, rows)
    q, k, v = (t.detach() for t in qkv(rows, layout.row_len))
    sink = sinks().detach() if with_sink else None
    ref = capped_sink_reference(q, k, v, dense_tree_mask(subtree_end), 1.7, softcap, sink)
    got = flex_tree_attention(q, k, v, tree_block_mask(subtree_end, block_size=8), 1.7, softcap, sink)
    assert torch.allclose(got, ref, rtol=0, atol=1e-12)


def test_gradcheck_tiny_tree_softcap_and_sink():
    passes, q, k, v = _tiny_tree()
    assert torch.autograd.gradcheck(lambda a, b, c, s: two_pass_attention(a, b, c, passes, 1.5, 0.7, s),
                                    (q, k, v, sinks()))


def test_control_a_dropped_softcap_or_sink_differs():
    """The reference comparison above would catch a path that ignored either argument."""
    forest = sp.groups_forest([[1, 2, 3]], [[[4, 5], [6, 7]]])
    layout = tree_layout(forest, [forest.roots()], 7)
    mask = dense_tree_mask(torch.tensor([[7, 7, 7, 5, 5, 7, 7]], dtype=torch.int32))
    q, k, v = qkv(1, 7)
    passes = varlen_passes(layout, torch.device("cpu"))
    ref = capped_sink_reference(q, k, v, mask, 1.7, 0.8, sinks())
    for softcap, sink in ((None, sinks()), (0.8, None)):
        out = two_pass_attention(flat(q), flat(k), flat(v), passes, 1.7, softcap, sink)
        assert not torch.allclose(out.reshape(1, 7, 2, 4).transpose(1, 2), ref, atol=1e-3)


def test_two_pass_softcap_and_sinks_fp32():
    """fp32 runs the same math with fp32 accumulation (the CPU flash kernels take no soft-cap)."""
    forest = sp.groups_forest([[1, 2, 3, 4]], [[[5, 6, 7], [8], [9, 10]]])
    layout = tree_layout(forest, [forest.roots()], 10)
    mask = dense_tree_mask(torch.tensor([[10, 10, 10, 10, 7, 7, 7, 8, 10, 10]], dtype=torch.int32))
    q, k, v = qkv(1, 10)
    sink = sinks()
    ref = capped_sink_reference(q, k, v, mask, 1.7, 0.8, sink)
    out = two_pass_attention(*(flat(t).float() for t in (q, k, v)), varlen_passes(layout, torch.device("cpu")), 1.7,
                             0.8, sink.float())
    assert out.dtype == torch.float32
    assert torch.allclose(out.double().reshape(1, 10, 2, 4).transpose(1, 2), ref, rtol=0, atol=1e-5)
