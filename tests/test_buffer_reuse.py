"""Buffer reuse: ``pack_sequences(out=PackBuffers(...))`` and ``PackingCollator(reuse_buffers=True)`` give
bit-identical batches to the fresh path over many calls (sizes and dtypes changing), reuse memory in a
steady state, and keep the documented ring contract."""
from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from pack_reference import reference_pack_batch
from packkit import PackBuffers, PackingCollator

pytestmark = pytest.mark.core

KEYS = ("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k")


def same_batch(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def assert_reference_batch(batch, seqs, labels, info, mask_first_label, position_ids_start):
    """``batch`` equals tests/pack_reference.py's plain-PyTorch pack of ``seqs`` under ``info``'s plan."""
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.int64)
    lab = None if labels is None else torch.cat([torch.as_tensor(x) for x in labels])
    shape = info.layout
    want = reference_pack_batch(ids, lab, info.src_offsets, *(torch.from_numpy(a) for a in info.segments),
                                shape.num_rows, shape.row_len, shape.flat, 0, -100, mask_first_label, position_ids_start)
    for key, value in zip(("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q"), want):
        got = batch[key][0] if shape.flat and key != "cu_seq_lens_q" else batch[key]
        assert got.dtype == value.dtype and torch.equal(got, value), key


def batch_of(rng, n_max=12, len_max=40, label_dtype=None):
    lengths = rng.integers(0, len_max, int(rng.integers(1, n_max)))
    seqs = [rng.integers(1, 30000, int(n)).tolist() for n in lengths]
    labels = None
    if label_dtype is not None:
        labels = [torch.from_numpy(rng.integers(-100, 30000, int(n))).to(label_dtype) for n in lengths]
    return seqs, labels


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_buffers=st.integers(1, 3), layout=st.sampled_from(["flat", "padded"]))
def test_pack_sequences_out_is_bit_identical_over_calls(seed, num_buffers, layout):
    rng = np.random.default_rng(seed)
    buffers = PackBuffers(num_buffers)
    for step in range(6):
        seqs, labels = batch_of(rng, label_dtype=[None, torch.int64, torch.int32][step % 3])
        opts = dict(labels=labels, capacity=48, overlong="split", layout=layout,
                    row_len=int(rng.integers(600, 700)) if layout == "flat" and step % 2 else None,
                    num_rows=None, return_info=True, mask_first_label=bool(step % 2), position_ids_start=step % 3)
        if layout == "padded":
            opts.pop("row_len")
        fresh, fresh_info = packkit.pack_sequences(seqs, **opts)
        reused, info = packkit.pack_sequences(seqs, out=buffers, **opts)
        assert same_batch(fresh, reused), step
        # ... and both equal the plain-PyTorch reference (a bug shared by the fresh and reused paths shows here).
        assert_reference_batch(reused, seqs, labels, info, opts["mask_first_label"], opts["position_ids_start"])
        assert torch.equal(info.cu_seg, fresh_info.cu_seg) and torch.equal(info.cu_seqlens, fresh_info.cu_seqlens)
        # The info works for unpacking, exactly like the fresh one.
        logits = reused["input_ids"].to(torch.float32) * 0.5
        assert torch.equal(packkit.unpack_sequences(logits, info), packkit.unpack_sequences(logits, fresh_info))


def test_steady_state_reuses_memory_and_shape_changes_reallocate():
    buffers = PackBuffers(1)
    rng = np.random.default_rng(0)
    big, _ = batch_of(rng, n_max=30, len_max=60)
    first = packkit.pack_sequences(big, capacity=64, layout="padded", num_rows=40, out=buffers)
    ptr, allocations = first["input_ids"].data_ptr(), buffers.allocations
    assert allocations == 6  # one storage per output
    for _ in range(5):  # smaller batches fit in the same memory: no allocation, same address
        seqs, _ = batch_of(rng, n_max=10, len_max=30)
        batch = packkit.pack_sequences(seqs, capacity=64, layout="padded", num_rows=40, out=buffers)
        assert batch["input_ids"].data_ptr() == ptr and buffers.allocations == allocations
        assert same_batch(batch, packkit.pack_sequences(seqs, capacity=64, layout="padded", num_rows=40))
    # A larger batch (more rows) and another label dtype: reallocated, still identical to fresh.
    seqs, labels = batch_of(rng, n_max=30, len_max=60, label_dtype=torch.int32)
    batch = packkit.pack_sequences(seqs, labels=labels, capacity=64, layout="padded", num_rows=80, out=buffers)
    assert buffers.allocations > allocations
    assert same_batch(batch, packkit.pack_sequences(seqs, labels=labels, capacity=64, layout="padded",
                                                     num_rows=80))


def test_ring_contract():
    """Batch t survives call t+1 (num_buffers=2) and shares memory with batch t+2, which overwrites it."""
    buffers = PackBuffers(2)
    rng = np.random.default_rng(1)
    batches, copies = [], []
    for _ in range(4):
        seqs, _ = batch_of(rng, n_max=8, len_max=20)
        b = packkit.pack_sequences(seqs, capacity=32, layout="padded", num_rows=6, out=buffers)
        if batches:  # the previous batch is intact after this call
            assert same_batch(batches[-1], copies[-1])
        batches.append(b)
        copies.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()})
    for key in ("input_ids", "labels", "position_ids", "seq_idx"):
        assert batches[0][key].data_ptr() == batches[2][key].data_ptr()
        assert batches[0][key].data_ptr() != batches[1][key].data_ptr()
    # Control: with one buffer the previous batch is overwritten, so holding it is not safe.
    one = PackBuffers(1)
    a = packkit.pack_sequences([[1, 2, 3]], capacity=8, layout="padded", num_rows=1, out=one)
    packkit.pack_sequences([[7, 8, 9]], capacity=8, layout="padded", num_rows=1, out=one)
    assert a["input_ids"][0, :3].tolist() == [7, 8, 9]


def test_bad_out_and_num_buffers():
    with pytest.raises(TypeError, match="out must be a packkit.PackBuffers"):
        packkit.pack_sequences([[1, 2]], out={"input_ids": torch.empty(2)})
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_buffers must be a positive int"):
            PackBuffers(bad)
    with pytest.raises(ValueError, match="num_buffers must be >= 1"):
        PackingCollator(reuse_buffers=True, num_buffers=0)


def collator_features(rng, n_max=10, len_max=50):
    feats = []
    for i in range(int(rng.integers(1, n_max))):
        n = int(rng.integers(1, len_max))
        ids = rng.integers(1, 30000, n).tolist()
        kind = i % 3
        if kind == 0:
            feats.append({"input_ids": ids})
        elif kind == 1:
            feats.append({"input_ids": ids, "labels": rng.integers(-100, 30000, n).tolist()})
        else:
            feats.append({"input_ids": ids, "completion_mask": rng.integers(0, 2, n).tolist()})
    return feats


@pytest.mark.parametrize("options", [
    dict(),
    dict(capacity=64, pad_to_multiple_of=16),
    dict(capacity=64, layout="padded"),
    dict(capacity=64, layout="padded", pad_to_capacity=False, pad_to_multiple_of=8, separator_id=5),
    dict(capacity=64, layout="padded", num_rows=12, return_num_items=True, position_ids_start=2),
])
def test_collator_reuse_buffers_is_bit_identical(options):
    rng = np.random.default_rng(len(options))
    fresh = PackingCollator(**options)
    reused = PackingCollator(**options, reuse_buffers=True, num_buffers=2)
    previous = None
    for step in range(8):
        feats = collator_features(rng, n_max=4 if step == 5 else 10)  # one small batch: a shape change
        got, want = reused(feats), fresh(feats)
        assert same_batch(got, want), step
        if previous is not None:  # the batch before survives this call (ring of 2)
            assert same_batch(previous[0], previous[1])
        previous = (got, {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in got.items()})
    assert reused.buffers.allocations < 6 * 8  # memory was reused, not reallocated every call


def test_collator_pickles_without_its_buffers():
    collator = PackingCollator(reuse_buffers=True, num_buffers=3)
    collator([{"input_ids": list(range(1, 5000))}])
    clone = pickle.loads(pickle.dumps(collator))
    assert len(pickle.dumps(collator)) < 10_000  # configuration only, not the packed tokens
    assert clone.buffers.num_buffers == 3 and clone.buffers.allocations == 0
    assert same_batch(clone([{"input_ids": [1, 2, 3]}]), PackingCollator()([{"input_ids": [1, 2, 3]}]))


class _CountingCollator:
    """The collator, counting finished batches in shared memory so the loop can wait for the worker."""

    def __init__(self, collator, done):
        self.collator, self.done = collator, done

    def __call__(self, features):
        batch = self.collator(features)
        with self.done.get_lock():
            self.done.value += 1
        return batch


def _held_batches_corrupted(num_buffers: int) -> int:
    """DataLoader with one worker (prefetch_factor=2); the loop holds the current and previous batch.
    Counts observations of a held batch whose tokens changed under it.

    Deterministic (no sleep): after the loop receives batch i the DataLoader has asked the worker for
    batches up to i + prefetch_factor, so the loop waits on a shared counter until the worker has built
    all of them -- the furthest it may run ahead -- before checking what it holds."""
    import multiprocessing

    from torch.utils.data import DataLoader

    ctx = multiprocessing.get_context("fork")
    done = ctx.Value("i", 0)
    data = [{"input_ids": [i + 1] * 4} for i in range(24)]
    collator = PackingCollator(capacity=8, layout="padded", num_rows=1, reuse_buffers=True, num_buffers=num_buffers)
    held, corrupted = [], 0
    for i, batch in enumerate(DataLoader(data, batch_size=1, collate_fn=_CountingCollator(collator, done),
                                         num_workers=1, prefetch_factor=2, multiprocessing_context=ctx)):
        held = (held + [(i, batch["input_ids"])])[-2:]
        ahead = min(i + 1 + 2, len(data))
        deadline = time.monotonic() + 60
        while done.value < ahead:  # the worker is owed these batches; wait until it has built them
            assert time.monotonic() < deadline, "the worker did not build the batches it was asked for"
            time.sleep(0.001)
        corrupted += sum(int(t[0, 0]) != j + 1 for j, t in held)
    return corrupted


def test_dataloader_worker_ring_size_contract():
    """The documented rule: num_buffers >= prefetch_factor + batches held (2 + 2) is safe; the control
    shows a smaller ring really does corrupt held batches (worker buffers are shared memory)."""
    assert _held_batches_corrupted(4) == 0
    # Exact counts, since the loop waits until the worker ran as far ahead as it may (batch i + 2 of 0..23):
    # 2 buffers: batch i + 2 overwrites held batch i (i <= 21) and i + 1 overwrites held i - 1 (1 <= i <= 22);
    # 3 buffers (the README's "3 was shown to corrupt"): batch i + 2 overwrites held i - 1 (1 <= i <= 21).
    assert _held_batches_corrupted(2) == 22 + 22
    assert _held_batches_corrupted(3) == 21


def test_growing_batches_reallocate_geometrically():
    """A buffer that must grow takes 25% headroom, so batches growing a little each call do not reallocate every
    call (kills the mutmut survivor that always allocated exactly the size asked; docs/mutation.md)."""
    buffers = PackBuffers(1)
    for n in range(40, 80):
        packkit.pack_sequences([list(range(1, n + 1))], out=buffers)
    # The 4 token outputs grow 40 -> 50 -> 62 -> 77 -> 96 (5 allocations each, not 40); cu_seqlens and cu_seg
    # keep their size (one sequence, no padding): 1 each.
    assert buffers.allocations == 4 * 5 + 2, buffers.allocations
