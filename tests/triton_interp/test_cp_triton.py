"""The Triton context-parallel kernel (packkit.triton_kernels.context_parallel), run by the Triton
interpreter on CPU tensors, equals tests/cp_reference.py bit for bit (both modes, many programs), under
conftest.py's bounds checker, with poisoned, guarded outputs."""
from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - conftest.py already ignores us
    pytest.skip("the Triton kernel tests need TRITON_INTERPRET=1 set before triton is imported",
                allow_module_level=True)
pytest.importorskip("triton")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import packkit  # noqa: E402
from conftest import _GuardedTorch  # noqa: E402
from cp_reference import reference_shard  # noqa: E402
from packkit.triton_kernels import context_parallel as tcp  # noqa: E402

pytestmark = pytest.mark.full


@pytest.fixture(autouse=True)
def guarded_cp_outputs(monkeypatch):
    proxy = _GuardedTorch(torch)
    monkeypatch.setattr(tcp, "torch", proxy)
    yield proxy
    proxy.check_guards()


@pytest.mark.parametrize("block", [1024, 8])
@pytest.mark.parametrize("mode", ["zigzag", "contiguous"])
@pytest.mark.parametrize("seed", range(3))
def test_triton_cp_shard_matches_reference(seed, mode, block, monkeypatch):
    monkeypatch.setitem(tcp._CONFIG, "block", block)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, int(rng.integers(1, 6)))
    id_dtype = torch.int32 if seed % 2 else torch.int64
    seqs = [torch.from_numpy(rng.integers(1, 1000, int(k))).to(id_dtype) for k in lengths]
    layout = dict(capacity=int(lengths.max()) + 3, layout="padded") if seed % 3 == 0 else {}
    batch = packkit.pack_sequences(seqs, **layout)
    ids, lab, pos = (batch[k].reshape(-1) for k in ("input_ids", "labels", "position_ids"))
    cu = batch["cu_seq_lens_q"]
    for cp in (1, 2, 3):
        for rank in range(cp):
            ref, local_cu, padded_cu = reference_shard(ids, lab, pos, cu.tolist(), cp, rank, mode)
            cup = torch.tensor(padded_cu, dtype=torch.int32) if mode == "zigzag" else cu
            n = padded_cu[-1] // cp if mode == "zigzag" else -(-ids.numel() // cp)
            got = torch.ops.packkit.triton_cp_shard(ids, lab, pos, cu, cup, cp, rank, mode == "zigzag", n, 0, -100)
            for t, key in zip(got, ("input_ids", "labels", "shift_labels", "position_ids", "src_index", "seq_idx")):
                assert t.to(torch.int64).tolist() == ref[key].tolist(), (cp, rank, key)
            assert got[0].dtype == id_dtype and got[5].dtype == torch.int32


def test_triton_cp_shard_inconsistent_cu_stays_in_bounds():
    ids = torch.arange(10, dtype=torch.int64)
    pos = torch.arange(10, dtype=torch.int64)
    bad = torch.tensor([0, 7, 50], dtype=torch.int32)  # ends past the row: bounded, never out of range
    got = torch.ops.packkit.triton_cp_shard(ids, ids, pos, bad, torch.tensor([0, 8, 64], dtype=torch.int32), 2, 1,
                                            True, 32, 0, -100)
    assert got[0].numel() == 32 and bool((got[4] < 10).all())


@pytest.mark.parametrize("block", [1024, 8])
@pytest.mark.parametrize("mode", ["zigzag", "contiguous"])
def test_triton_fused_pack_shard_matches_reference(mode, block, monkeypatch):
    """The fused mode (seg_src: straight from the unpacked source) equals pack reference + split reference."""
    from cp_fused_cases import check_reference, make_case
    from packkit.context_parallel import fused

    monkeypatch.setitem(tcp._CONFIG, "block", block)
    monkeypatch.setattr(fused, "_cp_op", lambda backend: torch.ops.packkit.triton_cp_shard)
    for seed in (0, 1, 2, 3, 5):  # padded + plan, split plan, flat row padding, flat, padded with extra rows
        seqs, lengths, kw = make_case(seed)
        for cp, rank in ((1, 0), (2, 1), (3, 2)):
            out, info = packkit.pack_context_parallel(seqs, cp, rank, mode, return_info=True, **kw)
            ref = check_reference(out, seqs, lengths, kw, cp, rank, mode)
            assert info.src_index.tolist() == ref["src_index"].tolist()


def test_triton_fused_inconsistent_seg_src_stays_in_bounds():
    ids = torch.arange(10, dtype=torch.int64)
    cu = torch.tensor([0, 7, 12], dtype=torch.int32)
    seg_src = torch.tensor([6, 40], dtype=torch.int64)  # both past the 10-token source: padding, never a fault
    got = torch.ops.packkit.triton_cp_shard(ids, ids, None, cu, torch.tensor([0, 8, 16], dtype=torch.int32), 2, 1,
                                            True, 8, 0, -100, seg_src, 0, None)
    assert got[0].numel() == 8 and bool((got[0][got[4] < 0] == 0).all())


@pytest.mark.parametrize("sizes", ["pow2", "any"])
def test_triton_pass_batches_match_reference(sizes, monkeypatch):
    """pack_context_parallel_pass (a dynamic CP plan's pass, tests/test_context_parallel_pass.py's CPU twin) on the
    Triton kernel: every pass and rank of a plan with CP sizes 1, 2 and 4 (or 3 and an unaligned 2) equals the
    hand-built reference, into guarded, poisoned outputs."""
    from packkit.context_parallel import fused
    from test_context_parallel_pass import any_size_plan, make_sources, mixed_plan, reference_pass

    monkeypatch.setattr(fused, "_cp_op", lambda backend: torch.ops.packkit.triton_cp_shard)
    plan = mixed_plan() if sizes == "pow2" else any_size_plan()
    seqs, labels = make_sources(1, plan.lengths.tolist())
    for index, (ranks, _) in enumerate(plan.passes):
        for rank in ranks:
            out = packkit.pack_context_parallel_pass(seqs, plan, index, rank, labels=labels, pad_token_id=3)
            ref, local_cu, padded_cu = reference_pass(seqs, labels, plan, index, rank, pad_id=3)
            for key in ("input_ids", "labels", "shift_labels", "position_ids", "seq_idx"):
                assert out[key][0].to(torch.int64).tolist() == ref[key].tolist(), (index, rank, key)
            assert out["cu_seq_lens_q"].tolist() == local_cu and out["cu_seqlens_padded"].tolist() == padded_cu
