"""pack_context_parallel(max_sequences=N): the static-shape contract per CP rank shard (issue 62).

The contract shard equals the exact shard (and shard_context_parallel(pack_sequences(...))) key by key, bit for
bit, except cu_seq_lens_q/k and zigzag's cu_seqlens_padded, which are the exact ones extended to N + 1 offsets by
repeating the last (zero-length slots); a batch with more segments than N is refused by name, never cut."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import packkit

pytestmark = pytest.mark.core

CU_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens_padded")


def _seqs(lengths, seed):
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.integers(1, 1000, n)) for n in lengths]


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 20), min_size=1, max_size=8), extra=st.integers(0, 4), cp=st.integers(1, 4),
       mode=st.sampled_from(["zigzag", "contiguous"]), layout=st.sampled_from(["flat", "padded"]),
       seed=st.integers(0, 2**31))
def test_contract_shard_is_the_exact_shard_but_cu(lengths, extra, cp, mode, layout, seed):
    seqs = _seqs(lengths, seed)
    capacity = 2 * cp * -(-max(lengths) // (2 * cp)) * 2
    opts = dict(capacity=capacity, layout=layout) if layout == "padded" else {}
    packed = packkit.pack_sequences(seqs, **opts)
    total = packed["input_ids"].numel()
    tail = int(mode == "contiguous" and total % cp != 0)  # contiguous: the end CP padding is a local segment
    n = packed["cu_seq_lens_q"].shape[0] - 1 + tail + extra  # bounds every rank's segments (same on all)
    for rank in range(cp):
        exact = packkit.pack_context_parallel(seqs, cp, rank, mode, **opts)
        used = exact["cu_seq_lens_q"].shape[0] - 1  # contiguous: this rank's segments only
        got = packkit.pack_context_parallel(seqs, cp, rank, mode, max_sequences=n, **opts)
        ref = packkit.shard_context_parallel(packed, cp, rank, mode)
        assert set(got) == set(exact) == set(ref)
        for key in exact:
            if key in CU_KEYS:
                cu = exact[key]
                pad = n + 1 - cu.shape[0]
                assert got[key].tolist() == cu.tolist() + [cu[-1].item()] * pad  # zero-length slots at the end
                assert got[key].dtype == cu.dtype and got[key].shape == (n + 1,)
            elif isinstance(exact[key], torch.Tensor):
                assert torch.equal(got[key], exact[key]) and torch.equal(got[key], ref[key]), key
            else:
                assert got[key] == exact[key] == ref[key], key
        assert got["cu_seq_lens_k"] is got["cu_seq_lens_q"] or torch.equal(got["cu_seq_lens_k"], got["cu_seq_lens_q"])
        # seq_idx is the exact shard's: packed-row segment numbers (the end CP padding: S), within the N slots
        assert int(got["seq_idx"].max()) <= n - extra - tail


def test_more_segments_than_slots_refused_by_name():
    seqs = _seqs([3, 4, 5, 6], 0)
    with pytest.raises(ValueError, match=r"needs 4 slots .* max_sequences=3"):
        packkit.pack_context_parallel(seqs, 2, 0, max_sequences=3)
    with pytest.raises(ValueError, match=r"needs 5 slots \(4 documents, 1 padding tails\) but max_sequences=4"):
        packkit.pack_context_parallel(seqs, 2, 0, capacity=32, layout="padded", max_sequences=4)
    out = packkit.pack_context_parallel(seqs, 2, 0, capacity=32, layout="padded", max_sequences=5)  # control
    assert out["cu_seq_lens_q"].shape == (6,)
    with pytest.raises(ValueError, match=r"needs 5 slots \(4 documents, 0 padding tails, the end CP padding\)"):
        packkit.pack_context_parallel(seqs, 4, 3, "contiguous", max_sequences=4)  # 18 tokens on 4 ranks
    assert packkit.pack_context_parallel(seqs, 4, 3, "contiguous", max_sequences=5)["cu_seq_lens_q"].shape == (6,)
    for value, exc in ((0, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(exc, match="max_sequences"):
            packkit.pack_context_parallel(seqs, 2, 0, max_sequences=value)


def test_dynamic_pass_refuses_it_by_name():
    plan = packkit.plan_context_parallel([8, 8], 2, 16)
    with pytest.raises(ValueError, match="max_sequences= is an option of static CP packing"):
        packkit.pack_context_parallel(_seqs([8, 8], 0), plan, 0, 0, max_sequences=4)


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 20), min_size=1, max_size=8), cp=st.integers(1, 4),
       mode=st.sampled_from(["zigzag", "contiguous"]), seed=st.integers(0, 2**31))
def test_shard_context_parallel_takes_the_same_contract(lengths, cp, mode, seed):
    seqs = _seqs(lengths, seed)
    packed = packkit.pack_sequences(seqs)
    n = len(lengths) + 1  # documents + contiguous mode's end CP padding
    for rank in range(cp):
        fused = packkit.pack_context_parallel(seqs, cp, rank, mode, max_sequences=n, max_length_buckets="pow2")
        exact = packkit.pack_context_parallel(seqs, cp, rank, mode)
        got = packkit.shard_context_parallel(packed, cp, rank, mode, max_sequences=n, max_length_buckets="pow2")
        assert set(got) == set(fused)
        for key in fused:
            if isinstance(fused[key], torch.Tensor):
                assert torch.equal(got[key], fused[key]), key
            else:
                assert got[key] == fused[key], key
        local = exact["input_ids"].shape[1]
        want = min(1 << (exact["max_length_q"] - 1).bit_length(), local) if exact["max_length_q"] > 0 else 0
        assert fused["max_length_q"] == fused["max_length_k"] == max(want, exact["max_length_q"])


def _features(lengths, seed):
    return [{"input_ids": s.tolist(), "id": i} for i, s in enumerate(_seqs(lengths, seed))]


@pytest.mark.parametrize("layout", ["flat", "padded"])
@pytest.mark.parametrize("mode", ["zigzag", "contiguous"])
@pytest.mark.parametrize("extra_fields", ["drop", "keep"])  # keep: packed, then sharded (the unfused path)
def test_collator_context_parallel_with_the_contract(layout, mode, extra_fields):
    feats = _features([5, 7, 3, 9, 2], 1)
    cp, n = 2, 8
    for rank in range(cp):
        kw = dict(layout=layout, context_parallel=(cp, rank, mode), extra_fields=extra_fields)
        exact = packkit.PackingCollator(64, **kw)(feats)
        got = packkit.PackingCollator(64, max_sequences=n, **kw)(feats)
        ref = packkit.PackingCollator(64, max_sequences=n, **{**kw, "extra_fields": "drop"})(feats)
        if layout == "flat":  # the contract's flat row is capacity tokens: its padding tail is one more segment
            exact = packkit.PackingCollator(64, pad_to_multiple_of=64, **kw)(feats)
        assert got["cu_seq_lens_q"].shape == (n + 1,)
        used = exact["cu_seq_lens_q"].tolist()
        assert got["cu_seq_lens_q"].tolist() == used + [used[-1]] * (n + 1 - len(used))
        for key in ("input_ids", "labels", "shift_labels", "position_ids", "seq_idx"):
            assert torch.equal(got[key], exact[key]) and torch.equal(got[key], ref[key]), key
        assert got["max_length_q"] == exact["max_length_q"]
    with pytest.raises(ValueError, match="max_sequences=4 slots per shard"):
        packkit.PackingCollator(64, layout=layout, context_parallel=(cp, 0, mode), max_sequences=4,
                                extra_fields=extra_fields)(feats)


@pytest.mark.parametrize("layout", ["flat", "padded"])
@pytest.mark.parametrize("mode", ["zigzag", "contiguous"])
def test_streaming_dataset_context_parallel_with_the_contract(layout, mode):
    rng = np.random.default_rng(0)
    examples = [{"input_ids": list(range(1, int(k) + 1))} for k in rng.integers(1, 12, 60)]
    n, cp = 6, 2
    seen = []
    for item in packkit.PackedIterableDataset(examples, 32, layout=layout, context_parallel=(cp, 0, mode),
                                              max_sequences=n, buffer_size=64, return_example_ids=True,
                                              rows_per_item=2 if layout == "flat" else None):
        cu = item["cu_seq_lens_q"].tolist()
        assert len(cu) == n + 1 and cu == sorted(cu)
        last = next(i for i, v in enumerate(cu) if v == cu[-1])
        assert all(b > a for a, b in zip(cu[:last], cu[1:last + 1]))  # real slots first, then repeats
        assert cu[-1] == item["input_ids"].shape[1]
        ids = item["example_ids"]
        seen += [e for row in ids for e in row] if ids and isinstance(ids[0], list) else list(ids)
    assert sorted(seen) == list(range(60))  # every example once (rank 0 sees every row's shard)
    with pytest.raises(ValueError, match="max_sequences=1 leaves no slot"):
        packkit.PackedIterableDataset(examples, 32, layout="padded", context_parallel=(cp, 0, mode), max_sequences=1)
