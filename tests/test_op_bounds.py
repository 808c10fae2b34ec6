"""No input can make a CPU op read or write outside its tensors (issue 48, item 3: a class, not one case).

Every tensor an op gets is a view in the middle of a larger buffer whose guard regions are poisoned: after the
call the guards must be unchanged (no write outside an output) and no output may hold the poison of a data
tensor (no read outside an input). The metadata is inconsistent on purpose: the plan generator of
tests/plan_perturb.py for the pack family, hypothesis-drawn cu_seqlens / seg_src for cp_shard (cu_seqlens
starting at 5 included: the fused contiguous read before input_ids, found in the CUDA and Triton kernels), and
hypothesis-drawn node tables / CSR rows for tree_pack. A refusal (RuntimeError) is a pass; a crash fails.
The CUDA kernels' bounds are argued in their sources and exercised under compute-sanitizer on the GPU
(tests/gpu/test_cuda_plan_safety.py); the Triton kernels under the interpreter (tests/triton_interp/).
"""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, example, find, given, settings
from hypothesis import strategies as st

import packkit  # noqa: F401  (registers the ops)
from plan_perturb import bad_case
import pytest

pytestmark = pytest.mark.core

OPS = torch.ops.packkit
GUARD = 37  # elements each side; odd, so views are not aligned to anything special
POISON = {torch.int64: 0x5A5A5A5A5A5A5A5A, torch.int32: 0x5A5A5A5A, torch.float32: -1.2345e30}


class Guarded:
    """Tensors placed inside poisoned buffers, and the check of every guard afterwards."""

    def __init__(self):
        self.buffers = []

    def put(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        buf = torch.full((t.numel() + 2 * GUARD,), POISON[t.dtype], dtype=t.dtype)
        view = buf[GUARD:GUARD + t.numel()].view(t.shape)
        view.copy_(t)
        self.buffers.append((buf, t.numel()))
        return view

    def empty(self, shape, dtype) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        return self.put(torch.full(shape, POISON[dtype], dtype=dtype) if n else torch.empty(shape, dtype=dtype))

    def assert_guards(self):
        for buf, n in self.buffers:
            poison = POISON[buf.dtype]
            assert bool((buf[:GUARD] == poison).all()) and bool((buf[GUARD + n:] == poison).all()), \
                "a write outside its tensor"


def no_poison(*outputs):
    """Outputs hold no poison from a data tensor's guards (every data value in these tests is small)."""
    for out in outputs:
        if out.dtype in (torch.int64, torch.int32):
            assert not bool((out == POISON[out.dtype]).any()), "a read outside an input tensor"


def call(fn):
    try:
        return fn()
    except RuntimeError:
        return None


# --- the pack family --------------------------------------------------------------------------------------
def _plan(g, c):
    return [g.put(t) for t in (c.src, c.src_offsets, c.seg_seq, c.seg_start, c.seg_length, c.bin_offsets,
                               c.cu_seqlens, c.cu_seg)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_pack_family_stays_inside(seed):
    c = bad_case(seed)
    g = Guarded()
    src, offs, seq, start, length, bins, cu, cu_seg = _plan(g, c)
    shape = (c.row_len,) if c.flat else (c.num_rows, c.row_len)
    n_cu = max(c.num_cu_seqlens, 1)
    # functional ops
    out = call(lambda: OPS.layout(length, bins, c.num_rows, c.row_len, c.flat, n_cu))
    out = call(lambda: OPS.pack(src, offs, seq, start, cu, cu_seg, c.num_rows, c.row_len, c.flat, -1.0, 3.0))
    if out is not None:
        no_poison(out)
    out = call(lambda: OPS.pack_batch(src, src, offs, seq, start, length, bins, c.num_rows, c.row_len, c.flat, n_cu,
                                      0, -100, True, 0))
    if out is not None:
        no_poison(*out[:2])
    packed = g.put(torch.arange(c.num_rows * c.row_len, dtype=torch.int64).reshape(shape))
    num_src = int(c.src.shape[0])
    out = call(lambda: OPS.unpack(packed, offs, seq, start, cu, cu_seg, c.flat, num_src, -7.0))
    if out is not None:
        no_poison(out)
    out = call(lambda: OPS.unpack_padded(packed, seq, start, cu, cu_seg, c.flat, max(len(c.src_offsets) - 1, 0), 9,
                                         -7.0))
    if out is not None:
        no_poison(out)
    # out-variants: the outputs are guarded too
    # out-variants: the outputs are guarded too, and start as poison, so a success must have written every element
    ok = lambda fn: call(lambda: (fn(), True)[1])  # noqa: E731  (the out-variants return None)
    cu_out, seg_out = g.empty((n_cu,), torch.int32), g.empty((n_cu - 1,), torch.int32)
    if ok(lambda: OPS.layout_out(length, bins, c.num_rows, c.row_len, c.flat, cu_out, seg_out)):
        no_poison(cu_out, seg_out)
    out = g.empty(shape, torch.int64)
    if ok(lambda: OPS.pack_out(src, offs, seq, start, cu, cu_seg, c.flat, out, -1.0, None)):
        no_poison(out)
    outs = [g.empty(shape, torch.int64), g.empty(shape, torch.int64), g.empty(shape, torch.int64),
            g.empty(shape, torch.int32), g.empty((n_cu,), torch.int32), g.empty((n_cu - 1,), torch.int32)]
    if ok(lambda: OPS.pack_batch_out(src, None, offs, seq, start, length, bins, c.flat, *outs, 0, -100, True, 0)):
        no_poison(*outs)
    back = g.empty((num_src,), torch.int64)
    if ok(lambda: OPS.unpack_out(packed, offs, seq, start, cu, cu_seg, c.flat, back, -7.0)):
        no_poison(back)
    back_padded = g.empty((max(len(c.src_offsets) - 1, 0), 9), torch.int64)
    if ok(lambda: OPS.unpack_padded_out(packed, seq, start, cu, cu_seg, c.flat, back_padded, -7.0)):
        no_poison(back_padded)
    g.assert_guards()


# --- cp_shard: inconsistent cu_seqlens, padded cu_seqlens and seg_src ----------------------------------------
HUGE = st.sampled_from([2**31 - 1, -(2**31), 2**40, -(2**40), 2**62, -(2**62)])


def _perturb(draw, values, lo=-3, hi=3):
    """values with one entry moved by a little or set to a huge value (the caller may skip this)."""
    if not values:
        return values
    values = list(values)
    i = draw(st.integers(0, len(values) - 1))
    values[i] = draw(HUGE) if draw(st.booleans()) else values[i] + draw(st.integers(lo, hi).filter(bool))
    return values


@st.composite
def cp_cases(draw):
    """A consistent cp_shard call (lengths -> cu_seqlens, padded lengths, seg_src, out_len), then often one
    entry of cu_seqlens / cu_seqlens_padded / seg_src / out_len made inconsistent."""
    cp = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(0, 9), min_size=0, max_size=5))
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    cup = [0]
    for n in lengths:
        cup.append(cup[-1] + -(-n // (2 * cp)) * 2 * cp + 2 * cp * draw(st.integers(0, 1)))
    fused = draw(st.booleans())
    num_src = cu[-1] + draw(st.integers(0, 4)) if fused else cu[-1]
    seg_src = [draw(st.integers(0, num_src - n)) if draw(st.integers(0, 4)) else -1 for n in lengths]
    zigzag = draw(st.booleans())
    out_len = cup[-1] // cp if zigzag else -(-cu[-1] // cp) + draw(st.integers(0, 3))
    what = draw(st.sampled_from(["none", "cu", "cu", "cup", "seg_src", "out_len", "start5"]))
    if what == "cu":
        cu = [max(-(2**31), min(2**31 - 1, v)) for v in _perturb(draw, cu)]
    elif what == "cup":
        cup = [max(-(2**31), min(2**31 - 1, v)) for v in _perturb(draw, cup)]
    elif what == "seg_src":
        seg_src = _perturb(draw, seg_src)
    elif what == "out_len":
        out_len = max(0, out_len + draw(st.integers(-3, 3)))
    elif what == "start5":  # the review's case: every boundary moved up by 5 (cu[0] = 5)
        cu = [v + 5 for v in cu]
    return dict(num_src=num_src, cu=cu, cup=cup, fused=fused, seg_src=seg_src, cp=cp, rank=draw(st.integers(0, cp - 1)),
                zigzag=zigzag, out_len=out_len, id64=draw(st.booleans()), what=what)


@settings(max_examples=300, deadline=None)
@given(case=cp_cases())
@example(case=dict(num_src=10, cu=[5, 10], cup=[0, 8], fused=True, seg_src=[0], cp=1, rank=0, zigzag=False,
                   out_len=10, id64=True, what="start5"))  # issue 48: cu_seqlens starting at 5
def test_cp_shard_stays_inside(case):
    run_cp(case)


def run_cp(case):
    """cp_shard on guarded tensors; the outputs, or None where the op refused."""
    g = Guarded()
    dtype = torch.int64 if case["id64"] else torch.int32
    ids = g.put(torch.arange(1, case["num_src"] + 1, dtype=dtype))
    labels = g.put(torch.arange(100, 100 + case["num_src"], dtype=torch.int64))
    cu = g.put(torch.tensor(case["cu"], dtype=torch.int32))
    cup = g.put(torch.tensor(case["cup"], dtype=torch.int32))
    if case["fused"]:
        pos, seg_src = None, g.put(torch.tensor(case["seg_src"], dtype=torch.int64))
    else:
        pos, seg_src = g.put(torch.arange(case["num_src"], dtype=torch.int64)), None
    out = call(lambda: OPS.cp_shard(ids, labels, pos, cu, cup, case["cp"], case["rank"], case["zigzag"],
                                    case["out_len"], 0, -100, seg_src, 0, None))
    if out is not None:
        no_poison(*out[:3])
    g.assert_guards()
    return out


def test_cp_shard_refuses_cu_seqlens_not_starting_at_zero():
    """The fused contiguous case the review found: cu_seqlens [5, 10] would read 5 tokens before input_ids."""
    ids, labels = torch.arange(10), torch.arange(10)
    cu = torch.tensor([5, 10], dtype=torch.int32)
    try:
        OPS.cp_shard(ids, labels, None, cu, torch.tensor([0, 8], dtype=torch.int32), 1, 0, False, 10, 0, -100,
                     torch.tensor([0]), 0, None)
    except RuntimeError as e:
        assert "cu_seqlens must run from 0" in str(e)
    else:
        raise AssertionError("cp_shard accepted cu_seqlens starting at 5")


# --- tree_pack: inconsistent node tables and CSR rows ----------------------------------------------------------
@st.composite
def tree_cases(draw):
    """A consistent tree_pack call (rows of back-to-back nodes reading inside the source), then often one entry of
    a node column or of row_offsets made inconsistent (or rows dropped while nodes remain)."""
    num_src = draw(st.integers(1, 20))
    num_rows, row_len = draw(st.integers(0, 3)), draw(st.integers(0, 12))
    cols = {k: [] for k in ("src", "dst", "len", "pos", "end")}
    ro = [0]
    for r in range(num_rows):
        at = r * row_len
        for _ in range(draw(st.integers(0, 3))):
            n = draw(st.integers(0, min(num_src, (r + 1) * row_len - at)))
            cols["src"].append(draw(st.integers(0, num_src - n)))
            cols["dst"].append(at)
            cols["len"].append(n)
            cols["pos"].append(draw(st.integers(0, 5)))
            at += n
            cols["end"].append(draw(st.integers(at - r * row_len, row_len)))
        ro.append(len(cols["src"]))
    what = draw(st.sampled_from(["none", "src", "dst", "len", "pos", "end", "ro", "ro", "no_rows"]))
    if what in cols:
        cols[what] = _perturb(draw, cols[what])
    elif what == "ro":
        ro = _perturb(draw, ro)
    elif what == "no_rows" and cols["src"]:
        num_rows, ro = 0, [0]
    return dict(num_src=num_src, **cols, ro=ro, num_rows=num_rows, row_len=row_len, what=what)


@settings(max_examples=300, deadline=None)
@given(case=tree_cases())
@example(case=dict(num_src=4, src=[0], dst=[0], len=[2], pos=[0], end=[2], ro=[0], num_rows=0, row_len=4,
                   what="no_rows"))
@example(case=dict(num_src=11, src=[], dst=[], len=[], pos=[], end=[], ro=[0, 2**62, 0], num_rows=2, row_len=10,
                   what="ro"))  # found here (a segfault): row 0 walked towards node 2^62 before row 1's order was checked
def test_tree_pack_stays_inside(case):
    run_tree(case)


def run_tree(case):
    """tree_pack on guarded tensors; the outputs, or None where the op refused."""
    g = Guarded()
    ids = g.put(torch.arange(1, case["num_src"] + 1, dtype=torch.int64))
    labels = g.put(torch.arange(100, 100 + case["num_src"], dtype=torch.int32))
    cols = [g.put(torch.tensor(case[k], dtype=torch.int64)) for k in ("src", "dst", "len", "pos", "end")]
    ro = g.put(torch.tensor(case["ro"], dtype=torch.int64))
    out = call(lambda: OPS.tree_pack(ids, labels, *cols, ro, case["num_rows"], case["row_len"], 0, -100))
    if out is not None:
        no_poison(*out[:2])
    g.assert_guards()
    return out


def test_generators_make_both_outcomes():
    """Control: the properties above only mean something if the drawn calls both run (outputs checked for
    poison) and are refused, consistent ones included."""
    quick = settings(max_examples=300, deadline=None, database=None)
    for strategy, run in ((cp_cases(), run_cp), (tree_cases(), run_tree)):
        ran = find(strategy, lambda c, run=run: c["what"] == "none" and run(c) is not None and run(c)[0].numel() > 0,
                   settings=quick)
        assert ran is not None
        find(strategy, lambda c, run=run: c["what"] != "none" and run(c) is None, settings=quick)
        find(strategy, lambda c, run=run: c["what"] != "none" and run(c) is not None, settings=quick)


def test_guards_catch_an_out_of_range_write():
    """Control: a write one element past a guarded view is seen."""
    g = Guarded()
    t = g.put(torch.zeros(4, dtype=torch.int64))
    g.buffers[0][0][GUARD + 4] = 0  # what an off-by-one write would do
    try:
        g.assert_guards()
    except AssertionError:
        pass
    else:
        raise AssertionError("the guard check missed a write")
    assert t.numel() == 4
    # and a read: poison copied into an output is reported
    try:
        no_poison(torch.tensor([POISON[torch.int64]]))
    except AssertionError:
        return
    raise AssertionError("the read check missed the poison")
