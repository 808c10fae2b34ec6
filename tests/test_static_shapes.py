"""The fixed (tokens, sequences) contract: max_sequences slots and bucketed max_length (issue 62).

The contract batch must equal the exact-metadata batch everywhere but in cu_seq_lens (extended by repeats of the
last offset) and max_length (rounded up); every attention path packkit ships gives the same loss and gradients on
both (fp64, tiny Llama; the comparison is bit-for-bit: the same documents are computed, zero-length slots add
nothing), and a control shows the comparison sees a wrong boundary.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import packkit
from packkit.packing.static_shapes import bucket

from llama_helpers import VOCAB, loss_and_grads, tiny_llama

pytestmark = [pytest.mark.core, pytest.mark.exactness]


def _seqs(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, n).tolist() for n in lengths]


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=14), n=st.integers(2, 9),
       layout=st.sampled_from(["flat", "padded"]), buckets=st.sampled_from([None, "pow2", [4, 16], [1000]]))
def test_contract_batch_is_the_exact_batch_with_fixed_metadata(lengths, n, layout, buckets):
    seqs = _seqs(lengths)
    cap = 32
    kwargs = dict(layout=layout, capacity=cap) if layout == "padded" else dict(layout="flat", row_len=sum(lengths) + 3)
    per_row = max(n - 1, 1)
    plan = packkit.plan(lengths, cap, max_sequences=per_row)
    if layout == "padded":
        kwargs = dict(layout="padded", plan=plan, row_len=cap, num_rows=plan.num_bins + 1)
    try:
        got = packkit.pack_sequences(seqs, max_sequences=n, max_length_buckets=buckets, **kwargs)
    except ValueError as e:  # only a flat batch with more sequences than slots (the padded plan keeps within)
        assert layout == "flat" and len(lengths) + 1 > n and "max_sequences" in str(e)
        return
    want = packkit.pack_sequences(seqs, **kwargs)
    for key in ("input_ids", "labels", "position_ids", "seq_idx"):
        assert torch.equal(got[key], want[key]), key
    rows = 1 if layout == "flat" else got["input_ids"].shape[0]
    cu, exact = got["cu_seq_lens_q"], want["cu_seq_lens_q"]
    assert cu.shape == (rows * n + 1,) and cu.dtype == torch.int32
    assert torch.equal(cu[:len(exact)], exact) and (cu[len(exact):] == exact[-1]).all()
    assert got["cu_seq_lens_k"] is got["cu_seq_lens_q"]
    longest, row_len = want["max_length_q"], got["input_ids"].shape[-1]
    assert got["max_length_q"] == got["max_length_k"] == bucket(longest, packkit.packing.static_shapes.check_buckets(
        buckets), row_len) >= longest
    assert got["max_length_q"] <= max(row_len, longest)


@pytest.mark.parametrize("value, expect", [(1, 1), (2, 2), (3, 4), (17, 32), (33, 48), (0, 0)])
def test_pow2_buckets_cap_at_the_row(value, expect):
    assert bucket(value, "pow2", 48) == expect
    assert bucket(value, (8, 64), 48) == (0 if value == 0 else 8 if value <= 8 else 48)


def test_values_seen_by_a_compiled_step_are_bounded_by_the_buckets():
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(200):
        lengths = rng.integers(1, 200, rng.integers(1, 12)).tolist()
        b = packkit.pack_sequences(_seqs(lengths), layout="flat", row_len=2048, max_sequences=16,
                                   max_length_buckets="pow2")
        seen.add((b["max_length_q"], tuple(b["cu_seq_lens_q"].shape), tuple(b["input_ids"].shape)))
    assert len({s[1:] for s in seen}) == 1  # one tensor shape
    assert {s[0] for s in seen} <= {2 ** k for k in range(12)}


def test_more_sequences_than_slots_are_refused_never_cut():
    seqs = _seqs([3] * 6)
    with pytest.raises(ValueError, match=r"flat batch holds 7 sequences \(6 documents and its padding\) but "
                                         r"max_sequences=6"):
        packkit.pack_sequences(seqs, layout="flat", row_len=20, max_sequences=6)
    plan = packkit.plan([3] * 6, 20)  # one row of 6 documents and a tail: 7 slots
    with pytest.raises(ValueError, match=r"row 0 holds 6 documents and a padding tail but max_sequences=6"):
        packkit.pack_sequences(seqs, plan=plan, layout="padded", max_sequences=6)
    ok = packkit.pack_sequences(seqs, capacity=20, layout="padded", max_sequences=6)  # planned within: 2 rows
    assert ok["input_ids"].shape == (2, 20) and ok["cu_seq_lens_q"].shape == (13,)
    collate = packkit.PackingCollator(16, max_sequences=4)
    with pytest.raises(ValueError, match="more than capacity=16"):
        collate([{"input_ids": s} for s in _seqs([9, 9])])


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(max_sequences=0), ValueError, "max_sequences must be >= 1"),
    (dict(max_sequences=2.0), TypeError, "max_sequences must be an int"),
    (dict(max_sequences=True), TypeError, "max_sequences must be an int"),
    (dict(max_sequences=2**40), ValueError, "max_sequences must be <="),
    (dict(max_length_buckets="powers"), TypeError, "max_length_buckets must be 'pow2'"),
    (dict(max_length_buckets=[]), ValueError, "at least one int"),
    (dict(max_length_buckets=[4, 2.5]), TypeError, r"max_length_buckets\[1\] must be an int"),
    (dict(max_length_buckets=[True]), TypeError, r"max_length_buckets\[0\] must be an int"),
    (dict(max_length_buckets=[0, 4]), ValueError, r"max_length_buckets\[0\] must be >= 1"),
    (dict(max_length_buckets=range(10_000)), ValueError, "at most 4096"),
])
def test_bad_contract_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        packkit.pack_sequences(_seqs([3, 4]), layout="flat", **kwargs)
    with pytest.raises(exc, match=match):
        packkit.PackingCollator(16, **kwargs)


LENGTHS = [2, 31, 17, 5, 9, 23, 3, 12]


def _loss(model, batch):
    return lambda: model(**batch, use_cache=False).loss


@pytest.mark.parametrize("attn", ["sdpa", "packkit_varlen", "flex"])
@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_attention_paths_are_exact_with_zero_length_slots_and_bucketed_maxima(attn, layout):
    if attn == "packkit_varlen":
        packkit.register_varlen_attention()
    if attn == "flex" and layout == "padded":
        pytest.skip("the flex block mask path is the flat layout's (the collator's return_block_mask)")
    model = tiny_llama(attn="sdpa" if attn == "flex" else attn, dtype=torch.float64).train()
    feats = [{"input_ids": s} for s in _seqs(LENGTHS)]
    common = dict(layout=layout, return_block_mask=attn == "flex")
    if layout == "padded":
        common["num_rows"] = 6
    cap = 128 if layout == "flat" else 48  # flat: the batch's 102 tokens in one fixed row of 128
    fixed = packkit.PackingCollator(cap, max_sequences=10, max_length_buckets="pow2", **common)(feats)
    # the exact-metadata batch of the same tokens (the flat row padded to the same 128)
    exact = packkit.PackingCollator(cap, **common, **({"pad_to_multiple_of": cap} if layout == "flat" else {}))(feats)
    assert fixed["input_ids"].shape == exact["input_ids"].shape
    assert fixed["cu_seq_lens_q"].shape[0] > exact["cu_seq_lens_q"].shape[0]  # slots unused: zero-length ones
    if attn == "flex":  # forward only: torch's flex attention has no CPU backward
        model.set_attn_implementation("flex_attention")
        with torch.no_grad():
            assert torch.equal(model(**fixed).logits, model(**exact).logits)
        return
    want_loss, want_grads = loss_and_grads(model, _loss(model, exact))
    got_loss, got_grads = loss_and_grads(model, _loss(model, fixed))
    assert torch.equal(got_loss, want_loss)
    for name, g in want_grads.items():
        assert torch.equal(got_grads[name], g), name
    if attn == "packkit_varlen":  # control: a wrong boundary in the same slots is seen by the comparison
        bad = dict(fixed)
        cu = fixed["cu_seq_lens_q"].clone()
        cu[1] += 1
        bad["cu_seq_lens_q"] = bad["cu_seq_lens_k"] = cu
        assert not torch.equal(loss_and_grads(model, _loss(model, bad))[0], want_loss)
