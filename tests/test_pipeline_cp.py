"""Context parallelism inside each pipeline stage, in one process (issue 61): pipeline_cp_microbatches gives CP
rank r, for every micro-batch of plan_pipeline, shard_context_parallel's rank-r shard of **that micro-batch's own**
packed row; the ranks' shards of a micro-batch cover its tokens exactly once; every micro-batch's metadata is
self-contained and of one shape, so torch's dim-0 chunking hands each stage its micro-batch's shard; the loss over
the CP ranks is the row's per-token loss; the batch-wide form, positions that are not global and bad arguments are
refused by name. The 4-process pp 2 x cp 2 run is tests/test_pipeline_cp_run.py (full tier)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

import packkit
from packkit.context_parallel import cp_padded_lengths, shard_context_parallel, unshard_context_parallel
from packkit.pipeline import plan_pipeline
from packkit.training.pipeline import check_cp_microbatch, pipeline_cp_microbatches
from pipeline_helpers import LENGTHS, documents

pytestmark = pytest.mark.core

MODES = ("zigzag", "contiguous")
ROW = 40  # the 16 documents zigzag-padded for cp 2 are 264 tokens: 8 micro-batches of 40


def plan_for(cp, mode, row=ROW, m=8):
    return plan_pipeline(cp_padded_lengths(LENGTHS, cp, mode), row, pp_size=2, num_microbatches=m).microbatches[0]


def pre_shard_row(docs, row_len, cp, mode):
    """The micro-batch packed alone: its documents, then a tail the CP padding brings to row_len tokens."""
    tail = row_len - int(cp_padded_lengths([len(d) for d in docs], cp, mode).sum())
    return packkit.pack_sequences(docs, row_len=sum(map(len, docs)) + tail)


@pytest.mark.parametrize("mode", MODES)
def test_each_shard_is_shard_context_parallel_of_its_microbatch(mode):
    cp, seqs = 2, documents()
    mbs = plan_for(cp, mode)
    batches = [pipeline_cp_microbatches(mbs, seqs, cp, r, mode, row_len=ROW) for r in range(cp)]
    slots = batches[0].cu_seq_lens.shape[1] - 1
    for i, row in enumerate(mbs):
        packed = pre_shard_row([seqs[d] for d in row], ROW, cp, mode)
        for r, batch in enumerate(batches):
            want = shard_context_parallel(packed, cp, r, mode, max_sequences=slots)
            for key, got in (("input_ids", batch.input_ids), ("shift_labels", batch.shift_labels),
                             ("position_ids", batch.position_ids), ("seq_idx", batch.seq_idx),
                             ("cu_seq_lens_q", batch.cu_seq_lens)):
                assert torch.equal(got[i].to(torch.int64), want[key].reshape(-1).to(torch.int64)), (i, r, key)
            if mode == "zigzag":
                assert torch.equal(batch.cu_seqlens_padded[i].to(torch.int64), want["cu_seqlens_padded"].to(torch.int64))
            else:
                assert batch.cu_seqlens_padded is None
        # together the ranks cover the micro-batch's row exactly once, in its documents' order
        src = torch.cat([b.src_index[i] for b in batches])
        assert sorted(src[src >= 0].tolist()) == list(range(packed["input_ids"].numel()))
        gathered = torch.stack([b.input_ids[i] for b in batches])
        assert torch.equal(unshard_context_parallel(gathered, batches[0].infos[i]), packed["input_ids"][0])
        real = sum(len(seqs[d]) for d in row)
        assert packed["input_ids"][0, :real].tolist() == [t for d in row for t in seqs[d]]
        # the key side is every rank's own positions / segments, in all_gather's rank order
        width = batches[0].input_ids.shape[1]
        for r, b in enumerate(batches):
            assert torch.equal(batches[0].kv_position_ids[i, r * width:(r + 1) * width], b.position_ids[i])
            assert torch.equal(batches[1].kv_seq_idx[i, r * width:(r + 1) * width], b.seq_idx[i])


@pytest.mark.parametrize("mode", MODES)
def test_metadata_is_each_microbatch_own_and_one_shape(mode):
    """torch's own dim-0 chunking (what schedule.step does) gives every micro-batch a chunk that passes
    check_cp_microbatch: local offsets from 0 to the shard's L tokens, global positions; all chunks one shape."""
    cp = 2
    batch = pipeline_cp_microbatches(plan_for(cp, mode), documents(), cp, 1, mode)
    m, width = batch.input_ids.shape
    assert batch.row_len == ROW and width == ROW // cp and m == 8
    assert batch.num_label_tokens == sum(n - 1 for n in LENGTHS)  # the step's, all CP ranks together
    _, chunks = split_args_kwargs_into_chunks((batch.input_ids,), batch.model_kwargs(), m)
    assert len({tuple((k, tuple(v.shape)) for k, v in sorted(c.items())) for c in chunks}) == 1
    for i, chunk in enumerate(chunks):
        host = check_cp_microbatch(chunk["cu_seq_lens"], width, chunk["position_ids"], cp_size=cp, cp_rank=1, mode=mode)
        assert host[0] == 0 and host[-1] == width and torch.equal(chunk["cu_seq_lens"][0], batch.cu_seq_lens[i])
    if mode == "zigzag":
        assert (batch.cu_seqlens_padded[:, -1] == ROW).all() and (batch.cu_seqlens_padded[:, 0] == 0).all()


def test_the_batch_wide_form_and_local_positions_are_refused():
    """Controls: one batch-wide local cu_seqlens (every micro-batch's shard end to end, the torchtitan PR 4098
    form) chunked by torch, and positions restarting per local segment, are refused naming what is wrong."""
    cp = 2
    batch = pipeline_cp_microbatches(plan_for(cp, "zigzag"), documents(), cp, 1, "zigzag")
    m, width = batch.input_ids.shape
    offsets = [0] + [i * width + c for i, row in enumerate(batch.cu_seq_lens.tolist())
                     for c, prev in zip(row[1:], row[:-1]) if c > prev]
    _, bad = split_args_kwargs_into_chunks((batch.input_ids,), {"cu_seq_lens": torch.tensor(offsets)}, m)
    with pytest.raises(ValueError, match="cu_seq_lens = .* starts at .*4098"):
        check_cp_microbatch(bad[1]["cu_seq_lens"], width, cp_size=cp, cp_rank=1)
    local = torch.zeros(width, dtype=torch.int64)
    cu = batch.cu_seq_lens[0].tolist()
    for a, b in zip(cu[:-1], cu[1:]):
        local[a:b] = torch.arange(b - a)
    with pytest.raises(ValueError, match="position_ids of local segment .* global positions"):
        check_cp_microbatch(batch.cu_seq_lens[:1], width, local, cp_size=cp, cp_rank=1)


@pytest.mark.parametrize("mode", MODES)
def test_the_cp_ranks_losses_add_up_to_the_rows(mode):
    """loss_fn on each rank's logits (the row's logits at its source tokens) against its shift_labels, summed over
    the CP ranks and micro-batches: the per-token next-token loss of every micro-batch's row over the step's count."""
    cp, seqs = 2, documents()
    mbs = plan_for(cp, mode)
    batches = [pipeline_cp_microbatches(mbs, seqs, cp, r, mode) for r in range(cp)]
    gen = torch.Generator().manual_seed(0)
    total, want = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for i, row in enumerate(mbs):
        docs = [seqs[d] for d in row]
        logits = torch.randn(ROW, 97, generator=gen, dtype=torch.float64)
        for b in batches:
            mine = logits[b.src_index[i].clamp(min=0)].unsqueeze(0)
            total += b.loss_fn()(mine, b.shift_labels[i:i + 1])
        start = 0
        for d in docs:
            want += torch.nn.functional.cross_entropy(logits[start:start + len(d) - 1], torch.tensor(d[1:]),
                                                      reduction="sum")
            start += len(d)
    want /= sum(n - 1 for n in LENGTHS)
    assert abs(float(total - want)) <= 1e-12 * abs(float(want))


def test_bad_arguments_are_refused_by_name():
    seqs, mbs = documents(), plan_for(2, "zigzag")
    for kwargs, error, name in [
        (dict(cp_size=2, cp_rank=2), ValueError, "cp_rank"), (dict(cp_size=True, cp_rank=0), TypeError, "cp_size"),
        (dict(cp_size=0, cp_rank=0), ValueError, "cp_size"), (dict(cp_size=2, cp_rank=0, mode="ring"), ValueError, "mode"),
        (dict(cp_size=2, cp_rank=0, row_len=42), ValueError, "row_len=42 must be a multiple of 4"),
        (dict(cp_size=2, cp_rank=0, row_len=36), ValueError, "row_len"),  # under the longest micro-batch (40)
        (dict(cp_size=2, cp_rank=0, row_len=40.0), TypeError, "row_len"),
        (dict(cp_size=2, cp_rank=0, max_sequences=1), ValueError, "max_sequences"),
    ]:
        with pytest.raises(error, match=name):
            pipeline_cp_microbatches(mbs, seqs, **kwargs)
    with pytest.raises(ValueError, match="microbatches names document 16"):
        pipeline_cp_microbatches([[0, 16]], seqs, 2, 0)
    with pytest.raises(ValueError, match="microbatches must be"):
        pipeline_cp_microbatches([[]], seqs, 2, 0)
    batch = pipeline_cp_microbatches(mbs, seqs, 2, 0)
    with pytest.raises(ValueError, match="num_label_tokens"):
        batch.loss_fn(num_label_tokens=batch.num_label_tokens - 1)
    with pytest.raises(TypeError, match="num_label_tokens"):
        batch.loss_fn(num_label_tokens=1.5)
    with pytest.raises(ValueError, match="cp_rank"):
        check_cp_microbatch(batch.cu_seq_lens[:1], 20, cp_size=2, cp_rank=3)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cp=st.integers(1, 4), mode=st.sampled_from(MODES), m=st.integers(1, 5))
def test_property_cover_once_static_shape(seed, cp, mode, m):
    """Any documents, any split into micro-batches: every rank's shards have one shape (row_len / cp tokens), the
    ranks' shards cover each micro-batch's row exactly once, and every chunk passes check_cp_microbatch."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(1, 50, int(n)).tolist() for n in rng.integers(1, 20, m + int(rng.integers(0, 6)))]
    cuts = np.sort(rng.choice(np.arange(1, len(seqs)), m - 1, replace=False)) if m > 1 else []
    mbs = [list(part) for part in np.split(rng.permutation(len(seqs)), cuts)]
    batches = [pipeline_cp_microbatches(mbs, seqs, cp, r, mode) for r in range(cp)]
    width = batches[0].row_len // cp
    for r, b in enumerate(batches):
        assert b.input_ids.shape == (m, width) and b.kv_seq_idx.shape == (m, cp * width)
        for i in range(m):
            check_cp_microbatch(b.cu_seq_lens[i:i + 1], width, b.position_ids[i:i + 1], cp_size=cp, cp_rank=r,
                                mode=mode)
    for i, row in enumerate(mbs):
        src = torch.cat([b.src_index[i] for b in batches])
        real = sum(len(seqs[d]) for d in row)
        got = torch.cat([b.input_ids[i] for b in batches])[src >= 0][torch.argsort(src[src >= 0])]
        assert sorted(src[src >= 0].tolist()) == list(range(batches[0].infos[i].num_tokens))
        assert got[:real].tolist() == [t for d in row for t in seqs[d]]
