"""packkit.shard_context_parallel / unshard_context_parallel (issue 25): every backend equals the
plain-PyTorch reference (tests/cp_reference.py) bit for bit into poisoned memory; hypothesis properties
(the shards partition the padded batch, positions stay global, no label crosses a document,
unshard(shard(x)) == x); Transformer Engine THD compatibility; opcheck and torch.compile."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpu_gate
import packkit
from cp_reference import reference_shard
from gpu_gate import on
from packkit.context_parallel import CPShardInfo, cp_padded_lengths

pytestmark = pytest.mark.core

BACKENDS = ["cpu", pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]
MODES = ("zigzag", "contiguous")
POISON = 0x5A


def poison_allocator(device, nbytes=1 << 20):
    buf = torch.full((nbytes,), POISON, dtype=torch.uint8, device=device)
    del buf


def make_batch(seed, *, layout="flat", id_dtype=torch.int64, max_len=40, n_max=8, extra=False):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, n_max + 1))
    lengths = rng.integers(1, max_len + 1, n)
    seqs = [torch.from_numpy(rng.integers(1, 30000, int(k))).to(id_dtype) for k in lengths]
    kwargs = {}
    if layout == "padded":
        kwargs = dict(capacity=int(lengths.max() + rng.integers(0, 9)), layout="padded")
    elif rng.random() < 0.5:
        kwargs = dict(row_len=int(lengths.sum() + rng.integers(0, 7)))
    if extra:
        kwargs["fields"] = {"token_weight": [torch.from_numpy(rng.random(int(k))).float() for k in lengths]}
    batch, info = packkit.pack_sequences(seqs, return_info=True, mask_first_label=bool(rng.random() < 0.7),
                                         position_ids_start=int(rng.integers(0, 3)), **kwargs)
    return batch, info


def check_against_reference(batch, out, cp, rank, mode, info=None):
    ids = batch["input_ids"].reshape(-1).cpu()
    ref, local_cu, padded_cu = reference_shard(ids, batch["labels"].reshape(-1).cpu(),
                                               batch["position_ids"].reshape(-1).cpu(),
                                               batch["cu_seq_lens_q"].tolist(), cp, rank, mode)
    assert out["input_ids"].dtype == ids.dtype and out["shift_labels"].dtype == batch["labels"].dtype
    for key in ("input_ids", "labels", "shift_labels", "position_ids", "seq_idx"):
        assert out[key].shape == (1, len(ref[key])), key
        assert out[key][0].cpu().to(torch.int64).tolist() == ref[key].tolist(), key
    assert out["cu_seq_lens_q"].dtype == torch.int32 and out["cu_seq_lens_q"].tolist() == local_cu
    assert out["cu_seq_lens_k"] is out["cu_seq_lens_q"]
    assert out["max_length_q"] == out["max_length_k"] == max(np.diff(local_cu), default=0)
    assert isinstance(out["max_length_q"], int)
    if mode == "zigzag":
        assert out["cu_seqlens_padded"].tolist() == padded_cu
    else:
        assert "cu_seqlens_padded" not in out
    src = ref["src_index"]
    lab = batch["labels"].reshape(-1).cpu()
    want = torch.where(src >= 0, lab[src.clamp(min=0)], torch.full_like(src, -100))
    assert out["labels"][0].cpu().to(torch.int64).tolist() == want.tolist()
    if info is not None:
        assert info.src_index.cpu().tolist() == src.tolist()
    return ref


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), cp=st.integers(1, 5), layout=st.sampled_from(["flat", "padded"]),
       id_dtype=st.sampled_from([torch.int64, torch.int32]), source=st.sampled_from(["batch", "lengths", "info"]))
def test_shard_matches_reference_bit_for_bit(backend, mode, seed, cp, layout, id_dtype, source):
    batch, info = make_batch(seed, layout=layout, id_dtype=id_dtype)
    device = on(backend)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    kwargs = {}
    if source == "lengths":
        kwargs["lengths"] = np.diff(batch["cu_seq_lens_q"].cpu().numpy())
    elif source == "info":
        kwargs["pack_info"] = info
    for rank in range(cp):
        poison_allocator(device)
        out, sinfo = packkit.shard_context_parallel(batch, cp, rank, mode, backend=backend, return_info=True,
                                                    **kwargs)
        check_against_reference(batch, out, cp, rank, mode, sinfo)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cp=st.integers(1, 6), mode=st.sampled_from(MODES),
       layout=st.sampled_from(["flat", "padded"]))
def test_properties_partition_global_positions_no_cross_document_label_roundtrip(seed, cp, mode, layout):
    batch, _ = make_batch(seed, layout=layout)
    ids, lab, pos = (batch[k].reshape(-1) for k in ("input_ids", "labels", "position_ids"))
    cu = batch["cu_seq_lens_q"].tolist()
    T = ids.numel()
    seg_of = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
    shards = [packkit.shard_context_parallel(batch, cp, r, mode, return_info=True) for r in range(cp)]
    lens = {out["input_ids"].shape[1] for out, _ in shards}
    assert len(lens) == 1  # every rank gets the same number of tokens
    n = lens.pop()
    padded_total = int(cp_padded_lengths(np.diff(cu), cp, mode).sum()) if mode == "zigzag" else -(-T // cp) * cp
    assert n * cp == padded_total
    src = torch.cat([info.src_index for _, info in shards])
    real = src[src >= 0]
    # Partition: every source token exactly once across ranks; the rest is padding.
    assert sorted(real.tolist()) == list(range(T))
    assert int((src < 0).sum()) == padded_total - T
    for out, info in shards:
        s = info.src_index
        keep = s >= 0
        # Positions are the source's global positions (not restarted per shard).
        assert torch.equal(out["position_ids"][0][keep], pos[s[keep]])
        # shift_labels: the next label of the same document, never across a document boundary.
        sl = out["shift_labels"][0]
        for j in torch.nonzero(keep).flatten().tolist():
            i = int(s[j])
            same = i + 1 < T and seg_of[i + 1] == seg_of[i]
            assert int(sl[j]) == (int(lab[i + 1]) if same else -100)
        assert bool((sl[~keep] == -100).all()) and bool((out["input_ids"][0][~keep] == 0).all())
        # Local cu_seqlens cover the shard.
        assert out["cu_seq_lens_q"][-1].item() == n
    # unshard(shard(x)) == x, for a per-token float output with a feature dim and for the ids.
    feats = torch.randn(T, 3, dtype=torch.float64)
    gathered = []
    for out, info in shards:
        s = info.src_index
        x = torch.where((s >= 0)[:, None], feats[s.clamp(min=0)], torch.full((n, 3), float("nan"), dtype=torch.float64))
        gathered.append(x)
    back = packkit.unshard_context_parallel(torch.stack(gathered), shards[0][1])
    assert torch.equal(back, feats)
    back_ids = packkit.unshard_context_parallel([out["input_ids"] for out, _ in shards], shards[-1][1])
    assert torch.equal(back_ids, ids)


def thd_get_partitioned_indices(cu_seqlens_padded, total_tokens, world_size, rank):
    """Reimplementation of the documented behaviour of Transformer Engine's
    ``tex.thd_get_partitioned_indices(cu_seqlens, total_tokens, world_size, rank)``: every sequence of the
    THD batch (padded to a multiple of 2 * world_size) is cut into 2 * world_size chunks; the rank takes
    chunks rank and 2 * world_size - 1 - rank of each sequence; returns their token indices in order."""
    cu = [int(c) for c in cu_seqlens_padded]
    assert cu[-1] == total_tokens
    out = []
    for s in range(len(cu) - 1):
        start, length = cu[s], cu[s + 1] - cu[s]
        assert length % (2 * world_size) == 0
        chunk = length // (2 * world_size)
        out.extend(range(start + rank * chunk, start + (rank + 1) * chunk))
        out.extend(range(start + (2 * world_size - 1 - rank) * chunk, start + (2 * world_size - rank) * chunk))
    return torch.tensor(out, dtype=torch.int64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_zigzag_is_te_thd_partition(seed, cp):
    batch, _ = make_batch(seed, layout="flat" if seed % 2 else "padded")
    cu = batch["cu_seq_lens_q"].tolist()
    lengths = np.diff(cu)
    padded = cp_padded_lengths(lengths, cp)
    cup = np.concatenate(([0], np.cumsum(padded)))
    # The THD batch: each sequence padded at its end (TE's convention for cu_seqlens_padded).
    thd_ids = torch.zeros(int(cup[-1]), dtype=torch.int64)
    thd_src = torch.full((int(cup[-1]),), -1, dtype=torch.int64)
    for s in range(len(lengths)):
        thd_ids[cup[s]:cup[s] + lengths[s]] = batch["input_ids"].reshape(-1)[cu[s]:cu[s + 1]]
        thd_src[cup[s]:cup[s] + lengths[s]] = torch.arange(cu[s], cu[s + 1])
    for rank in range(cp):
        out, info = packkit.shard_context_parallel(batch, cp, rank, "zigzag", return_info=True)
        assert out["cu_seqlens_padded"].tolist() == cup.tolist()
        idx = thd_get_partitioned_indices(out["cu_seqlens_padded"], int(cup[-1]), cp, rank)
        assert torch.equal(thd_ids[idx], out["input_ids"][0])
        assert torch.equal(thd_src[idx], info.src_index)


def test_other_per_token_fields_follow_the_split():
    batch, _ = make_batch(3, extra=True)
    assert "token_weight" in batch
    w = batch["token_weight"].reshape(-1)
    for mode in MODES:
        for rank in range(3):
            out, info = packkit.shard_context_parallel(batch, 3, rank, mode, return_info=True)
            s = info.src_index
            want = torch.where(s >= 0, w[s.clamp(min=0)], torch.zeros_like(w[:1]))
            assert torch.equal(out["token_weight"][0], want)


def test_errors():
    batch, _ = make_batch(0)
    with pytest.raises(ValueError, match="cp_rank"):
        packkit.shard_context_parallel(batch, 2, 2)
    with pytest.raises(ValueError, match="mode"):
        packkit.shard_context_parallel(batch, 2, 0, "ring")
    with pytest.raises(ValueError, match="sum to"):
        packkit.shard_context_parallel(batch, 2, 0, lengths=[1, 2])
    out, info = packkit.shard_context_parallel(batch, 2, 0, return_info=True)
    with pytest.raises(ValueError, match="rank outputs"):
        packkit.unshard_context_parallel([out["input_ids"]], info)
    cu = batch["cu_seq_lens_q"]
    ids, lab, pos = (batch[k].reshape(-1) for k in ("input_ids", "labels", "position_ids"))
    with pytest.raises(RuntimeError, match="multiple of 2\\*cp_size"):
        torch.ops.packkit.cp_shard(ids, lab, pos, cu, cu, 2, 0, True, int(cu[-1]) // 2)
    with pytest.raises(RuntimeError, match="cover"):
        torch.ops.packkit.cp_shard(ids, lab, pos, cu, cu, 2, 0, False, 1)


def _op_args(seed, cp, rank, mode):
    batch, _ = make_batch(seed)
    cu = batch["cu_seq_lens_q"]
    lengths = np.diff(cu.numpy())
    T = int(cu[-1])
    if mode == "zigzag":
        cup = torch.from_numpy(np.concatenate(([0], np.cumsum(cp_padded_lengths(lengths, cp))))).to(torch.int32)
        n = int(cup[-1]) // cp
    else:
        cup, n = cu, -(-T // cp)
    ids, lab, pos = (batch[k].reshape(-1) for k in ("input_ids", "labels", "position_ids"))
    return (ids, lab, pos, cu, cup, cp, rank, mode == "zigzag", n, 0, -100)


@pytest.mark.parametrize("mode", MODES)
def test_opcheck(mode):
    for seed, cp, rank in ((0, 2, 1), (5, 3, 0), (7, 1, 0)):
        torch.library.opcheck(torch.ops.packkit.cp_shard.default, _op_args(seed, cp, rank, mode))


def test_compile_fullgraph():
    args = _op_args(11, 4, 2, "zigzag")

    def step(ids, lab, pos, cu, cup):
        out = torch.ops.packkit.cp_shard(ids, lab, pos, cu, cup, 4, 2, True, args[8])
        return out[0] * 2, out[2], out[3] + 1

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, want = compiled(*args[:5]), step(*args[:5])
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_padded_lengths_and_info():
    assert cp_padded_lengths([1, 4, 5, 9], 2).tolist() == [4, 4, 8, 12]
    assert cp_padded_lengths([1, 4, 5, 9], 2, "contiguous").tolist() == [1, 4, 5, 9]
    batch, _ = make_batch(1)
    _, info = packkit.shard_context_parallel(batch, 2, 1, return_info=True)
    assert isinstance(info, CPShardInfo) and info.cp_rank == 1 and info.mode == "zigzag"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cp=st.sampled_from([1, 2, 4, 8]), overlong=st.sampled_from(["error", "split", "truncate"]),
       algorithm=st.sampled_from(["obfd", "ffd", "ogbfd"]))
def test_plan_pad_to_multiple_of_fits_after_cp_padding(seed, cp, overlong, algorithm):
    rng = np.random.default_rng(seed)
    capacity = 64
    lengths = rng.integers(0, 90 if overlong != "error" else 65, int(rng.integers(1, 40)))
    m = 2 * cp
    p = packkit.plan(lengths, capacity, pad_to_multiple_of=m, overlong=overlong, algorithm=algorithm,
                     dp_size=2 if algorithm == "ogbfd" else 1)
    assert p.pad_to_multiple_of == m
    assert (p.padded_lengths % m == 0).all() and (p.padded_lengths >= p.segments.length).all()
    assert (p.padded_bin_tokens <= capacity).all()
    # Real lengths: the segments cover the same tokens an unpadded plan keeps.
    ref = packkit.plan(lengths, capacity, overlong=overlong)
    assert p.kept_tokens == ref.kept_tokens == int(p.segments.length.sum())
    seqs = [rng.integers(1, 100, int(k)) for k in lengths]
    for b in range(p.num_bins):  # each row, packed flat and zigzag-sharded, fits capacity / cp per rank
        rows = p.bins[b]
        if len(rows) == 0:
            continue
        if overlong != "error":  # split / truncated pieces: padded_bin_tokens above is the row's CP size
            continue
        batch = packkit.pack_sequences([seqs[i] for i in rows if lengths[i] > 0])
        out = packkit.shard_context_parallel(batch, cp, 0, "zigzag")
        assert out["input_ids"].shape[1] * cp <= capacity


def test_plan_pad_to_multiple_of_errors_and_overflow_without_it():
    with pytest.raises(ValueError, match="multiple of pad_to_multiple_of"):
        packkit.plan([3, 5], 10, pad_to_multiple_of=4)
    with pytest.raises(ValueError, match="positive"):
        packkit.plan([3, 5], 10, pad_to_multiple_of=0)
    lengths = [7, 7, 9, 9]  # rows planned to capacity 16 overflow once each document is padded to 8
    plain = packkit.plan(lengths, 16)
    padded_rows = [int(cp_padded_lengths(np.asarray(lengths)[r], 4).sum()) for r in plain.bins]
    assert max(padded_rows) > 16
    p = packkit.plan(lengths, 16, pad_to_multiple_of=8)
    assert (p.padded_bin_tokens <= 16).all() and sorted(p.segments.length.tolist()) == [7, 7, 9, 9]


def test_analyze_reports_cp_padding_cost():
    from packkit.analyze.api import AnalyzeError, analyze_lengths

    lengths = np.array([5, 9, 16, 33, 7, 100, 64, 3])
    r = analyze_lengths(lengths, None, max_lengths=[128], cp_sizes="2,4", figures=False)
    rows = r.simulations["context_parallel"]
    assert [row["cp_size"] for row in rows] == [2, 4]
    for row in rows:
        assert row["extra_tokens"] == int(cp_padded_lengths(lengths, row["cp_size"]).sum() - lengths.sum())
    assert "## Context parallelism" in r.report
    assert "## Context parallelism" not in analyze_lengths(lengths, None, max_lengths=[128], figures=False).report
    with pytest.raises(AnalyzeError, match="cp_sizes"):
        analyze_lengths(lengths, None, cp_sizes="2,x", figures=False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_collator_context_parallel_yields_the_rank_shard(mode, layout):
    rng = np.random.default_rng(4)
    feats = [{"input_ids": rng.integers(1, 500, int(n)).tolist()} for n in rng.integers(1, 30, 12)]
    cp = 4
    kw = dict(layout=layout, return_num_items=True)
    plain = packkit.PackingCollator(64, **kw, context_parallel=None)
    total = 0
    for rank in range(cp):
        got = packkit.PackingCollator(64, **kw, context_parallel=(cp, rank, mode))(feats)
        # The same rows the collator would plan for CP (pad-aware in zigzag), then the rank's shard.
        base = packkit.PackingCollator(64, **kw, context_parallel=None)
        base._cp_multiple = 2 * cp if mode == "zigzag" else None
        want = packkit.shard_context_parallel(base(feats), cp, rank, mode)
        assert set(got) == set(want)
        for key in want:
            if isinstance(want[key], torch.Tensor):
                assert torch.equal(got[key], want[key]), key
            else:
                assert got[key] == want[key], key
        total += int((got["shift_labels"] != -100).sum())
    assert total == int(plain(feats)["num_items_in_batch"])  # no predicted token lost or duplicated
    with pytest.raises(ValueError, match="multiple"):
        packkit.PackingCollator(60, context_parallel=(4, 0))
    with pytest.raises(ValueError, match="context_parallel"):
        packkit.PackingCollator(64, context_parallel=(4,))


def test_sampler_and_streaming_context_parallel():
    rng = np.random.default_rng(8)
    lengths = rng.integers(1, 60, 200)
    cp = 4
    sampler = packkit.PackedBatchSampler(lengths, 64, rank=0, world_size=2, seed=1, context_parallel=(cp, 1))
    plain = packkit.PackedBatchSampler(lengths, 64, rank=0, world_size=2, seed=1)
    assert sampler._cp_multiple == 8 and plain._cp_multiple is None
    for rows in sampler:  # every row still fits once each document is padded to 2 * cp
        assert int(cp_padded_lengths(lengths[rows], cp).sum()) <= 64
    with pytest.raises(ValueError, match="multiple"):
        packkit.PackedBatchSampler(lengths, 60, rank=0, world_size=1, context_parallel=(cp, 0))

    examples = [{"input_ids": rng.integers(1, 500, int(n)).tolist()} for n in lengths[:60]]
    for mode in MODES:
        items = {r: list(packkit.PackedIterableDataset(examples, 64, buffer_size=32, layout="flat", rank=0, world_size=1,
                                                       context_parallel=(cp, r, mode))) for r in range(cp)}
        whole_ds = packkit.PackedIterableDataset(examples, 64, buffer_size=32, layout="flat", rank=0, world_size=1)
        whole_ds._cp_multiple = 2 * cp if mode == "zigzag" else None  # the rows the CP loader plans
        full = list(whole_ds)
        assert len({len(v) for v in items.values()}) == 1 and len(items[0]) == len(full)
        for k, whole in enumerate(full):
            if mode == "zigzag":
                assert int(whole["input_ids"].shape[1]) <= 64
            for r in range(cp):
                want = packkit.shard_context_parallel(whole, cp, r, mode)
                assert torch.equal(items[r][k]["input_ids"], want["input_ids"])
                assert torch.equal(items[r][k]["shift_labels"], want["shift_labels"])


@pytest.mark.parametrize("mode", MODES)
def test_one_token_batch_and_trailing_feature_dims(mode):
    """The ids' shape decides how a field is read: a one-token batch's [1, 1] labels are [B, L] (CI's hypothesis
    found them read as [T, f]), and a [1, T, 1] field keeps its trailing dim."""
    batch = packkit.pack_sequences([[53]], labels=[[7]], capacity=8, mask_first_label=False)
    assert batch["input_ids"].shape == (1, 1)
    batch["token_weight"] = torch.arange(1, dtype=torch.float32).reshape(1, 1, 1) + 5
    for rank in range(2):
        out, info = packkit.shard_context_parallel(batch, 2, rank, mode, return_info=True)
        ref = reference_shard(batch["input_ids"].reshape(-1), batch["labels"].reshape(-1),
                              batch["position_ids"].reshape(-1), batch["cu_seq_lens_q"].tolist(), 2, rank, mode)[0]
        assert torch.equal(out["input_ids"][0], ref["input_ids"]) and torch.equal(out["labels"][0], ref["labels"])
        assert out["token_weight"].shape[-1] == 1
        s = info.src_index
        assert torch.equal(out["token_weight"][0, :, 0], torch.where(s >= 0, torch.tensor(5.0), torch.tensor(0.0)))
