"""packkit.pack_context_parallel (issue 25, fused path): a CP rank's shard gathered straight from the unpacked
sequences by one ``packkit::cp_shard`` launch (its ``seg_src`` mode). Bit for bit equal to the plain-PyTorch
reference (pack with tests/pack_reference.py, split with tests/cp_reference.py) and to pack-then-shard;
unshard of all ranks gives the packed row back; opcheck and torch.compile on the op's new arguments; the
collator's CP path is unchanged and makes one packkit op call. Kept small (CI budget): ~5 s on 2 cores."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import gpu_gate
import packkit
from cp_fused_cases import KEYS, check_reference, make_case, op_args
from gpu_gate import on
from packkit.context_parallel import pack_context_parallel, shard_context_parallel
from packkit.context_parallel.fused import FusedPlan
from packkit.training import collator as collator_module

pytestmark = pytest.mark.core

BACKENDS = ["cpu", pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]
MODES = ("zigzag", "contiguous")


def _assert_same_batch(want: dict, got: dict) -> None:
    """Same keys, and every value equal (tensors: same dtype, bit for bit)."""
    assert want.keys() == got.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == got[key].dtype and torch.equal(value, got[key]), key
        else:
            assert value == got[key], key


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
def test_fused_matches_the_reference_bit_for_bit(backend, mode):
    device = on(backend)
    for seed in range(10):
        seqs, lengths, kw = make_case(seed)
        for cp in (1, 2, 3):
            for rank in range(cp):
                torch.full((1 << 18,), 0x5A, dtype=torch.uint8, device=device)  # poison the allocator's next blocks
                out, info = pack_context_parallel(seqs, cp, rank, mode, device=device, backend=backend,
                                                  return_info=True, **kw)
                ref = check_reference(out, seqs, lengths, kw, cp, rank, mode)
                assert info.src_index.cpu().tolist() == ref["src_index"].tolist()


@settings(max_examples=30, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8), cp=st.integers(1, 5),
       mode=st.sampled_from(MODES), layout=st.sampled_from(["flat", "padded", "capacity"]),
       separator=st.sampled_from([None, 5]))
def test_property_fused_equals_pack_then_shard_and_unshards(lengths, cp, mode, layout, separator):
    rng = np.random.default_rng(sum(lengths) * 7 + cp)
    seqs = [rng.integers(1, 1000, k).tolist() for k in lengths]
    labels = [rng.integers(-100, 1000, k).tolist() for k in lengths]
    kw = dict(labels=labels, position_ids_start=1)
    if layout == "padded":
        kw.update(capacity=max(lengths) + 3, layout="padded")
    elif layout == "capacity":
        kw.update(capacity=16, overlong="split", row_len=None)
    batch, pinfo = packkit.pack_sequences(seqs, return_info=True, **kw)
    if separator is not None:  # what PackingCollator(separator_id=) does to the packed batch
        starts = batch["cu_seq_lens_q"][:-1].long()
        seg_src = FusedPlan(pinfo.segments, pinfo.layout, pinfo.lengths, 1, 0, "contiguous").seg_src
        batch["labels"].reshape(-1)[starts[torch.from_numpy(seg_src >= 0)]] = separator  # real segments only
    shards = []
    for rank in range(cp):
        want = shard_context_parallel(batch, cp, rank, mode, pack_info=pinfo)
        got, info = pack_context_parallel(seqs, cp, rank, mode, separator_id=separator, return_info=True, **kw)
        _assert_same_batch(want, got)
        shards.append((got, info))
    for key in ("input_ids", "labels"):
        back = packkit.unshard_context_parallel([out[key] for out, _ in shards], shards[0][1])
        assert torch.equal(back, batch[key].reshape(-1)), key


def test_token_fields_follow_the_split():
    rng = np.random.default_rng(3)
    lengths = [5, 9, 2]
    seqs = [rng.integers(1, 100, k).tolist() for k in lengths]
    weights = [torch.from_numpy(rng.random((k, 2))).float() for k in lengths]
    fields = {"w": weights, "attention_mask": [[1] * k for k in lengths]}
    batch, info = packkit.pack_sequences(seqs, capacity=20, layout="padded", fields=fields, pad_values={"w": 7.0},
                                         return_info=True)
    for rank in range(2):
        want = shard_context_parallel(batch, 2, rank, pack_info=info)
        got = pack_context_parallel(seqs, 2, rank, capacity=20, layout="padded", fields=fields, pad_values={"w": 7.0})
        assert "attention_mask" not in got and torch.equal(want["w"], got["w"])


def test_bad_input_raises_clear_errors():
    seqs = [[1, 2, 3], [4, 5]]
    with pytest.raises(ValueError, match="cp_rank"):
        pack_context_parallel(seqs, 2, 2)
    with pytest.raises(TypeError, match="cp_size"):
        pack_context_parallel(seqs, 2.0, 0)
    with pytest.raises(ValueError, match="mode"):
        pack_context_parallel(seqs, 2, 0, "ring")
    with pytest.raises(TypeError, match="separator_id"):
        pack_context_parallel(seqs, 2, 0, separator_id=1.5)
    with pytest.raises(ValueError, match="layout"):
        pack_context_parallel(seqs, 2, 0, layout="rows")
    with pytest.raises(ValueError, match="not split per token"):
        pack_context_parallel(seqs, 2, 0, fields={"pixel_values": [torch.zeros(4, 3), None]})
    args = op_args(2, "zigzag")
    ids, lab, _, cu, cup, *rest = args
    seg_src = rest[-3]
    with pytest.raises(RuntimeError, match="position_ids must be None"):
        torch.ops.packkit.cp_shard(ids, lab, ids.long(), cu, cup, *rest)
    with pytest.raises(RuntimeError, match="one entry per segment"):
        torch.ops.packkit.cp_shard(ids, lab, None, cu, cup, *rest[:-3], seg_src[:-1], *rest[-2:])
    with pytest.raises(RuntimeError, match="outside"):
        torch.ops.packkit.cp_shard(ids, lab, None, cu, cup, *rest[:-3], seg_src + ids.numel(), *rest[-2:])
    with pytest.raises(RuntimeError, match="fused mode"):
        torch.ops.packkit.cp_shard(ids, lab, torch.zeros(ids.numel(), dtype=torch.int64), cu, cup, *rest[:-3], None,
                                   0, 1)


@pytest.mark.parametrize("mode", MODES)
def test_opcheck_fused(mode):
    for seed in (0, 3):
        torch.library.opcheck(torch.ops.packkit.cp_shard.default, op_args(seed, mode))


def test_compile_fullgraph_fused():
    args = op_args(4, "zigzag")

    def step(ids, lab, cu, cup, seg_src):
        out = torch.ops.packkit.cp_shard(ids, lab, None, cu, cup, *args[5:11], seg_src, 2, -100)
        return out[0] * 2, out[2], out[3] + 1

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    inputs = (args[0], args[1], args[3], args[4], args[11])
    assert all(torch.equal(a, b) for a, b in zip(compiled(*inputs), step(*inputs)))


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _features(seed, n=6):
    rng = np.random.default_rng(seed)
    feats = []
    for i in range(n):
        k = int(rng.integers(1, 40))
        f = {"input_ids": rng.integers(1, 1000, k).tolist(), "attention_mask": [1] * k,
             "w": rng.random(k).astype(np.float32)}
        if i % 2:
            f["labels"] = rng.integers(-100, 1000, k).tolist()
        feats.append(f)
    return feats


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_collator_fused_output_unchanged_and_one_op_call(mode, layout, monkeypatch):
    for seed, (separator, num_items, overlong) in enumerate([(-100, True, "truncate"), (None, False, "split"),
                                                             (7, True, "drop")]):
        feats = _features(seed)
        for cp in (1, 2, 4):
            for rank in {0, cp - 1}:
                col = packkit.PackingCollator(48, layout=layout, context_parallel=(cp, rank, mode),
                                              separator_id=separator, return_num_items=num_items, overlong=overlong,
                                              pad_values={"w": 2.5})
                with _CountOps() as fused_ops:
                    got = col(feats)
                with monkeypatch.context() as m:  # the pack-then-shard path, as before the fused one
                    m.setattr(collator_module.PackingCollator, "_cp_token_fields", lambda *a: None)
                    with _CountOps() as old_ops:
                        want = col(feats)
                _assert_same_batch(want, got)
                packkit_calls = [c for c in fused_ops.calls if c.startswith("packkit.")]
                assert packkit_calls == ["packkit.cp_shard"], packkit_calls
                assert len([c for c in old_ops.calls if c.startswith("packkit.")]) >= 3  # pack_batch, layout, ...


def test_streaming_items_use_the_fused_path(monkeypatch):
    from packkit.training.streaming import items as items_module

    def pack_then_shard(ids, cp_size, cp_rank, mode="zigzag", *, lengths, **args):
        batch = packkit.pack_sequences(ids, lengths, **args)
        return shard_context_parallel(batch, cp_size, cp_rank, mode, pad_token_id=args["pad_token_id"],
                                      ignore_index=args["ignore_index"])

    examples = [{"input_ids": list(range(1, k + 1))} for k in (5, 17, 3, 30, 9, 12, 7)]
    for rank in range(2):
        def run():
            return list(packkit.PackedIterableDataset(examples, 64, buffer_size=32, rank=0, world_size=1,
                                                      context_parallel=(2, rank)))

        with _CountOps() as ops:
            items = run()
        assert [c for c in ops.calls if c.startswith("packkit.")] == ["packkit.cp_shard"] * len(items)
        with monkeypatch.context() as m:
            m.setattr(items_module, "pack_context_parallel", pack_then_shard)
            want = run()
        assert len(items) == len(want) >= 2
        for item, old in zip(items, want):
            assert item.keys() == old.keys()
            assert all(torch.equal(old[k], item[k]) for k in KEYS)
