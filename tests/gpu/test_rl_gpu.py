"""packkit.rl on a GPU: pack_rollouts / unpack_rollouts equal the CPU path for both device backends, and every
micro-batch pack (with its device-side mask check) and unpack runs without a host sync once the layout is on
the host (one copy per global batch)."""
from __future__ import annotations

import pytest
import torch

import gpu_gate
from packkit import rl

pytestmark = pytest.mark.full

BACKENDS = [pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]


def make(batch=64, prompt=300, response=700, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.randint(1, prompt + 1, (batch,), generator=g)
    r = torch.randint(0, response + 1, (batch,), generator=g)
    cols = torch.arange(prompt + response)
    mask = ((cols >= prompt - p[:, None]) & (cols < prompt + r[:, None])).long()
    return torch.randint(1, 32000, mask.shape, generator=g) * mask, mask


@pytest.mark.parametrize("backend", BACKENDS)
def test_pack_rollouts_on_gpu_equals_cpu_without_a_sync(backend):
    ids, mask = make()
    layout = rl.rollout_layout(mask)
    plan = rl.micro_batches(layout.length, 8192, 2)
    ids_d, mask_d = ids.cuda(), mask.cuda()
    layout_d = rl.rollout_layout(mask_d)  # the one device-to-host copy
    assert all((a == b).all() for a, b in zip(layout, layout_d) if not isinstance(a, int))
    for part in (p for rank in plan.indices for p in rank):
        ref, ref_info = rl.pack_rollouts(ids, mask, part, layout, row_len=8192)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got, info = rl.pack_rollouts(ids_d, mask_d, part, layout_d, row_len=8192, backend=backend)
            values = got["input_ids"].to(torch.float32)
            back = rl.unpack_rollouts(values, info, fill=-1.0, backend=backend)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        for key in ("input_ids", "position_ids", "cu_seq_lens_q"):
            assert torch.equal(got[key].cpu(), ref[key]), key
        assert got["max_length_q"] == ref["max_length_q"] and int(info.status) == 0
        assert torch.equal(back.cpu(), rl.unpack_rollouts(ref["input_ids"].to(torch.float32), ref_info, fill=-1.0))
