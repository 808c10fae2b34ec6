"""A compiled training step fed contract batches compiles once (issue 62): torch.compile(fullgraph=True,
dynamic=False) of a tiny Llama over 40 SGD steps of varying documents, dynamo's compiles counted, losses equal to
the same steps run eagerly on exact-metadata batches. The control: the exact-metadata feeding recompiles."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import packkit

from llama_helpers import VOCAB, tiny_llama

pytestmark = pytest.mark.core

CAPACITY, SLOTS, STEPS = 128, 8, 40


def _batches():
    rng = np.random.default_rng(3)
    out = []
    for _ in range(STEPS):
        lengths, total = [], 0
        while len(lengths) < SLOTS - 1:
            n = int(min(CAPACITY, max(2, rng.lognormal(np.log(24), 0.932))))
            if total + n > CAPACITY:
                break
            lengths.append(n)
            total += n
        out.append([{"input_ids": rng.integers(1, VOCAB, n).tolist()} for n in lengths])
    return out


def _train(model, collate, data, compiled: bool):
    import torch._dynamo as dynamo

    model = copy.deepcopy(model)
    step = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=False) if compiled else model
    dynamo.reset()
    dynamo.utils.counters.clear()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, compiles = [], []
    for features in data:
        loss = step(**collate(features), use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        compiles.append(int(dynamo.utils.counters["stats"]["unique_graphs"]))
    return torch.stack(losses), compiles


def test_contract_batches_compile_once_and_train_as_exact_metadata():
    import torch._dynamo as dynamo

    # a host read in the step is a graph break, so fullgraph fails (config.patch: monkeypatch's undo deletes aliases)
    with dynamo.config.patch(capture_scalar_outputs=False, recompile_limit=16):
        _check_compiles()


def _check_compiles():
    model = tiny_llama(dtype=torch.float64)
    data = _batches()
    assert len({sum(len(f["input_ids"]) for f in b) for b in data}) > 10  # the batches do vary
    contract = packkit.PackingCollator(CAPACITY, max_sequences=SLOTS, max_length_buckets="pow2")
    got, compiles = _train(model, contract, data, compiled=True)
    assert compiles[-1] == 1 and compiles[0] == 1  # one graph, from the first step on
    exact = packkit.PackingCollator(CAPACITY, pad_to_multiple_of=CAPACITY)  # same tokens, exact metadata, eager
    want, _ = _train(model, exact, data, compiled=False)
    assert torch.equal(got, want)
    # control: exact metadata (the flat row as long as the batch) recompiles under the same compile
    _, control = _train(model, packkit.PackingCollator(), data[:3], compiled=True)
    assert control[-1] > 1
