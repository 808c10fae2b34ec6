"""Packed micro-batches for torch.distributed.pipelining, in one process (issue 61 part 3): the builder's
micro-batches are self-contained, torch's own dim-0 chunking gives each stage its micro-batch's metadata, the
PR 4098 form (a batch-wide cu_seqlens chunked by the schedule) is refused. The model runs (the stages in one
process, and over gloo) are tests/test_pipeline_run.py (full tier)."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

from packkit.pipeline import plan_pipeline
from packkit.training.pipeline import check_microbatch, pipeline_microbatches, split_layers
from pipeline_helpers import CAPACITY, LENGTHS, documents

pytestmark = pytest.mark.core


def step_batch(m=8):
    plan = plan_pipeline(LENGTHS, CAPACITY, pp_size=2, num_microbatches=m)
    return plan, pipeline_microbatches(plan.microbatches[0], documents())


def test_each_microbatch_is_self_contained():
    plan, batch = step_batch()
    seqs = documents()
    m, tokens = batch.input_ids.shape
    assert m == len(plan.microbatches[0]) and batch.cu_seq_lens.shape[0] == m
    for i, row in enumerate(plan.microbatches[0]):
        cu = batch.cu_seq_lens[i].tolist()
        lengths = [len(seqs[d]) for d in row]
        assert cu[0] == 0 and cu[-1] == tokens and cu[1:len(row) + 1] == list(torch.tensor(lengths).cumsum(0))
        ids = batch.input_ids[i, :sum(lengths)].tolist()
        assert ids == [t for d in row for t in seqs[d]]
        for j, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
            assert batch.position_ids[i, a:b].tolist() == list(range(b - a))
            assert (batch.seq_idx[i, a:b] == j).all()
    assert batch.num_label_tokens == sum(n - 1 for n in LENGTHS)


def test_torch_chunking_gives_each_stage_its_own_metadata():
    _, batch = step_batch()
    args, kwargs = split_args_kwargs_into_chunks((batch.input_ids,), batch.model_kwargs(), batch.num_microbatches)
    for i, (a, kw) in enumerate(zip(args, kwargs)):
        assert torch.equal(a[0], batch.input_ids[i:i + 1])
        host = check_microbatch(kw["cu_seq_lens"], a[0].shape[1], kw["position_ids"])
        assert host.tolist() == batch.cu_seq_lens[i].tolist()


def batch_wide(batch):
    """The PR 4098 form: one cu_seqlens over all the step's tokens (micro-batches laid end to end)."""
    tokens = batch.input_ids.shape[1]
    offsets = [0]
    for i in range(batch.num_microbatches):
        row = batch.cu_seq_lens[i].tolist()
        offsets += [i * tokens + c for c, prev in zip(row[1:], row[:-1]) if c > prev]
    return torch.tensor(offsets, dtype=torch.int32), batch.position_ids.reshape(1, -1)


def test_the_pr_4098_form_is_refused():
    _, batch = step_batch()
    cu, _ = batch_wide(batch)
    tokens = batch.input_ids.shape[1]
    kwargs = {"position_ids": batch.position_ids, "cu_seq_lens": cu}
    _, chunks = split_args_kwargs_into_chunks((batch.input_ids,), kwargs, batch.num_microbatches)
    second = chunks[1]["cu_seq_lens"]
    assert int(second[0]) != 0  # what torchtitan's micro-batch 1 got: offsets into other micro-batches' tokens
    for i, kw in enumerate(chunks):
        own = batch.cu_seq_lens[i]
        own = own[:int((own < tokens).sum()) + 1].tolist()
        if i == 0 and kw["cu_seq_lens"].tolist() == own:
            continue  # the first chunk can be micro-batch 0's own boundaries exactly (then it is right)
        with pytest.raises(ValueError, match="pipeline_microbatches") as err:
            check_microbatch(kw["cu_seq_lens"], tokens)
        assert "cu_seq_lens" in str(err.value) and "4098" in str(err.value)
    with pytest.raises(ValueError, match="starts at"):
        check_microbatch(second, tokens)


def test_guard_refusals_name_the_fault():
    with pytest.raises(ValueError, match="falls"):
        check_microbatch(torch.tensor([0, 5, 3, 8]), 8)
    with pytest.raises(ValueError, match="ends at 8, not at this micro-batch's 9"):
        check_microbatch(torch.tensor([0, 5, 8]), 9)
    with pytest.raises(ValueError, match="restart"):
        check_microbatch(torch.tensor([0, 5, 8]), 8, torch.arange(8))
    with pytest.raises(TypeError, match="integer"):
        check_microbatch(torch.tensor([0.0, 8.0]), 8)
    with pytest.raises(ValueError, match="shape"):
        check_microbatch(torch.zeros(2, 3, dtype=torch.int32), 8)
    assert check_microbatch(torch.tensor([[0, 5, 8, 8]]), 8, torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])).tolist() == [0, 5, 8, 8]


def test_builder_arguments():
    seqs = documents()
    with pytest.raises(ValueError, match="row_len"):
        pipeline_microbatches([[0, 1]], seqs, row_len=10)
    with pytest.raises(ValueError, match="max_sequences"):
        pipeline_microbatches([[0, 2, 3]], seqs, max_sequences=2)
    with pytest.raises(ValueError, match="document 99"):
        pipeline_microbatches([[99]], seqs)
    with pytest.raises(ValueError, match="non-empty"):
        pipeline_microbatches([[]], seqs)
    with pytest.raises(ValueError, match="num_label_tokens"):
        pipeline_microbatches([[0]], [[5]]).loss_fn()
    fixed = pipeline_microbatches([[0, 3], [1]], seqs, row_len=40, max_sequences=4)
    assert fixed.input_ids.shape == (2, 40) and fixed.cu_seq_lens.shape == (2, 5)
    assert split_layers(8, 3) == [(0, 3), (3, 6), (6, 8)]
    with pytest.raises(ValueError, match="num_stages"):
        split_layers(2, 3)
