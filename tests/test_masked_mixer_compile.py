"""A hybrid family compiled whole (issue 62 part 3): torch.compile(fullgraph=True, dynamic=False) of a tiny Mamba-2
prepared with mixer="masked", trained 12 SGD steps on contract batches (PackingCollator(capacity, max_sequences=N,
max_length_buckets="pow2")), with capture_scalar_outputs=False (a host read is a graph break, so fullgraph fails).
One compile, counted by dynamo's counters; losses bit-equal to the same steps run eagerly on exact-metadata batches,
and equal within the fp64 rounding of the two scans to the per-document (host boundary) mixer's. The control: that
per-document mixer cannot be compiled whole. Bamba (the same mixer between sdpa attention layers):
tests/test_masked_mixer_compile_bamba.py (full tier)."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import packkit  # noqa: E402

from model_zoo import fp64_everywhere, tiny_config  # noqa: E402
from test_masked_mixer import token_loss  # noqa: E402

pytestmark = pytest.mark.core

CAPACITY, SLOTS, STEPS = 64, 6, 12
_FP64 = pytest.MonkeyPatch()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    _FP64.undo()


def _batches():
    rng = np.random.default_rng(5)
    out = []
    for _ in range(STEPS):
        lengths, total = [], 0
        while len(lengths) < SLOTS - 1:
            n = int(min(CAPACITY, max(2, rng.lognormal(np.log(12), 0.932))))
            if total + n > CAPACITY:
                break
            lengths.append(n)
            total += n
        out.append([{"input_ids": rng.integers(3, 128, n).tolist()} for n in lengths])
    return out


def _model(name):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(tiny_config(name))
    model = model.to(torch.float64).train()
    fp64_everywhere(model, _FP64)
    return model


def _train(base, mixer, collate, data, compiled: bool):
    import torch._dynamo as dynamo

    model = packkit.prepare_model(copy.deepcopy(base), mixer=mixer)  # each run its own copy of the same weights
    step = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=False) if compiled else model
    dynamo.reset()
    dynamo.utils.counters.clear()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, compiles = [], []
    for features in data:
        batch = collate(features)
        labels = batch.pop("labels")
        # fp64 loss (transformers' loss function casts to fp32), outside the compiled model
        loss = token_loss(step(**batch, use_cache=False).logits, labels) / int((labels[:, 1:] != -100).sum())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        compiles.append(int(dynamo.utils.counters["stats"]["unique_graphs"]))
    return torch.stack(losses), compiles


def test_masked_mamba2_compiles_once_and_trains_as_exact_metadata():
    check_compiles_once("mamba2")


def check_compiles_once(name, bit_equal=True):
    import torch._dynamo as dynamo

    # config.patch, not monkeypatch: monkeypatch's undo deletes dynamo's config aliases
    with dynamo.config.patch(capture_scalar_outputs=False, recompile_limit=8):
        base = _model(name)
        data = _batches()
        assert len({sum(len(f["input_ids"]) for f in b) for b in data}) > 6  # the batches do vary
        contract = packkit.PackingCollator(CAPACITY, max_sequences=SLOTS, max_length_buckets="pow2")
        exact = packkit.PackingCollator(CAPACITY, pad_to_multiple_of=CAPACITY)  # same tokens, exact metadata
        got, compiles = _train(base, "masked", contract, data, compiled=True)
        assert compiles[0] == 1 and compiles[-1] == 1  # one graph, from the first step on
        want, _ = _train(base, "masked", exact, data, compiled=False)
        # the quadratic scan vs transformers' chunked one: sums of <= 64 O(1) terms reordered, over 12 SGD steps
        tol = 1e3 * CAPACITY * torch.finfo(torch.float64).eps
        assert torch.equal(got, want) if bit_equal else torch.allclose(got, want, rtol=tol, atol=0)
        other, _ = _train(base, "per_document", exact, data, compiled=False)
        assert torch.allclose(got, other, rtol=tol, atol=0)
        # control: the per-document path reads its boundaries on the host, so the whole-graph compile fails
        with pytest.raises(dynamo.exc.TorchDynamoException):
            _train(base, "per_document", contract, data[:1], compiled=True)
