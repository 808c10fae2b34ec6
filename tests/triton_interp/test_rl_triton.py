"""packkit.rl.pack_rollouts / unpack_rollouts on the Triton backend (interpreted on CPU tensors) equal the CPU
backend bit for bit, gradient included. Collected only under TRITON_INTERPRET=1 (see conftest.py)."""
from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - conftest.py already ignores us
    pytest.skip("needs TRITON_INTERPRET=1 set before triton is imported", allow_module_level=True)
pytest.importorskip("triton")

import torch  # noqa: E402

from packkit import rl  # noqa: E402
from packkit.rl import rollouts as rollouts_module  # noqa: E402

pytestmark = pytest.mark.full


def make(batch=9, prompt=7, response=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (batch, prompt + response), generator=g)
    mask = torch.zeros_like(ids)
    for b in range(batch):
        p = int(torch.randint(1, prompt + 1, (1,), generator=g))
        r = int(torch.randint(0, response + 1, (1,), generator=g))
        mask[b, prompt - p:prompt + r] = 1
    return ids * mask, mask


@pytest.mark.parametrize("row_len", [None, 120])
def test_triton_equals_cpu(row_len, monkeypatch):
    ids, mask = make()
    layout = rl.rollout_layout(mask)
    idx = [6, 1, 2, 8, 4]
    ref_batch, ref_info = rl.pack_rollouts(ids, mask, idx, layout, row_len=row_len)
    monkeypatch.setattr(rollouts_module, "_backend_for", lambda device, backend: "triton")
    batch, info = rl.pack_rollouts(ids, mask, idx, layout, row_len=row_len)
    for key in ("input_ids", "position_ids", "cu_seq_lens_q"):
        assert torch.equal(batch[key], ref_batch[key]), key
    assert batch["max_length_q"] == ref_batch["max_length_q"]
    values = torch.randn(batch["input_ids"].shape[1], 2, dtype=torch.float64, requires_grad=True)
    out = rl.unpack_rollouts(values, info, fill=-3.0)
    monkeypatch.undo()
    ref = rl.unpack_rollouts(values, ref_info, fill=-3.0)
    assert torch.equal(out, ref)
    grad = torch.randn_like(out)
    (g,) = torch.autograd.grad(out, values, grad)
    (ref_g,) = torch.autograd.grad(ref, values, grad)
    assert torch.equal(g, ref_g)
