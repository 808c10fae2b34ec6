"""Megatron-Core's pipeline path (issue 61 part 4), as far as it runs on the CPU.

``packkit.integrations.megatron.pipeline_data_iterator`` is the ``data_iterator`` Megatron's schedules hand to
``forward_step_func`` (one ``next`` per micro-batch): every micro-batch of a ``plan_pipeline`` rank packed alone,
its own ``PackedSeqParams`` from 0 to its own tokens, lengths varying between micro-batches (what
``variable_seq_lengths=True`` is for), every document exactly once. Megatron's schedules themselves do not run on
the CPU; the reasons docs/pipeline.md states are checked against the installed Megatron-Core (0.16.1), so the page
cannot go stale silently."""
from __future__ import annotations

import inspect
from collections import Counter

import pytest
import torch

pytest.importorskip("megatron.core.packed_seq_params", reason="megatron-core is not installed (full tier)")

from packkit.integrations.megatron import pipeline_data_iterator  # noqa: E402
from packkit.pipeline import plan_pipeline  # noqa: E402

pytestmark = pytest.mark.full

LENGTHS = [5, 17, 3, 30, 9, 12, 2, 25, 7, 14, 21, 4]


def documents():
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(1, 90, (n,), generator=gen).tolist() for n in LENGTHS]


@pytest.mark.parametrize("cp_size", [1, 2])
def test_every_microbatch_is_self_contained(cp_size):
    docs = documents()
    plan = plan_pipeline(LENGTHS, 40, pp_size=2, num_microbatches=4)
    rows = plan.microbatches[0]
    got = list(pipeline_data_iterator(rows, docs, cp_size=cp_size))
    assert len(got) == len(rows)
    seen = []
    for mb, row in zip(got, rows):
        p = mb["packed_seq_params"]
        cu, cup = p.cu_seqlens_q.tolist(), p.cu_seqlens_q_padded.tolist()
        assert p.qkv_format == "thd" and cu[0] == 0 and cup[0] == 0
        assert cu == [0, *torch.tensor([len(docs[i]) for i in row]).cumsum(0).tolist()]  # its own documents
        assert cup[-1] == mb["tokens"].shape[1]  # to its own (padded) tokens
        if cp_size > 1:
            assert all((b - a) % (2 * cp_size) == 0 for a, b in zip(cup[:-1], cup[1:]))
        for k, i in enumerate(row):
            a = cup[k]
            assert mb["tokens"][0, a:a + len(docs[i])].tolist() == docs[i]
            assert mb["position_ids"][0, a:a + len(docs[i])].tolist() == list(range(len(docs[i])))
            seen.append(i)
    assert Counter(seen) == Counter(range(len(LENGTHS)))  # every document once
    assert len({mb["tokens"].shape[1] for mb in got}) > 1  # lengths vary: variable_seq_lengths' case


def test_bad_microbatches_are_refused():
    docs = documents()
    with pytest.raises(ValueError, match="names document 12"):
        pipeline_data_iterator([[0, 12]], docs)
    with pytest.raises(ValueError, match="non-empty"):
        pipeline_data_iterator([[0], []], docs)
    with pytest.raises(ValueError, match="labels has 2 entries"):
        pipeline_data_iterator([[0]], docs, labels=[[1], [2]])


def test_the_stated_reasons_megatrons_schedules_do_not_run_on_cpu():
    """docs/pipeline.md: Megatron-Core's pipeline path needs a CUDA device, and its packed (THD) attention
    Transformer Engine. Checked in the installed source, and that CPU torch refuses the device it names."""
    from megatron.core.pipeline_parallel import p2p_communication, schedules
    from megatron.core.transformer import dot_product_attention

    one_f_one_b = inspect.getsource(schedules.forward_backward_pipelining_without_interleaving)
    assert 'torch.zeros([], dtype=torch.int, device="cuda")' in one_f_one_b
    assert "torch.cuda.current_device()" in inspect.getsource(p2p_communication.P2PCommunicator._communicate_shapes)
    assert "variable_seq_lengths" in inspect.getsource(p2p_communication.P2PCommunicator._communicate)
    assert "assert packed_seq_params is None" in inspect.getsource(dot_product_attention.DotProductAttention.forward)
    if not torch.cuda.is_available():
        with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
            torch.zeros([], dtype=torch.int, device="cuda")
