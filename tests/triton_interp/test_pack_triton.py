"""The Triton pack kernels (packkit.triton_kernels.pack), run by the Triton interpreter on CPU tensors,
equal tests/pack_reference.py bit for bit: layout, pack, pack_batch, unpack, unpack_padded.

Only meaningful with TRITON_INTERPRET=1 set before triton is imported (conftest.py does not even
collect this module otherwise); tests/test_triton_interpreted.py runs it in its own process. Every
test also runs under conftest.py's bounds checker and poisoned, guarded output allocator.
"""
from __future__ import annotations

import contextlib
import math
import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - conftest.py already ignores us
    pytest.skip("the Triton kernel tests need TRITON_INTERPRET=1 set before triton is imported",
                allow_module_level=True)
pytest.importorskip("triton")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import packkit  # noqa: E402
from pack_reference import (  # noqa: E402
    reference_layout,
    reference_pack,
    reference_pack_batch,
    reference_unpack,
    reference_unpack_padded,
)
from packkit.triton_kernels import common, unpack  # noqa: E402
from packkit.triton_kernels import pack as tk  # noqa: E402

pytestmark = pytest.mark.full

I64, I32 = torch.int64, torch.int32
NAN, INF = float("nan"), float("inf")

# Block configurations: the defaults (one program covers these small inputs) and tiny tiles (many
# programs, several layout steps, a loop over feature chunks).
CONFIGS = {
    "default": dict(tk._CONFIG),
    "tiny": dict(tk._CONFIG, block=16, layout_block=8, max_block_f=2),
}
SMALL = dict(tk._CONFIG, block=256, layout_block=256)
DTYPES = [torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.float16, torch.bool, torch.uint8,
          torch.complex64, torch.float64, torch.int16, torch.int8, torch.complex128]
FEATURES = [(), (3,), (2, 2)]


@contextlib.contextmanager
def config(name):
    saved = dict(tk._CONFIG)
    tk._CONFIG.update(SMALL if name == "small" else CONFIGS[name])
    try:
        yield
    finally:
        tk._CONFIG.clear()
        tk._CONFIG.update(saved)


# --------------------------------------------------------------------------------------------------
# Plans and data
# --------------------------------------------------------------------------------------------------


class Plan:
    """A plan as the ops take it: source offsets, CSR segments, and a layout (flat or padded)."""

    def __init__(self, lengths, segments, bin_offsets, num_rows, row_len, flat):
        self.lengths = [int(x) for x in lengths]
        offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(self.lengths, dtype=np.int64)
        self.src_offsets = torch.from_numpy(offsets)
        segs = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
        self.seg_seq = torch.from_numpy(segs[:, 0].copy())
        self.seg_start = torch.from_numpy(segs[:, 1].copy())
        self.seg_length = torch.from_numpy(segs[:, 2].copy())
        self.bin_offsets = torch.tensor(bin_offsets, dtype=I64)
        self.num_rows, self.row_len, self.flat = num_rows, row_len, flat
        self.cu, self.cu_seg = reference_layout(self.seg_length, self.bin_offsets, num_rows, row_len, flat)

    @property
    def num_src_tokens(self):
        return int(self.src_offsets[-1])

    @property
    def num_cu(self):
        return self.cu.numel()

    @property
    def total(self):
        return self.row_len * (1 if self.flat else self.num_rows)

    def __repr__(self):
        return (f"Plan(lengths={self.lengths}, segments={list(zip(self.seg_seq.tolist(), self.seg_start.tolist(), self.seg_length.tolist()))}, "
                f"bins={self.bin_offsets.tolist()}, rows={self.num_rows}, row_len={self.row_len}, flat={self.flat})")


def from_packkit(lengths, capacity, flat, extra_rows=0, extra_flat=0, algorithm="obfd"):
    p = packkit.plan(np.asarray(lengths, dtype=np.int64), capacity, algorithm=algorithm, overlong="split")
    s = p.segments
    segments = np.stack([s.seq_index, s.start, s.length], axis=1) if len(s.length) else np.zeros((0, 3))
    num_bins = len(s.bin_offsets) - 1
    if flat:
        return Plan(lengths, segments, s.bin_offsets, 1, int(np.sum(s.length)) + extra_flat, True)
    return Plan(lengths, segments, s.bin_offsets, num_bins + extra_rows, capacity, False)


def random_bits(shape, dtype, gen):
    """Random data covering every bit pattern (NaN payloads, denormals, -0.0); bools are 0/1."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def as_bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_bits_equal(got, want, what=""):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not torch.equal(as_bits(got), as_bits(want)):
        diff = (as_bits(got) != as_bits(want)).nonzero().flatten()[:8].tolist()
        raise AssertionError(f"{what}: bits differ at byte offsets {diff}\ngot  {got}\nwant {want}")


def values_for(dtype):
    """pad/first values torch can convert to dtype."""
    if dtype == torch.bool:
        return [0.0, 1.0, 0.5, -2.0]
    if dtype == torch.uint8:
        return [0.0, 1.0, 255.0, 17.9]
    if dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
        return [0.0, -1.0, 7.0, -100.0, 126.5]
    return [0.0, -0.0, 1.5, -3.25, NAN, INF, -INF, 1e-40, 1e300 if dtype in (torch.float64, torch.complex128) else 3.0]


# --------------------------------------------------------------------------------------------------
# Running every op against the reference
# --------------------------------------------------------------------------------------------------


def dispatched(value):
    """The pad value the op's Python body receives. torch's dispatcher drops trailing arguments equal
    to their schema default before calling a Python kernel, and -0.0 == 0.0: a trailing
    pad_value=-0.0 arrives as the default 0.0 (torch behaviour for every Python custom op; the C++
    ops keep -0.0). Not trailing (pack with a first_value), -0.0 survives."""
    return 0.0 if value == 0.0 and math.copysign(1.0, value) < 0 else value


def check_layout(plan):
    cu, cu_seg = tk.layout(plan.seg_length, plan.bin_offsets, plan.num_rows, plan.row_len, plan.flat, plan.num_cu)
    assert_bits_equal(cu, plan.cu, f"layout cu_seqlens {plan}")
    assert_bits_equal(cu_seg, plan.cu_seg, f"layout cu_seg {plan}")


def check_pack(plan, dtype, feature, pad_value, first_value, gen):
    src = random_bits((plan.num_src_tokens,) + feature, dtype, gen)
    got = tk.pack(src, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.cu, plan.cu_seg, plan.num_rows,
                  plan.row_len, plan.flat, pad_value, first_value)
    want = reference_pack(src, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.cu, plan.cu_seg, plan.num_rows,
                          plan.row_len, plan.flat, pad_value if first_value is not None else dispatched(pad_value),
                          first_value)
    assert_bits_equal(got, want, f"pack {dtype} {feature} pad={pad_value} first={first_value} {plan}")


def check_pack_batch(plan, ids_dtype, labels_dtype, gen, pad_id=0, ignore_index=-100, mask_first_label=True,
                     position_start=0):
    ids = torch.randint(-2**31, 2**31 - 1, (plan.num_src_tokens,), generator=gen).to(ids_dtype)
    labels = None if labels_dtype is None else torch.randint(-5, 50000, (plan.num_src_tokens,), generator=gen).to(
        labels_dtype)
    got = tk.pack_batch(ids, labels, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.seg_length,
                        plan.bin_offsets, plan.num_rows, plan.row_len, plan.flat, plan.num_cu, pad_id, ignore_index,
                        mask_first_label, position_start)
    want = reference_pack_batch(ids, labels, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.seg_length,
                                plan.bin_offsets, plan.num_rows, plan.row_len, plan.flat, pad_id, ignore_index,
                                mask_first_label, position_start)
    assert len(got) == 5
    for name, g, w in zip(("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens"), got, want):
        assert_bits_equal(g, w, f"pack_batch {name} ids={ids_dtype} labels={labels_dtype} {plan}")


def packed_shape(plan, feature):
    return ((plan.row_len,) if plan.flat else (plan.num_rows, plan.row_len)) + feature


def check_unpack(plan, dtype, feature, pad_value, gen):
    packed = random_bits(packed_shape(plan, feature), dtype, gen)
    got = tk.unpack(packed, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.cu, plan.cu_seg, plan.flat,
                    plan.num_src_tokens, pad_value)
    want = reference_unpack(packed, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.cu, plan.cu_seg, plan.flat,
                            dispatched(pad_value))
    assert_bits_equal(got, want, f"unpack {dtype} {feature} {plan}")


def check_unpack_padded(plan, dtype, feature, max_len, pad_value, gen):
    packed = random_bits(packed_shape(plan, feature), dtype, gen)
    n = len(plan.lengths)
    got = tk.unpack_padded(packed, plan.seg_seq, plan.seg_start, plan.cu, plan.cu_seg, plan.flat, n, max_len,
                           pad_value)
    want = reference_unpack_padded(packed, plan.seg_seq, plan.seg_start, plan.cu, plan.cu_seg, plan.flat, n, max_len,
                                   dispatched(pad_value))
    assert_bits_equal(got, want, f"unpack_padded {dtype} {feature} max_len={max_len} {plan}")


def check_all(plan, gen, dtype=torch.float32, feature=(), pad_value=-1.0, first_value=None, max_len=None):
    check_layout(plan)
    check_pack(plan, dtype, feature, pad_value, first_value, gen)
    check_pack_batch(plan, I64, None, gen)
    check_unpack(plan, dtype, feature, pad_value, gen)
    longest = max(plan.lengths, default=0)
    check_unpack_padded(plan, dtype, feature, longest if max_len is None else max_len, pad_value, gen)


# --------------------------------------------------------------------------------------------------
# Hand-written plans
# --------------------------------------------------------------------------------------------------


def hand_plans():
    # Bins with zero segments in the middle, a zero-length source sequence, split segments
    # (seg_start > 0), a full row (no padding segment), and more rows than bins.
    lengths = [5, 0, 9, 3, 4]
    segments = [(2, 0, 8), (0, 0, 5), (3, 0, 3), (2, 8, 1), (4, 0, 4)]
    yield "padded_empty_bins", Plan(lengths, segments, [0, 1, 1, 3, 3, 5], 7, 8, False)
    yield "flat_extra_padding", Plan(lengths, segments, [0, 1, 1, 3, 3, 5], 1, 30, True)
    yield "flat_exact", Plan(lengths, segments, [0, 2, 5], 1, 21, True)
    yield "padded_all_full", Plan([4, 4, 8], [(0, 0, 4), (1, 0, 4), (2, 0, 8)], [0, 2, 3], 2, 8, False)
    yield "no_segments_padded", Plan([0, 0], [], [0], 3, 5, False)
    yield "no_segments_flat", Plan([], [], [0], 1, 6, True)
    yield "empty_flat", Plan([], [], [0], 1, 0, True)
    yield "zero_rows", Plan([], [], [0], 0, 4, False)
    yield "zero_row_len", Plan([0], [], [0, 0], 3, 0, False)
    yield "one_token_rows", Plan([3], [(0, 2, 1), (0, 0, 1), (0, 1, 1)], [0, 1, 2, 3], 5, 1, False)
    yield "packkit_split", from_packkit([30, 0, 7, 12, 16, 1, 0, 25], 16, False, extra_rows=2)
    yield "packkit_split_flat", from_packkit([30, 0, 7, 12, 16, 1, 0, 25], 16, True, extra_flat=3)


HAND = dict(hand_plans())


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("name", HAND)
def test_hand_plans_all_ops(name, cfg):
    gen = torch.Generator().manual_seed(1)
    with config(cfg):
        check_all(HAND[name], gen, first_value=2.0)
        check_all(HAND[name], gen, dtype=torch.int64, feature=(3,), max_len=3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("feature", FEATURES, ids=str)
def test_pack_unpack_dtypes_and_features(dtype, feature):
    gen = torch.Generator().manual_seed(2)
    values = values_for(dtype)
    with config("tiny" if feature == (2, 2) else "default"):
        for plan in (HAND["padded_empty_bins"], HAND["flat_extra_padding"]):
            for first in (None, values[2]):
                check_pack(plan, dtype, feature, values[1], first, gen)
            check_unpack(plan, dtype, feature, values[-1], gen)
            check_unpack_padded(plan, dtype, feature, 6, values[3], gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.complex64, torch.float64],
                         ids=str)
def test_special_float_values(dtype):
    gen = torch.Generator().manual_seed(3)
    plan = HAND["padded_empty_bins"]
    for pad in (NAN, -0.0, INF, -INF, 1e-40):
        check_pack(plan, dtype, (), pad, -pad, gen)
        check_unpack(plan, dtype, (), pad, gen)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("ids_dtype,labels_dtype", [(I64, None), (I32, None), (I64, I32), (I32, I64), (I32, I32)],
                         ids=str)
def test_pack_batch_options(ids_dtype, labels_dtype, cfg):
    gen = torch.Generator().manual_seed(4)
    with config(cfg):
        for plan in (HAND["padded_empty_bins"], HAND["flat_extra_padding"], HAND["packkit_split"]):
            check_pack_batch(plan, ids_dtype, labels_dtype, gen)
            check_pack_batch(plan, ids_dtype, labels_dtype, gen, pad_id=7, ignore_index=-1, mask_first_label=False,
                             position_start=2)
            check_pack_batch(plan, ids_dtype, labels_dtype, gen, pad_id=-(2**31), ignore_index=2**31 - 1,
                             position_start=1)


@pytest.mark.parametrize("flat", [False, True], ids=["padded", "flat"])
def test_layout_many_segments(flat):
    """More segments than one layout step (1024 items by default), many rows, empty rows and bins."""
    rng = np.random.default_rng(5)
    num_segments = 5000
    lengths = rng.integers(1, 9, num_segments)
    # Bins of 0-6 segments (some empty), rows of 40 tokens; extra empty rows at the end.
    counts = rng.integers(0, 7, 2000)
    counts = counts[np.cumsum(counts) <= num_segments]
    counts = np.append(counts, num_segments - counts.sum())
    sums = np.add.reduceat(lengths, np.r_[0, np.cumsum(counts)[:-1]]) * (counts > 0)
    row_len = int(max(40, sums.max()))
    bin_offsets = np.r_[0, np.cumsum(counts)]
    segments = np.stack([np.arange(num_segments), np.zeros(num_segments, np.int64), lengths], axis=1)
    if flat:
        plan = Plan(lengths, segments, bin_offsets, 1, int(lengths.sum()) + 3, True)
    else:
        plan = Plan(lengths, segments, bin_offsets, len(counts) + 5, row_len, False)
    assert plan.num_cu > 4 * 1024
    check_layout(plan)
    with config("small"):
        check_layout(plan)
    gen = torch.Generator().manual_seed(5)
    check_pack_batch(plan, I64, I32, gen)


# --------------------------------------------------------------------------------------------------
# Hypothesis: random plans, every op
# --------------------------------------------------------------------------------------------------


@st.composite
def random_plans(draw):
    n = draw(st.integers(0, 10))  # was <= 8 sequences of <= 14 tokens (audit, issue 27)
    lengths = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    flat = draw(st.booleans())
    if draw(st.booleans()):
        capacity = draw(st.integers(1, 24))
        algorithm = draw(st.sampled_from(packkit.ALGORITHMS))
        return from_packkit(lengths, capacity, flat, extra_rows=draw(st.integers(0, 2)),
                            extra_flat=draw(st.integers(0, 4)), algorithm=algorithm)
    # By hand: sequences cut into random pieces (seg_start > 0), shuffled, packed next-fit, with empty
    # bins inserted anywhere.
    row_len = draw(st.integers(1, 20))
    segments = []
    for i, length in enumerate(lengths):
        start = 0
        while start < length:
            piece = draw(st.integers(1, min(length - start, row_len)))
            segments.append((i, start, piece))
            start += piece
    segments = draw(st.permutations(segments))
    counts, fill = [], row_len
    for _, _, piece in segments:
        if fill + piece > row_len:
            counts.append(0)
            fill = 0
        counts[-1] += 1
        fill += piece
    for _ in range(draw(st.integers(0, 3))):
        counts.insert(draw(st.integers(0, len(counts))), 0)
    bin_offsets = np.r_[0, np.cumsum(counts, dtype=np.int64)].tolist()
    if flat:
        total = sum(s[2] for s in segments)
        return Plan(lengths, segments, bin_offsets, 1, total + draw(st.integers(0, 4)), True)
    return Plan(lengths, segments, bin_offsets, len(counts) + draw(st.integers(0, 2)), row_len, False)


HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
# The random-plan property runs wider: 40 examples, not derandomized (a new draw each run; a failure is
# replayed from hypothesis' example database and printed as @reproduce_failure). The interpreter's cost grows
# fast with plan size: 80 examples of up to 12 x 40 tokens took 204 s on the 2-core machine.
WIDE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@WIDE
@given(plan=random_plans(), data=st.data())
def test_random_plans_match_reference(plan, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    feature = data.draw(st.sampled_from(FEATURES), label="feature")
    values = values_for(dtype)
    pad = data.draw(st.sampled_from(values), label="pad")
    first = data.draw(st.none() | st.sampled_from(values), label="first")
    max_len = data.draw(st.integers(0, 16), label="max_len")
    cfg = data.draw(st.sampled_from(sorted(CONFIGS)), label="config")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    with config(cfg):
        check_layout(plan)
        check_pack(plan, dtype, feature, pad, first, gen)
        check_unpack(plan, dtype, feature, pad, gen)
        check_unpack_padded(plan, dtype, feature, max_len, pad, gen)
        check_pack_batch(plan, data.draw(st.sampled_from([I64, I32]), label="ids"),
                         data.draw(st.sampled_from([None, I64, I32]), label="labels"), gen,
                         pad_id=data.draw(st.integers(-5, 5), label="pad_id"),
                         ignore_index=data.draw(st.sampled_from([-100, -1, 0]), label="ignore"),
                         mask_first_label=data.draw(st.booleans(), label="mask_first"),
                         position_start=data.draw(st.integers(0, 3), label="position_start"))


# --------------------------------------------------------------------------------------------------
# Inconsistent inputs: wrong values, never an out-of-bounds access (conftest's checker), no crash
# --------------------------------------------------------------------------------------------------


@HYP
@given(data=st.data())
def test_garbage_inputs_stay_in_bounds(data):
    big = st.integers(-(2**40), 2**40)
    small = st.integers(-3, 12)
    ints = lambda n, s=small: data.draw(st.lists(s | big, min_size=n, max_size=n))  # noqa: E731
    i32 = st.integers(-(2**31), 2**31 - 1)
    n_seq, n_seg, n_out = (data.draw(st.integers(0, 4)) for _ in range(3))
    src_offsets = torch.tensor(ints(n_seq + 1), dtype=I64)
    seg_seq, seg_start = torch.tensor(ints(n_seg), dtype=I64), torch.tensor(ints(n_seg), dtype=I64)
    seg_length = torch.tensor(ints(n_seg), dtype=I64)
    cu = torch.tensor(data.draw(st.lists(small | i32, min_size=n_out + 1, max_size=n_out + 1)), dtype=I32)
    cu_seg = torch.tensor(data.draw(st.lists(small | i32, min_size=n_out, max_size=n_out)), dtype=I32)
    flat = data.draw(st.booleans())
    num_rows = 1 if flat else data.draw(st.integers(0, 4))
    row_len = data.draw(st.integers(0, 9))
    n_bins = data.draw(st.integers(0, 1 if flat else num_rows))
    bin_offsets = torch.tensor(ints(n_bins + 1), dtype=I64)
    num_cu = data.draw(st.integers(1, n_seg + (1 if flat else num_rows) + 1))
    src = torch.randn(data.draw(st.integers(0, 6)), 2)
    feature = (2,)
    tokens = row_len * num_rows
    with config(data.draw(st.sampled_from(sorted(CONFIGS)))):
        cu_out, cu_seg_out = tk.layout(seg_length, bin_offsets, num_rows, row_len, flat, num_cu)
        assert cu_out.shape == (num_cu,) and cu_seg_out.shape == (num_cu - 1,)
        assert int(cu_out[-1]) == tokens
        tk.pack(src, src_offsets, seg_seq, seg_start, cu, cu_seg, num_rows, row_len, flat, 0.0, 1.0)
        ids = torch.arange(src.shape[0])
        tk.pack_batch(ids, None, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, num_rows, row_len, flat,
                      num_cu)
        packed = torch.randn(((row_len,) if flat else (num_rows, row_len)) + feature)
        tk.unpack(packed, src_offsets, seg_seq, seg_start, cu, cu_seg, flat, data.draw(st.integers(0, 6)))
        tk.unpack_padded(packed, seg_seq, seg_start, cu, cu_seg, flat, data.draw(st.integers(0, 3)),
                         data.draw(st.integers(0, 5)))


def test_memory_checker_catches_out_of_bounds():
    """The conftest checker is live: a deliberately broken launch trips it."""
    from conftest import MemoryViolation

    out = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(Exception, match="out-of-bounds store") as info:
        unpack._fill_kernel[(1,)](out, 8, 1, 0, WORDS=1, BLOCK=8)
    assert isinstance(info.value, MemoryViolation) or isinstance(info.value.__cause__, MemoryViolation)


def test_guards_catch_out_of_bounds(guarded_outputs):
    buf = guarded_outputs.empty((4,), dtype=torch.int32)
    buf.fill_(0)
    guarded_outputs.check_guards()
    buf = guarded_outputs.empty((4,), dtype=torch.int32)
    torch.as_strided(buf, (5,), (1,)).fill_(0)  # one element past the end
    with pytest.raises(AssertionError, match="guard"):
        guarded_outputs.check_guards()
    guarded_outputs.allocations.clear()


# --------------------------------------------------------------------------------------------------
# Argument checks (metadata only, before any launch)
# --------------------------------------------------------------------------------------------------


def _valid():
    p = HAND["padded_empty_bins"]
    src = torch.randn(p.num_src_tokens, 3)
    packed = torch.randn(p.num_rows, p.row_len, 3)
    ids = torch.arange(p.num_src_tokens)
    return p, src, packed, ids


def _bad_calls():
    p, src, packed, ids = _valid()
    lay = dict(seg_length=p.seg_length, bin_offsets=p.bin_offsets, num_rows=p.num_rows, row_len=p.row_len,
               flat=False, num_cu_seqlens=p.num_cu)
    pk = dict(src=src, src_offsets=p.src_offsets, seg_seq=p.seg_seq, seg_start=p.seg_start, cu_seqlens=p.cu,
              cu_seg=p.cu_seg, num_rows=p.num_rows, row_len=p.row_len, flat=False)
    pb = dict(input_ids=ids, labels=None, src_offsets=p.src_offsets, seg_seq=p.seg_seq, seg_start=p.seg_start,
              seg_length=p.seg_length, bin_offsets=p.bin_offsets, num_rows=p.num_rows, row_len=p.row_len,
              flat=False, num_cu_seqlens=p.num_cu)
    up = dict(packed=packed, src_offsets=p.src_offsets, seg_seq=p.seg_seq, seg_start=p.seg_start, cu_seqlens=p.cu,
              cu_seg=p.cu_seg, flat=False, num_src_tokens=p.num_src_tokens)
    upp = dict(packed=packed, seg_seq=p.seg_seq, seg_start=p.seg_start, cu_seqlens=p.cu, cu_seg=p.cu_seg, flat=False,
               num_sequences=len(p.lengths), max_len=4)
    meta = torch.empty(0, dtype=I64, device="meta")
    yield "layout_int32", tk.layout, dict(lay, seg_length=p.seg_length.int()), TypeError, "seg_length must be int64"
    yield "layout_2d", tk.layout, dict(lay, bin_offsets=p.bin_offsets[None]), ValueError, "must be 1-D"
    yield "layout_no_bins", tk.layout, dict(lay, bin_offsets=p.bin_offsets[:0]), ValueError, "num_bins \\+ 1"
    yield "layout_rows", tk.layout, dict(lay, num_rows=2), ValueError, "bins but num_rows"
    yield "layout_flat_rows", tk.layout, dict(lay, flat=True, num_rows=2), ValueError, "num_rows must be 1"
    yield "layout_neg", tk.layout, dict(lay, row_len=-1), ValueError, ">= 0"
    yield "layout_2_31", tk.layout, dict(lay, num_rows=2**16, row_len=2**15), ValueError, "2\\^31"
    yield "layout_num_cu_0", tk.layout, dict(lay, num_cu_seqlens=0), ValueError, "num_cu_seqlens"
    yield "layout_num_cu_big", tk.layout, dict(lay, num_cu_seqlens=100), ValueError, "num_cu_seqlens"
    yield "layout_device", tk.layout, dict(lay, bin_offsets=meta), ValueError, "same device"
    yield "pack_0d", tk.pack, dict(pk, src=torch.tensor(1.0)), ValueError, "0-d"
    yield "pack_cu_int64", tk.pack, dict(pk, cu_seqlens=p.cu.long()), TypeError, "cu_seqlens must be int32"
    yield "pack_cu_len", tk.pack, dict(pk, cu_seqlens=p.cu[:-1]), ValueError, "one more entry"
    yield "pack_seg_len", tk.pack, dict(pk, seg_start=p.seg_start[:-1]), ValueError, "same length"
    yield "pack_offsets", tk.pack, dict(pk, src_offsets=p.src_offsets[:0]), ValueError, "num_sequences \\+ 1"
    yield "pack_pad", tk.pack, dict(pk, src=src.to(torch.uint8), pad_value=300.0), ValueError, "pad_value"
    yield "pack_first", tk.pack, dict(pk, src=src.int(), first_value=NAN), ValueError, "first_value"
    yield "pack_device", tk.pack, dict(pk, seg_seq=p.seg_seq.to("meta")), ValueError, "same device"
    yield "batch_float", tk.pack_batch, dict(pb, input_ids=ids.float()), TypeError, "int64 or int32"
    yield "batch_2d", tk.pack_batch, dict(pb, input_ids=ids[None]), ValueError, "1-D"
    yield "batch_labels", tk.pack_batch, dict(pb, labels=ids[:-1]), ValueError, "as long as input_ids"
    yield "batch_labels_dtype", tk.pack_batch, dict(pb, labels=ids.short()), TypeError, "int64 or int32"
    yield "batch_pad", tk.pack_batch, dict(pb, input_ids=ids.int(), pad_id=2**40), ValueError, "pad_id"
    yield "batch_rows", tk.pack_batch, dict(pb, num_rows=1), ValueError, "bins but num_rows"
    yield "unpack_dims", tk.unpack, dict(up, packed=packed[0, :, 0]), ValueError, "at least 2 dims"
    yield "unpack_tokens", tk.unpack, dict(up, num_src_tokens=-1), ValueError, "num_src_tokens"
    yield "unpack_offsets", tk.unpack, dict(up, src_offsets=p.src_offsets.int()), TypeError, "src_offsets must be"
    yield "unpack_padded_len", tk.unpack_padded, dict(upp, max_len=-1), ValueError, ">= 0"
    yield "unpack_padded_cu", tk.unpack_padded, dict(upp, cu_seg=p.cu_seg[:, None]), ValueError, "1-D"


BAD = {name: rest for name, *rest in _bad_calls()}


@pytest.mark.parametrize("name", BAD)
def test_bad_arguments(name):
    fn, kwargs, exc, match = BAD[name]
    with pytest.raises(exc, match=match):
        fn(**kwargs)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    p, src, _, _ = _valid()
    monkeypatch.setattr(common, "_interpreting", lambda: False)
    with pytest.raises(ValueError, match="CPU tensor"):
        tk.layout(p.seg_length, p.bin_offsets, p.num_rows, p.row_len, False, p.num_cu)


def test_registered_ops_and_schemas():
    """torch.ops.packkit.triton_* exist with the C++ schemas' argument names, order and defaults."""
    for name in ("layout", "pack", "pack_batch", "unpack", "unpack_padded", "layout_out", "pack_out",
                 "pack_batch_out", "unpack_out", "unpack_padded_out"):
        triton_schema = getattr(torch.ops.packkit, f"triton_{name}").default._schema
        cpp_schema = getattr(torch.ops.packkit, name).default._schema
        assert [a.name for a in triton_schema.arguments] == [a.name for a in cpp_schema.arguments], name
        assert [a.is_out or (a.alias_info is not None and a.alias_info.is_write) for a in triton_schema.arguments] == \
            [a.is_out or (a.alias_info is not None and a.alias_info.is_write) for a in cpp_schema.arguments], name
        assert [a.default_value for a in triton_schema.arguments] == [a.default_value for a in
                                                                       cpp_schema.arguments], name
        assert len(triton_schema.returns) == len(cpp_schema.returns), name
    p = HAND["padded_all_full"]
    cu, cu_seg = torch.ops.packkit.triton_layout(p.seg_length, p.bin_offsets, p.num_rows, p.row_len, False, p.num_cu)
    assert_bits_equal(cu, p.cu)


# --------------------------------------------------------------------------------------------------
# Out-variants (triton_*_out): the same kernels into caller-owned, poisoned and guarded outputs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("name", HAND)
def test_out_variants_match_reference(name, cfg, guarded_outputs):
    plan, gen = HAND[name], torch.Generator().manual_seed(9)
    empty = guarded_outputs.empty  # poisoned, with guard bytes checked after the test
    with config(cfg):
        cu, cu_seg = empty(plan.num_cu, dtype=I32), empty(plan.num_cu - 1, dtype=I32)
        assert tk.layout_out(plan.seg_length, plan.bin_offsets, plan.num_rows, plan.row_len, plan.flat, cu,
                             cu_seg) is None
        assert_bits_equal(cu, plan.cu, "layout_out cu")
        assert_bits_equal(cu_seg, plan.cu_seg, "layout_out cu_seg")
        for dtype, feature in ((torch.float32, ()), (torch.bfloat16, (3,)), (torch.complex64, (2, 2)),
                               (torch.bool, ())):
            src = random_bits((plan.num_src_tokens,) + feature, dtype, gen)
            out = empty(packed_shape(plan, feature), dtype=dtype)
            tk.pack_out(src, plan.src_offsets, plan.seg_seq, plan.seg_start, cu, cu_seg, plan.flat, out, 1.0, 1.0)
            assert_bits_equal(out, reference_pack(src, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.cu,
                                                  plan.cu_seg, plan.num_rows, plan.row_len, plan.flat, 1.0, 1.0),
                              f"pack_out {dtype} {feature}")
            back = empty((plan.num_src_tokens,) + feature, dtype=dtype)
            tk.unpack_out(out, plan.src_offsets, plan.seg_seq, plan.seg_start, cu, cu_seg, plan.flat, back, 1.0)
            assert_bits_equal(back, reference_unpack(out, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.cu,
                                                     plan.cu_seg, plan.flat, 1.0), f"unpack_out {dtype}")
            padded = empty((len(plan.lengths), 5) + feature, dtype=dtype)
            tk.unpack_padded_out(out, plan.seg_seq, plan.seg_start, cu, cu_seg, plan.flat, padded, 1.0)
            assert_bits_equal(padded, reference_unpack_padded(out, plan.seg_seq, plan.seg_start, plan.cu, plan.cu_seg,
                                                              plan.flat, len(plan.lengths), 5, 1.0),
                              f"unpack_padded_out {dtype}")
        for ids_dtype, labels_dtype in ((I64, None), (I32, I64)):
            ids = torch.randint(-2**31, 2**31 - 1, (plan.num_src_tokens,), generator=gen).to(ids_dtype)
            labels = None if labels_dtype is None else torch.randint(0, 50000, (plan.num_src_tokens,),
                                                                     generator=gen).to(labels_dtype)
            shape = packed_shape(plan, ())
            outs = (empty(shape, dtype=ids_dtype), empty(shape, dtype=labels_dtype or ids_dtype),
                    empty(shape, dtype=I64), empty(shape, dtype=I32), empty(plan.num_cu, dtype=I32),
                    empty(plan.num_cu - 1, dtype=I32))
            tk.pack_batch_out(ids, labels, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.seg_length,
                              plan.bin_offsets, plan.flat, *outs, 3, -1, True, 2)
            want = reference_pack_batch(ids, labels, plan.src_offsets, plan.seg_seq, plan.seg_start, plan.seg_length,
                                        plan.bin_offsets, plan.num_rows, plan.row_len, plan.flat, 3, -1, True, 2)
            for what, g, w in zip(("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens"), outs, want):
                assert_bits_equal(g, w, f"pack_batch_out {what} {ids_dtype} {labels_dtype}")
            assert_bits_equal(outs[5], plan.cu_seg, "pack_batch_out cu_seg")


def _bad_out_calls():
    p, src, packed, ids = _valid()
    shape = (p.num_rows, p.row_len)
    pk = dict(src=src, src_offsets=p.src_offsets, seg_seq=p.seg_seq, seg_start=p.seg_start, cu_seqlens=p.cu,
              cu_seg=p.cu_seg, flat=False, out=torch.empty(shape + (3,)))
    yield "pack_out_shape", tk.pack_out, dict(pk, out=torch.empty(shape + (4,))), ValueError, "out must have shape"
    yield "pack_out_dims", tk.pack_out, dict(pk, out=torch.empty(shape)), ValueError, "out must have 3 dims"
    yield "pack_out_dtype", tk.pack_out, dict(pk, out=torch.empty(shape + (3,), dtype=torch.float64)), TypeError, \
        "out has dtype torch.float64"
    yield "pack_out_contig", tk.pack_out, dict(pk, out=torch.empty((p.num_rows, 3, p.row_len)).transpose(1, 2)), \
        ValueError, "contiguous"
    yield "pack_out_overlap", tk.pack_out, dict(pk, src=pk["out"].view(-1, 3)[:src.shape[0]]), ValueError, \
        "out overlaps src"
    outs = dict(out_input_ids=torch.empty(shape, dtype=I64), out_labels=torch.empty(shape, dtype=I64),
                out_position_ids=torch.empty(shape, dtype=I64), out_seq_idx=torch.empty(shape, dtype=I32),
                out_cu_seqlens=torch.empty(p.num_cu, dtype=I32), out_cu_seg=torch.empty(p.num_cu - 1, dtype=I32))
    pb = dict(input_ids=ids, labels=None, src_offsets=p.src_offsets, seg_seq=p.seg_seq, seg_start=p.seg_start,
              seg_length=p.seg_length, bin_offsets=p.bin_offsets, flat=False, **outs)
    yield "pack_batch_out_dtype", tk.pack_batch_out, dict(pb, out_seq_idx=torch.empty(shape, dtype=I64)), TypeError, \
        "out_seq_idx has dtype"
    yield "pack_batch_out_same", tk.pack_batch_out, dict(pb, out_labels=outs["out_input_ids"]), ValueError, \
        "out_input_ids overlaps out_labels"
    yield "pack_batch_out_cu", tk.pack_batch_out, dict(pb, out_cu_seg=outs["out_cu_seg"][:-1]), ValueError, \
        "out_cu_seg must have shape"
    yield "unpack_out_shape", tk.unpack_out, dict(packed=packed, src_offsets=p.src_offsets, seg_seq=p.seg_seq,
                                                  seg_start=p.seg_start, cu_seqlens=p.cu, cu_seg=p.cu_seg, flat=False,
                                                  out=torch.empty(p.num_src_tokens, 2)), ValueError, "out must have shape"
    yield "unpack_padded_out_dims", tk.unpack_padded_out, dict(packed=packed, seg_seq=p.seg_seq, seg_start=p.seg_start,
                                                               cu_seqlens=p.cu, cu_seg=p.cu_seg, flat=False,
                                                               out=torch.empty(len(p.lengths), 3)), ValueError, \
        "out must have 3 dims"
    yield "layout_out_empty", tk.layout_out, dict(seg_length=p.seg_length, bin_offsets=p.bin_offsets,
                                                  num_rows=p.num_rows, row_len=p.row_len, flat=False,
                                                  cu_seqlens=torch.empty(0, dtype=I32),
                                                  cu_seg=torch.empty(0, dtype=I32)), ValueError, "1-D int32"


BAD_OUT = {name: rest for name, *rest in _bad_out_calls()}


@pytest.mark.parametrize("name", BAD_OUT)
def test_bad_out_arguments(name):
    fn, kwargs, exc, match = BAD_OUT[name]
    with pytest.raises(exc, match=match):
        fn(**kwargs)
