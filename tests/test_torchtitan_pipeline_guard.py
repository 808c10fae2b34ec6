"""packkit's check on torchtitan's pipeline stages (packkit.integrations.torchtitan.pipeline), in one process: it
accepts each micro-batch's own metadata as torchtitan 0.3.0 builds it from packkit's rows (``VarlenMetadata`` from
``create_varlen_metadata_for_document``, a Flex ``BlockMask`` from ``create_block_mask``) and refuses by name the
torchtitan PR 4098 form (a dim-0 chunk of a batch-wide ``cu_seq_q``, as torch's schedule chunks it), positions of
another batch, positions that do not restart per document and a mask of another shape; installed as a forward
pre-hook it stops the stage before its forward runs. The run through torchtitan's entry point is
tests/test_torchtitan_pp_entry.py."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchtitan.models.common.attention",
                    reason="torchtitan is not installed (README's test command installs 0.3.0)")

from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask  # noqa: E402
from torchtitan.models.common.attention import VarlenMetadata, create_varlen_metadata_for_document  # noqa: E402

from packkit.integrations.torchtitan import BalancedDocumentStream, check_stage_kwargs, guard_pipeline_stages  # noqa: E402

pytestmark = pytest.mark.full

L = 32


def microbatches(n=4, rows=1):
    """``n`` micro-batches of packkit's stream (``rows`` rows of ``L`` tokens each)."""
    gen = torch.Generator().manual_seed(0)
    docs = [torch.randint(1, 50, (int(k),), generator=gen).tolist()
            for k in torch.randint(3, L, (8 * n * rows,), generator=gen)]
    stream = iter(BalancedDocumentStream(docs, seq_len=L, local_batch_size=rows, dp_rank=0, dp_world_size=1,
                                         infinite=False))
    return [next(stream)[0] for _ in range(n)]


def test_own_metadata_passes_on_every_stage():
    for mb in microbatches(rows=2):
        pos, ids = mb["positions"], mb["input"]
        own = create_varlen_metadata_for_document(pos)
        check_stage_kwargs(ids, pos, own)  # first stage: token ids
        check_stage_kwargs(torch.zeros(*ids.shape, 8), pos, own)  # a later stage: hidden states
        mask = create_block_mask(lambda b, h, q, k: q >= k, ids.shape[0], None, L, L, device="cpu")
        check_stage_kwargs(ids, pos, mask)
        check_stage_kwargs(ids, pos, {"full": own, "sliding": None})


def test_the_batch_wide_form_is_refused_by_name():
    mbs = microbatches()
    whole = create_varlen_metadata_for_document(torch.cat([m["positions"] for m in mbs]))
    _, chunks = split_args_kwargs_into_chunks((), {"cu": whole.cu_seq_q}, len(mbs))
    refused = 0
    for mb, chunk in zip(mbs, chunks):
        cu = chunk["cu"]
        meta = VarlenMetadata(cu, cu, whole.max_q, whole.max_k)
        own = create_varlen_metadata_for_document(mb["positions"]).cu_seq_q
        if torch.equal(cu, own):  # a chunk can happen to be right (micro-batch 0's, say)
            check_stage_kwargs(mb["input"], mb["positions"], meta)
            continue
        with pytest.raises(ValueError, match=r"attention_masks\.cu_seq_q = .*(starts at|not at this micro-batch|"
                                             r"restart).*4098"):
            check_stage_kwargs(mb["input"], mb["positions"], meta)
        refused += 1
    assert refused >= len(mbs) - 1


def test_other_batches_metadata_is_refused():
    a, b = microbatches(2, rows=2)
    with pytest.raises(ValueError, match="positions of shape .* do not match"):
        check_stage_kwargs(a["input"], b["positions"][:1])
    shifted = a["positions"].clone()
    shifted[0] += 3  # positions of a row cut out of a longer document
    with pytest.raises(ValueError, match="do not start at 0"):
        check_stage_kwargs(a["input"], shifted)
    wrong = a["positions"].clone()
    wrong[0, 5:] = torch.arange(1, L - 4)  # a document start that is not a restart to 0
    with pytest.raises(ValueError, match="jump from"):
        check_stage_kwargs(a["input"], wrong)
    meta = create_varlen_metadata_for_document(b["positions"])  # same shape, another micro-batch's boundaries
    if not torch.equal(meta.cu_seq_q, create_varlen_metadata_for_document(a["positions"]).cu_seq_q):
        with pytest.raises(ValueError, match="restart"):
            check_stage_kwargs(a["input"], a["positions"], meta)
    mask = create_block_mask(lambda b_, h, q, k: q >= k, 1, None, 2 * L, 2 * L, device="cpu")
    with pytest.raises(ValueError, match="is not a mask of this micro-batch"):
        check_stage_kwargs(a["input"], a["positions"], mask)


def test_the_hook_stops_the_stage_before_its_forward():
    ran = []

    class Stage(torch.nn.Module):
        def forward(self, tokens, positions=None, attention_masks=None):
            ran.append(tokens.shape)
            return tokens

    stage = Stage()
    (handle,) = guard_pipeline_stages([stage])
    mb = microbatches(1)[0]
    stage(mb["input"], positions=mb["positions"], attention_masks=create_varlen_metadata_for_document(mb["positions"]))
    bad = create_varlen_metadata_for_document(mb["positions"])
    bad = VarlenMetadata(bad.cu_seq_q + 3, bad.cu_seq_k + 3, bad.max_q, bad.max_k)
    with pytest.raises(ValueError, match="starts at 3"):
        stage(mb["input"], positions=mb["positions"], attention_masks=bad)
    assert len(ran) == 1
    handle.remove()
    stage(mb["input"], positions=mb["positions"], attention_masks=bad)  # unguarded, it runs
    assert len(ran) == 2
