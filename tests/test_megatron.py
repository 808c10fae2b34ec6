"""packkit.integrations.megatron against Megatron-Core 0.16.1's own THD consumers on the CPU: its
``get_thd_batch_on_this_cp_rank`` (cp = 1), THD RoPE and packed ``roll_tensor`` restart per document on our
batches; for cp > 1 (TE, GPU in Megatron) the zigzag split equals TE's documented partition (a pure-Python
reference here) and packkit's own ``shard_context_parallel``."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": expected on the CPU
    pytest.importorskip("megatron.core.packed_seq_params")
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd, _apply_rotary_pos_emb_thd
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.multi_token_prediction import roll_tensor
    from megatron.core.utils import get_thd_batch_on_this_cp_rank

import packkit  # noqa: E402
from packkit.integrations.megatron import megatron_pad_multiple, packed_seq_params, thd_batch_on_cp_rank  # noqa: E402

pytestmark = pytest.mark.full


def docs_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 1000, (n,), generator=g) for n in lengths]


def one_rank_group():
    """A real one-rank gloo group without touching torch.distributed's global state (THD RoPE reads its size)."""
    return torch.distributed.ProcessGroupGloo(torch.distributed.HashStore(), 0, 1)


def rope_freqs(n, dim):
    """Megatron's RotaryEmbedding.get_emb (which moves its inverse frequencies to CUDA): [n, 1, 1, dim]."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    f = torch.outer(torch.arange(n, dtype=torch.float32), inv)
    return torch.cat((f, f), dim=-1)[:, None, None, :]


def reference(docs, multiple, pad=0):
    """Megatron's THD batch written out by hand: each document padded at its end, labels shifted inside it."""
    tokens, labels, mask, pos, cup = [], [], [], [], [0]
    for d in docs:
        n = len(d)
        p = -(-n // multiple) * multiple
        d = d.tolist()
        tokens += d + [pad] * (p - n)
        labels += d[1:] + [pad] * (p - n + 1)
        mask += [1.0] * (n - 1) + [0.0] * (p - n + 1)
        pos += list(range(p))
        cup.append(cup[-1] + p)
    return tokens, labels, mask, pos, cup


def te_partition(cup, cp, rank):
    """Transformer Engine's THD load-balanced split (thd_get_partitioned_indices), as documented: each padded
    document in 2*cp equal chunks, rank r taking chunks r and 2*cp-1-r."""
    index = []
    for s, e in zip(cup[:-1], cup[1:]):
        c = (e - s) // (2 * cp)
        index += list(range(s + rank * c, s + (rank + 1) * c))
        index += list(range(s + (2 * cp - 1 - rank) * c, s + (2 * cp - rank) * c))
    return index


def test_pad_multiple_rule():
    assert megatron_pad_multiple() == 1
    assert megatron_pad_multiple(2) == 4
    assert megatron_pad_multiple(1, 4) == 1  # tensor parallel alone splits heads, not the sequence
    assert megatron_pad_multiple(1, 4, True) == 4
    assert megatron_pad_multiple(2, 4, True) == math.lcm(4, 8)
    assert megatron_pad_multiple(4, 3, True) == math.lcm(8, 12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 4]),
       st.booleans())
def test_layout_matches_reference(lengths, cp, tp, sp):
    docs = docs_of(lengths)
    out, params = packed_seq_params(packkit.pack_sequences(docs), cp_size=cp, tp_size=tp, sequence_parallel=sp)
    multiple = megatron_pad_multiple(cp, tp, sp)
    tokens, labels, mask, pos, cup = reference(docs, multiple)
    assert out["tokens"].tolist() == [tokens]
    assert out["labels"].tolist() == [labels]
    assert out["loss_mask"].tolist() == [mask]
    assert out["position_ids"].tolist() == [pos]
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q.tolist() == params.cu_seqlens_kv.tolist() == np.cumsum([0] + lengths).tolist()
    assert params.cu_seqlens_q_padded.tolist() == params.cu_seqlens_kv_padded.tolist() == cup
    assert params.cu_seqlens_q.dtype == params.cu_seqlens_q_padded.dtype == torch.int32
    assert params.max_seqlen_q == params.max_seqlen_kv == max(np.diff(cup))
    assert all(d % multiple == 0 for d in np.diff(cup))


def test_ignored_labels_leave_the_loss():
    docs = docs_of([6, 5])
    lab = [d.clone() for d in docs]
    lab[0][:3] = -100  # a prompt: its next-token labels do not count
    out, _ = packed_seq_params(packkit.pack_sequences(docs, labels=lab), cp_size=2)
    # doc 0 padded to 8: labels of tokens 0..4 are tokens 1..5; tokens 1, 2 and 3 are prompt (ignored).
    assert out["loss_mask"][0, :8].tolist() == [0, 0, 1, 1, 1, 0, 0, 0]
    assert out["labels"][0, :8].tolist() == [0, 0] + docs[0][3:6].tolist() + [0, 0, 0]


def test_megatron_get_thd_batch_cp1_accepts_it():
    docs = docs_of([7, 3, 12, 1])
    out, params = packed_seq_params(packkit.pack_sequences(docs))
    theirs, their_params = get_thd_batch_on_this_cp_rank(
        dict(out), params.cu_seqlens_q, params.cu_seqlens_q_padded, torch.tensor([params.max_seqlen_q]), 1, 0)
    for key in out:
        assert torch.equal(theirs[key], out[key])
    for field in ("qkv_format", "max_seqlen_q", "max_seqlen_kv"):
        assert getattr(their_params, field) == getattr(params, field)
    for field in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        assert torch.equal(getattr(their_params, field), getattr(params, field))


@pytest.mark.parametrize("cp", [1, 2])
def test_thd_rope_restarts_per_document(cp):
    """Megatron's THD RoPE (on cu_seqlens_q_padded, as its attention passes it) of the packed row equals RoPE of
    each document alone; the control (one segment) does not."""
    lengths, heads, dim = [5, 9, 2, 7], 2, 8
    out, params = packed_seq_params(packkit.pack_sequences(docs_of(lengths)), cp_size=cp)
    total = out["tokens"].shape[1]
    t = torch.randn(total, heads, dim, generator=torch.Generator().manual_seed(0))
    freqs = rope_freqs(params.max_seqlen_q, dim)
    got = _apply_rotary_pos_emb_thd(t, params.cu_seqlens_q_padded, freqs, cp_group=one_rank_group())
    cup = params.cu_seqlens_q_padded.tolist()
    for s, e, n in zip(cup[:-1], cup[1:], lengths):
        alone = _apply_rotary_pos_emb_bshd(t[s:s + n].unsqueeze(1), freqs[:n])
        torch.testing.assert_close(got[s:s + n], alone.squeeze(1))
    freqs_row = rope_freqs(total, dim)
    whole_row = torch.tensor([0, total], dtype=torch.int32)
    one = _apply_rotary_pos_emb_thd(t, whole_row, freqs_row, cp_group=one_rank_group())
    assert not torch.allclose(one[cup[1]:cup[1] + lengths[1]], got[cup[1]:cup[1] + lengths[1]])


def test_megatron_roll_tensor_restarts_per_document():
    """Megatron's packed roll (MTP labels) of our tokens gives our shifted labels; without params it leaks."""
    docs = docs_of([4, 6, 1, 5], seed=3)
    out, params = packed_seq_params(packkit.pack_sequences(docs))
    rolled, _ = roll_tensor(out["tokens"].clone(), shifts=-1, dims=-1, packed_seq_params=params)
    assert torch.equal(rolled, out["labels"])
    leaked, _ = roll_tensor(out["tokens"].clone(), shifts=-1, dims=-1)
    assert not torch.equal(leaked, out["labels"])


def test_megatron_roll_tensor_drifts_once_documents_are_padded():
    """What docs/megatron.md says: Megatron 0.16.1's packed roll indexes with the unpadded cu_seqlens_q, so with
    padding (here sequence parallelism, tp = 2) its labels drift; ours stay inside each padded document."""
    docs = docs_of([5, 3, 7], seed=5)
    out, params = packed_seq_params(packkit.pack_sequences(docs), tp_size=2, sequence_parallel=True)
    assert params.cu_seqlens_q.tolist() != params.cu_seqlens_q_padded.tolist()
    rolled, _ = roll_tensor(out["tokens"].clone(), shifts=-1, dims=-1, packed_seq_params=params)
    assert not torch.equal(rolled, out["labels"])
    assert out["labels"][0, :4].tolist() == docs[0][1:].tolist()


@pytest.mark.parametrize("cp,tp,sp", [(2, 1, False), (3, 1, False), (4, 1, False), (2, 4, True), (2, 3, True)])
def test_cp_shards_equal_te_partition(cp, tp, sp):
    lengths = [13, 1, 8, 30, 5]
    batch = packkit.pack_sequences(docs_of(lengths, seed=cp))
    out, params = packed_seq_params(batch, cp_size=cp, tp_size=tp, sequence_parallel=sp)
    cup = params.cu_seqlens_q_padded.tolist()
    seen = []
    for rank in range(cp):
        shard = thd_batch_on_cp_rank(out, params, cp, rank)
        index = te_partition(cup, cp, rank)
        seen += index
        for key in out:
            assert shard[key].tolist() == [out[key][0, index].tolist()], key
        if not sp:  # same padding rule as packkit's own zigzag split of the unpadded batch
            ours = packkit.shard_context_parallel(batch, cp, rank)
            assert torch.equal(ours["input_ids"], shard["tokens"])
            assert torch.equal(ours["position_ids"], shard["position_ids"])
    assert sorted(seen) == list(range(cup[-1]))  # every position on exactly one rank


def test_cp1_part_is_the_whole_batch():
    """cp = 1 (odd documents, nothing padded): the one rank's part is the batch itself."""
    out, params = packed_seq_params(packkit.pack_sequences(docs_of([5, 3, 7])))
    part = thd_batch_on_cp_rank(out, params, 1, 0)
    assert all(torch.equal(part[k], out[k]) for k in out)


def test_planner_counts_the_padding():
    """plan(pad_to_multiple_of=megatron_pad_multiple(...)) rows still fit their capacity once Megatron-padded;
    the control (planned without it) overflows."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, 300).tolist()
    cp, capacity = 4, 1024
    docs = docs_of(lengths)
    multiple = megatron_pad_multiple(cp)

    def padded_rows(plan):
        offsets, order = plan.segments.bin_offsets, plan.segments.seq_index
        totals = []
        for b in range(len(offsets) - 1):
            row = [docs[i] for i in order[offsets[b]:offsets[b + 1]]]
            out, params = packed_seq_params(packkit.pack_sequences(row), cp_size=cp)
            totals.append(out["tokens"].shape[1])
        return totals

    assert max(padded_rows(packkit.plan(lengths, capacity, pad_to_multiple_of=multiple))) <= capacity
    assert max(padded_rows(packkit.plan(lengths, capacity))) > capacity


def test_bad_inputs_are_named():
    docs = docs_of([3, 4])
    flat = packkit.pack_sequences(docs)
    padded = packkit.pack_sequences(docs, capacity=4, layout="padded")  # [2, 4]
    with pytest.raises(ValueError, match="one flat row"):
        packed_seq_params(padded)
    with pytest.raises(ValueError, match="cp_size must be >= 1"):
        packed_seq_params(flat, cp_size=0)
    with pytest.raises(TypeError, match="sequence_parallel must be a bool"):
        packed_seq_params(flat, sequence_parallel=1)
    with pytest.raises(TypeError, match="tp_size must be an int"):
        packed_seq_params(flat, tp_size=2.0)
    with pytest.raises(ValueError, match="no cu_seq_lens_q"):
        packed_seq_params({"input_ids": flat["input_ids"]})
    with pytest.raises(TypeError, match="batch must be a dict"):
        packed_seq_params([1, 2])
    out, params = packed_seq_params(flat, cp_size=2)
    with pytest.raises(ValueError, match="cp_rank must be in"):
        thd_batch_on_cp_rank(out, params, 2, 2)
    with pytest.raises(ValueError, match="not multiples of 2\\*cp_size=8"):
        thd_batch_on_cp_rank(out, params, 4, 0)
    with pytest.raises(TypeError, match="PackedSeqParams"):
        thd_batch_on_cp_rank(out, PackedSeqParams(qkv_format="sbhd"), 2, 0)


def test_padding_tail_is_a_masked_segment():
    """A flat batch padded to row_len (static shapes) keeps its tail as one more segment, out of the loss."""
    docs = docs_of([5, 6])
    plain, _ = packed_seq_params(packkit.pack_sequences(docs), cp_size=2)
    tail, params = packed_seq_params(packkit.pack_sequences(docs, row_len=20), cp_size=2)
    assert params.cu_seqlens_q.tolist() == [0, 5, 11, 20]
    assert params.cu_seqlens_q_padded.tolist() == [0, 8, 16, 28]
    for key in plain:
        assert torch.equal(tail[key][:, :16], plain[key]), key
    assert tail["loss_mask"][0, 16:].sum() == 0 and (tail["tokens"][0, 16:] == 0).all()


def test_megatron_cp_size_bounded_and_meta_batch_refused():
    """packed_seq_params pads every document to 2 * cp_size: cp_size=2**18 took ~228 MB for a few tokens, now a
    ValueError naming cp_size; thd_batch_on_cp_rank handed a meta batch back, now refused by name."""
    from packkit.integrations import megatron

    batch = packkit.pack_sequences([[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match=r"cp_size must be in \[1, 65536\], got 262144"):
        megatron.packed_seq_params(batch, cp_size=2**18)
    out, params = megatron.packed_seq_params(batch, cp_size=2)
    meta = {k: v.to("meta") for k, v in out.items()}
    with pytest.raises(ValueError, match=r"batch\['tokens'\] is a meta tensor"):
        megatron.thd_batch_on_cp_rank(meta, params, 2, 0)
