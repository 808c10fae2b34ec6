"""Triton pack-kernel tests: they run only under the Triton interpreter (TRITON_INTERPRET=1 set before
triton is imported), in their own pytest process (tests/test_triton_interpreted.py starts one).

In any other process this folder's test modules are not even collected, so a normal ``pytest tests``
never imports triton. Under the interpreter every test here runs with two safety nets (fixtures
below), because the interpreter itself checks no bounds:

* ``strict_memory``: every masked load/store a kernel makes must lie inside one of that launch's
  tensor arguments (their exact byte ranges, not their storages);
* ``guarded_outputs``: every ``torch.empty`` the ops make returns a view into a larger buffer filled
  with a poison byte, with guard bytes on both sides; tests compare whole outputs with the reference
  (an unwritten element shows as poison) and the guards are checked after every test.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"

# The reference (tests/pack_reference.py) lives one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if not INTERPRETING:
    # Never import triton (or the kernels) in a normal pytest process.
    collect_ignore_glob = ["test_*.py"]


_GUARD_BYTES = 64
_POISON = (0xA5, 0x5A, 0xFF, 0x7F, 0x81)


class _GuardedTorch:
    """Stands in for the ``torch`` module inside the packkit.triton_kernels op families: ``empty`` returns poisoned,
    guarded views; everything else is torch."""

    def __init__(self, torch_module):
        self._torch = torch_module
        self.allocations = []

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def empty(self, size, *, dtype=None, device=None, **kwargs):
        torch = self._torch
        assert not kwargs, f"unexpected torch.empty kwargs {kwargs}"
        shape = (int(size),) if isinstance(size, int) else tuple(int(s) for s in size)
        dtype = dtype or torch.get_default_dtype()
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        poison = _POISON[len(self.allocations) % len(_POISON)]
        raw = torch.full((nbytes + 2 * _GUARD_BYTES,), poison, dtype=torch.uint8, device=device)
        body = raw[_GUARD_BYTES:_GUARD_BYTES + nbytes].view(dtype).view(shape)
        self.allocations.append((raw, nbytes, poison))
        return body

    def check_guards(self):
        for raw, nbytes, poison in self.allocations:
            before, after = raw[:_GUARD_BYTES], raw[_GUARD_BYTES + nbytes:]
            assert bool((before == poison).all()) and bool((after == poison).all()), (
                f"a kernel wrote outside a {nbytes}-byte output (guard bytes changed)")
        self.allocations.clear()


@pytest.fixture(autouse=True)
def guarded_outputs(monkeypatch):
    import torch

    from packkit.triton_kernels import layout, pack, pack_batch, unpack

    proxy = _GuardedTorch(torch)
    for family in (layout, pack, pack_batch, unpack):  # each op family allocates its own outputs
        monkeypatch.setattr(family, "torch", proxy)
    yield proxy
    proxy.check_guards()


class MemoryViolation(AssertionError):
    pass


_ISOLATION_GUARD = 256  # bytes of sentinel on each side of every launch argument (a multiple of 16: alignment)
_SENTINEL = 0xC3


class _Isolated:
    """Stands in for ``wrap_triton`` in every op family: each tensor argument of a launch is copied into a buffer of
    its own with ``_ISOLATION_GUARD`` sentinel bytes on both sides, the kernel runs on those copies, and they are
    copied back. So an access just outside a tensor lands in a guard (never in a neighbouring tensor, as it may with
    the allocator's adjacent blocks), which ``strict_memory`` reports for reads and the unchanged sentinels prove
    for writes."""

    launches = 0

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        import torch

        def launch(*args, **kwargs):
            copies = []

            def isolate(v):
                if not isinstance(v, torch.Tensor):
                    return v
                nbytes = v.numel() * v.element_size()
                raw = torch.full((nbytes + 2 * _ISOLATION_GUARD,), _SENTINEL, dtype=torch.uint8)
                body = raw[_ISOLATION_GUARD:_ISOLATION_GUARD + nbytes].view(v.dtype).view(v.shape)
                body.copy_(v)
                copies.append((v, body, raw, nbytes))
                return body

            args = [isolate(a) for a in args]
            kwargs = {k: isolate(v) for k, v in kwargs.items()}
            torch.library.wrap_triton(self.kernel)[grid](*args, **kwargs)
            _Isolated.launches += 1
            for orig, body, raw, nbytes in copies:
                guards = torch.cat([raw[:_ISOLATION_GUARD], raw[_ISOLATION_GUARD + nbytes:]])
                if not bool((guards == _SENTINEL).all()):
                    raise MemoryViolation(f"{self.kernel.__name__} wrote outside a {nbytes}-byte argument")
                if not torch.equal(body, orig):  # written by the kernel (an output)
                    orig.copy_(body)

        return launch


@pytest.fixture(autouse=True)
def isolated_launches(monkeypatch):
    """Every launch of every op family runs on isolated, sentinel-guarded copies of its tensors (above)."""
    from packkit.triton_kernels import context_parallel, layout, pack, pack_batch, tree_pack, unpack

    for family in (layout, pack, pack_batch, unpack, context_parallel, tree_pack):
        monkeypatch.setattr(family, "wrap_triton", _Isolated)
    yield _Isolated


@pytest.fixture(autouse=True)
def strict_memory(monkeypatch):
    """Bounds-check every load and store of the interpreted kernels against the launch's tensors."""
    import numpy as np
    from triton.runtime import interpreter

    ranges: list[tuple[int, int]] = []
    stats = {"loads": 0, "stores": 0}
    init_args = interpreter.GridExecutor._init_args_hst

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        ranges.clear()
        for arg in list(args_hst) + list(kwargs_hst.values()):
            t = interpreter._unwrap_tensor(arg)
            if hasattr(t, "data_ptr"):
                ranges.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
        return args_hst, kwargs_hst

    def check(kind, ptrs, mask, itemsize):
        addr = np.asarray(ptrs.data, dtype=np.uint64)
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)
        addr = addr[active].astype(np.int64)
        if addr.size == 0:
            return
        inside = np.zeros(addr.shape, dtype=bool)
        for lo, hi in ranges:
            inside |= (addr >= lo) & (addr + itemsize <= hi)
        if not inside.all():
            bad = addr[~inside][:4]
            raise MemoryViolation(f"out-of-bounds {kind} at {bad.tolist()} (tensor ranges {ranges})")
        stats[kind + "s"] += int(addr.size)

    load, store = interpreter.InterpreterBuilder.create_masked_load, interpreter.InterpreterBuilder.create_masked_store

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        check("load", ptrs, mask, np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize)
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        check("store", ptrs, mask, np.asarray(value.data).dtype.itemsize)
        return store(self, ptrs, value, mask, cache_policy)

    monkeypatch.setattr(interpreter.GridExecutor, "_init_args_hst", _init_args_hst)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_masked_load", create_masked_load)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_masked_store", create_masked_store)
    yield stats
