"""Planning from lengths on the device (issue 62 part 5): ``pack_on_device(..., plan="device")``.

The device path must (1) pack bit for bit what the host path packs from the same rows, (2) plan rows within 1.05x of
obfd's (same slot rule), (3) never read a tensor back to the host (a detector that a control shows catches an
injected ``.item()``), (4) report what did not fit, and raise where the lengths are on the CPU.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import gpu_gate
import packkit
from packkit.packing.device_pack import host_plan, pack_bins
from packkit.packing.device_plan import plan_bins

pytestmark = pytest.mark.core


def _tokens(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(1, 1000, int(np.sum(lengths)))), torch.tensor(lengths, dtype=torch.int64)


# --- (1) bit-equal to the host plan's layout of the same rows ---------------------------------------------------
@settings(max_examples=120, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), max_size=16), cap=st.integers(1, 64), rows=st.integers(1, 6),
       slots=st.integers(1, 7), with_labels=st.booleans(), mask_first=st.booleans(), start=st.integers(0, 2))
def test_device_batch_equals_the_host_batch_of_the_same_rows(lengths, cap, rows, slots, with_labels, mask_first,
                                                              start):
    ids, lens = _tokens(lengths)
    labels = ids.flip(0) if with_labels else None
    opts = dict(num_rows=rows, max_sequences=slots, mask_first_label=mask_first, position_ids_start=start,
                pad_token_id=7, ignore_index=-5)
    bins, unplaced = plan_bins(lens, cap, rows, slots)
    missing = (bins < 0) & (lens > 0)
    assert int(unplaced) == int(missing.sum())
    if int(unplaced):  # reported on the device, refused by the host-side API (the lengths are on the CPU)
        with pytest.raises(ValueError, match="do not fit"):
            packkit.pack_on_device(ids, lens, cap, labels=labels, plan="device", **opts)
        return
    got, info = packkit.pack_on_device(ids, lens, cap, labels=labels, plan="device", **opts)
    assert torch.equal(info.bins, bins)
    want = packkit.pack_sequences(ids, lengths, labels=labels, plan=host_plan(info, lengths), layout="padded",
                                  row_len=cap, **opts)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    assert got["max_length_q"] == cap >= want["max_length_q"]  # a fixed bound: the exact one is a device value
    assert int(info.max_seqlen) == want["max_length_q"]
    assert int(info.rows_used) == int((bins[bins >= 0].bincount(minlength=rows) > 0).sum())


def test_rows_used_are_a_prefix_and_slots_hold():
    lens = torch.tensor([5, 9, 1, 1, 1, 1, 16, 3, 0, 7])
    bins, unplaced = plan_bins(lens, 16, 8, 3)
    used = sorted(set(bins[bins >= 0].tolist()))
    assert used == list(range(len(used))) and int(unplaced) == 0
    for b in used:
        docs = lens[bins == b]
        assert int(docs.sum()) <= 16 and len(docs) + int(docs.sum() < 16) <= 3
    assert int(bins[8]) == -1  # an empty document takes no row


# --- (2) rows within 1.05x of obfd ------------------------------------------------------------------------------
def _rows(lengths, cap, slots):
    lens = torch.from_numpy(np.asarray(lengths, np.int64))
    host = packkit.plan(lengths, cap, algorithm="obfd", max_sequences=None if slots is None else slots - 1).num_bins
    bins, unplaced = plan_bins(lens, cap, host * 2 + 4, slots or 2**31 - 2)
    assert int(unplaced) == 0
    return int(bins.max()) + 1, host


@pytest.mark.parametrize("cap,slots", [(20_000, 16), (20_000, 64), (32_768, 64), (32_768, None)])
def test_rows_within_1_05_of_obfd_on_seed001_profile(cap, slots):
    from packkit.tools.demo import demo_lengths

    lengths = np.minimum(np.random.default_rng(1).choice(demo_lengths(), 1024, replace=False), cap)
    device, host = _rows(lengths, cap, slots)
    assert device <= 1.05 * host, (device, host)


@pytest.mark.parametrize("n,cap,slots", [(1024, 16_384, 16), (2048, 32_768, 64), (2048, 32_768, None)])
def test_rows_within_1_05_of_obfd_on_rl_rollouts(n, cap, slots):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_rl import rollout_lengths

    device, host = _rows(rollout_lengths(n, cap), cap, slots)
    assert device <= 1.05 * host, (device, host)


# --- (3) no host read anywhere in the device path ---------------------------------------------------------------
class HostRead(AssertionError):
    pass


class _NoScalarReads(TorchDispatchMode):
    """``.item()``, ``bool(t)``, ``int(t)``, ``.tolist()`` all end in aten._local_scalar_dense (a device sync on CUDA)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            raise HostRead(f"host read: {func}")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_host_reads(monkeypatch):
    def refuse(name):
        def method(self, *a, **k):
            raise HostRead(f"host read: Tensor.{name}")
        return method

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(name))
    with _NoScalarReads():
        yield
    monkeypatch.undo()


def _device_path(lens, ids, inject=False):
    bins, unplaced = plan_bins(lens, 64, 6, 4)
    if inject:
        unplaced.item()
    return pack_bins(ids, lens, bins, None, 64, 6, 4)


def test_device_path_makes_no_host_read(monkeypatch):
    ids, lens = _tokens([30, 5, 0, 64, 12, 40, 1, 2, 33, 70])  # 70 > capacity: reported, not read
    with no_host_reads(monkeypatch):
        batch, rows_used, max_seqlen = _device_path(lens, ids)
    assert batch["cu_seq_lens_q"].shape == (6 * 4 + 1,) and int(rows_used) >= 1


@pytest.mark.parametrize("read", ["item", "bool", "int", "tolist", "cpu", "numpy", "index"])
def test_control_the_detector_catches_each_host_read(monkeypatch, read):
    ids, lens = _tokens([3, 4])
    t = lens.sum()
    reads = {"item": lambda: t.item(), "bool": lambda: bool(t), "int": lambda: int(t), "tolist": lambda: lens.tolist(),
             "cpu": lambda: lens.cpu(), "numpy": lambda: lens.numpy(), "index": lambda: [0, 1][t - 7]}
    with pytest.raises(HostRead):
        with no_host_reads(monkeypatch):
            reads[read]()
    with pytest.raises(HostRead):
        with no_host_reads(monkeypatch):
            _device_path(lens, ids, inject=True)


def _traced(fn, *args):
    import torch._dynamo

    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=False):
        return torch.compile(fn, fullgraph=True, backend="eager", dynamic=False)(*args)


def test_device_path_traces_as_one_graph():
    """A second view: dynamo traces plan + pack whole (no graph break, no data-dependent branch or shape). Not a
    detector of ``.item()`` on its own: torch 2.13 traces a bare ``.item()`` even with capture_scalar_outputs=False."""
    ids, lens = _tokens([30, 5, 0, 64, 12, 70])

    def path(ids, lens):
        batch, _, _ = _device_path(lens, ids)
        return batch["input_ids"], batch["labels"], batch["seq_idx"], batch["cu_seq_lens_q"]

    for got, want in zip(_traced(path, ids, lens), path(ids, lens)):
        assert torch.equal(got, want)

    def branches(ids, lens):  # control: a data-dependent branch is refused under fullgraph
        bins, unplaced = plan_bins(lens, 64, 6, 4)
        return bins + 1 if unplaced > 0 else bins

    with pytest.raises(Exception, match="(?i)data-dependent"):
        _traced(branches, ids, lens)


# --- (4) what does not fit, and bad input -----------------------------------------------------------------------
def test_unplaced_is_reported_and_refused_on_the_cpu():
    ids, lens = _tokens([10, 10, 10, 99])
    bins, unplaced = plan_bins(lens, 20, 1, 8)
    assert bins.tolist() == [0, 0, -1, -1] and int(unplaced) == 2
    with pytest.raises(ValueError, match="2 documents do not fit.*document 2.*num_rows=1"):
        packkit.pack_on_device(ids, lens, 20, plan="device", num_rows=1, max_sequences=8)
    with pytest.raises(ValueError, match="document 3: it has 99 tokens, more than capacity=20"):
        packkit.pack_on_device(ids, lens, 20, plan="device", num_rows=4, max_sequences=8)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(max_sequences=4), ValueError, "needs num_rows="),
    (dict(num_rows=2), ValueError, "needs max_sequences="),
    (dict(num_rows=0, max_sequences=4), ValueError, "num_rows must be >= 1"),
    (dict(num_rows=2, max_sequences=True), TypeError, "max_sequences must be an int"),
    (dict(num_rows=2, max_sequences=4, layout="flat"), ValueError, "layout must be one of 'padded'"),
    (dict(num_rows=2, max_sequences=4, algorithm="ffd"), ValueError, "algorithm must be one of 'obfd'"),
    (dict(num_rows=2, max_sequences=4, overlong="split"), ValueError, "overlong must be one of 'error'"),
    (dict(num_rows=2, max_sequences=4, fields={}), TypeError, "does not take fields"),
    (dict(num_rows=2**20, max_sequences=4, capacity=2**12), ValueError, "must fit int32"),
    (dict(num_rows=2, max_sequences=4, capacity=2.5), TypeError, "capacity must be an int"),
    (dict(num_rows=2, max_sequences=4, lengths=torch.tensor([3.0, 4.0])), TypeError, "lengths must be a 1-D integer"),
    (dict(num_rows=2, max_sequences=4, lengths=torch.tensor([3, 5])), ValueError, "lengths sum to 8 but input_ids has 7"),
    (dict(num_rows=2, max_sequences=4, lengths=torch.tensor([8, -1])), ValueError, r"lengths\[1\] is -1"),
    (dict(num_rows=2, max_sequences=4, plan="gpu"), ValueError, "plan must be 'host', 'device'"),
    (dict(num_rows=2, max_sequences=4, lengths=torch.tensor([3, 4], device="meta")), ValueError, "lengths.*meta"),
])
def test_bad_input_is_refused_by_name(kwargs, error, match):
    ids, lens = _tokens([3, 4])
    kwargs = dict(kwargs)
    capacity, lens = kwargs.pop("capacity", 16), kwargs.pop("lengths", lens)
    kwargs.setdefault("plan", "device")
    with pytest.raises(error, match=match):
        packkit.pack_on_device(ids, lens, capacity, **kwargs)


def test_host_path_is_still_the_default():
    ids, lens = _tokens([3, 4])
    batch, info = packkit.pack_on_device(ids, lens, 16)
    assert isinstance(info, packkit.PackInfo) and batch["cu_seq_lens_q"].tolist() == [0, 3, 7, 16]


# --- on a GPU (the GPU session's tests step): no sync, the same batch as the CPU --------------------------------
@gpu_gate.needs_cuda
def test_cuda_device_path_never_synchronises_and_equals_the_cpu():
    ids, lens = _tokens(list(np.random.default_rng(3).integers(1, 900, 200)))
    opts = dict(num_rows=16, max_sequences=32)
    want, want_info = packkit.pack_on_device(ids, lens, 8192, plan="device", **opts)
    ids_d, lens_d = ids.cuda(), lens.cuda()
    packkit.pack_on_device(ids_d, lens_d, 8192, plan="device", **opts)  # warm up (allocator, module loading)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising CUDA call raises
    try:
        got, info = packkit.pack_on_device(ids_d, lens_d, 8192, plan="device", **opts)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert int(info.unplaced) == 0 and torch.equal(info.bins.cpu(), want_info.bins)
    for key, value in want.items():
        assert torch.equal(got[key].cpu(), value) if isinstance(value, torch.Tensor) else got[key] == value, key


@gpu_gate.needs_cuda
def test_cuda_device_path_replays_in_a_cuda_graph():
    """Zero syncs is what lets a step capture planning + packing: the replay of new lengths (same shapes) equals a
    fresh eager pack of them."""
    rng = np.random.default_rng(4)
    first, second = (list(rng.integers(1, 500, 64)) for _ in range(2))
    total = max(sum(first), sum(second))
    ids = torch.zeros(total, dtype=torch.int64, device="cuda")
    lens = torch.zeros(64, dtype=torch.int64, device="cuda")
    opts = dict(num_rows=8, max_sequences=16)

    def load(lengths):
        flat, ln = _tokens(lengths, seed=len(lengths))
        ids.zero_()[:flat.shape[0]].copy_(flat)
        lens.copy_(ln)
        lens[-1] += total - flat.shape[0]  # the buffer's tail is the last document's (zeros): every token is one

    load(first)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        packkit.pack_on_device(ids, lens, 4096, plan="device", **opts)  # warm up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, info = packkit.pack_on_device(ids, lens, 4096, plan="device", **opts)
    load(second)
    graph.replay()
    torch.cuda.synchronize()
    want, want_info = packkit.pack_on_device(ids.cpu(), lens.cpu(), 4096, plan="device", **opts)
    assert torch.equal(info.bins.cpu(), want_info.bins)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(captured[key].cpu(), value), key
