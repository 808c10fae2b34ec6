"""torch.ops.packkit pack family vs the plain-PyTorch reference, bit for bit; opcheck; torch.compile.

CUDA variants of the same checks run when a GPU is present (skipped otherwise).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packkit  # noqa: F401  (registers the ops)
from pack_reference import (reference_layout, reference_pack, reference_pack_batch, reference_unpack,
                            reference_unpack_padded)
import gpu_gate
from gpu_gate import on, ops_for
from pack_samples import DTYPES, FEATURES, make_case, random_source, sample_cases

pytestmark = pytest.mark.core

OPS = torch.ops.packkit
DEVICES = ["cpu"] + (["cuda"] if gpu_gate.CUDA_KERNELS else [])
# Every backend, always listed: on a machine without a GPU the device ones skip with a reason that
# tests/gpu/run.sh turns into a failure on a GPU machine (a skip there means a path went untested).
BACKENDS = ["cpu", pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]
POISON = 0x5A


def poison_allocator(device, nbytes=1 << 20):
    """Leave freed memory full of a poison byte so unwritten outputs cannot look right by chance."""
    buf = torch.full((nbytes,), POISON, dtype=torch.uint8, device=device)
    del buf


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (NaN patterns and -0.0 included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.cpu().contiguous(), b.cpu().contiguous()
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def run_layout(case, backend):
    c = case.to(on(backend))
    poison_allocator(on(backend))
    return ops_for(backend).layout(c.seg_length, c.bin_offsets, c.num_rows, c.row_len, c.flat, c.layout.num_cu_seqlens)


case_params = dict(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(DTYPES), feature=st.sampled_from(FEATURES),
                   flat=st.booleans())


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**case_params, first=st.sampled_from([None, -100.0, 7.0]), pad=st.sampled_from([0.0, -1.0, 3.0]))
def test_layout_and_pack_match_reference(backend, seed, dtype, feature, flat, first, pad):
    device, ops = on(backend), ops_for(backend)
    case = make_case(seed, dtype=dtype, feature=feature, flat=flat)
    cu, cu_seg = run_layout(case, backend)
    ref_cu, ref_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat)
    assert same_bits(cu, ref_cu) and same_bits(cu_seg, ref_seg)
    if dtype == torch.bool and first is not None:
        first = 1.0
    c = case.to(device)
    if dtype in (torch.uint8, torch.bool) and (pad < 0 or pad > 1 and dtype == torch.bool or (first or 0) < 0):
        with pytest.raises((RuntimeError, ValueError), match="cannot be represented|cannot be converted"):
            ops.pack(c.src, c.src_offsets, c.seg_seq, c.seg_start, cu, cu_seg, c.num_rows, c.row_len, c.flat, pad,
                     first)
        return
    poison_allocator(device)
    out = ops.pack(c.src, c.src_offsets, c.seg_seq, c.seg_start, cu, cu_seg, c.num_rows, c.row_len, c.flat, pad, first)
    ref = reference_pack(case.src, case.src_offsets, case.seg_seq, case.seg_start, ref_cu, ref_seg, case.num_rows,
                         case.row_len, case.flat, pad, first)
    assert same_bits(out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), flat=st.booleans(), id_dtype=st.sampled_from([torch.int64, torch.int32]),
       with_labels=st.booleans(), mask_first=st.booleans(), position_start=st.sampled_from([0, 2]))
def test_pack_batch_matches_reference(backend, seed, flat, id_dtype, with_labels, mask_first, position_start):
    device, ops = on(backend), ops_for(backend)
    case = make_case(seed, dtype=id_dtype, flat=flat)
    labels = random_source(np.random.default_rng(seed + 1), case.src.shape[0], torch.int64) if with_labels else None
    c = case.to(device)
    poison_allocator(device)
    got = ops.pack_batch(c.src, None if labels is None else labels.to(device), c.src_offsets, *c.plan_tensors,
                         c.num_rows, c.row_len, c.flat, c.layout.num_cu_seqlens, 5, -100, mask_first, position_start)
    ref = reference_pack_batch(case.src, labels, case.src_offsets, *case.plan_tensors, case.num_rows, case.row_len,
                               case.flat, 5, -100, mask_first, position_start)
    for name, g, r in zip(("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens"), got, ref):
        assert same_bits(g, r), name


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**case_params, max_len=st.integers(0, 45))
def test_unpack_matches_reference_and_inverts_pack(backend, seed, dtype, feature, flat, max_len):
    device, ops = on(backend), ops_for(backend)
    case = make_case(seed, dtype=dtype, feature=feature, flat=flat)
    cu, cu_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat)
    packed = reference_pack(case.src, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.num_rows,
                            case.row_len, case.flat, 0.0)
    c, dev = case.to(device), lambda t: t.to(device)
    poison_allocator(device)
    out = ops.unpack(dev(packed), c.src_offsets, c.seg_seq, c.seg_start, dev(cu), dev(cu_seg), c.flat,
                     case.src.shape[0], 0.0)
    ref = reference_unpack(packed, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.flat, 0.0)
    assert same_bits(out, ref)
    # Round trip: every token the plan kept comes back in place.
    kept = torch.zeros(case.src.shape[0], dtype=torch.bool)
    for j in range(len(case.seg_seq)):
        s = int(case.src_offsets[int(case.seg_seq[j])] + case.seg_start[j])
        kept[s:s + int(case.seg_length[j])] = True
    assert same_bits(out.cpu()[kept], case.src[kept])
    poison_allocator(device)
    out_p = ops.unpack_padded(dev(packed), c.seg_seq, c.seg_start, dev(cu), dev(cu_seg), c.flat, len(case.lengths),
                              max_len, 0.0)
    ref_p = reference_unpack_padded(packed, case.seg_seq, case.seg_start, cu, cu_seg, case.flat, len(case.lengths),
                                    max_len, 0.0)
    assert same_bits(out_p, ref_p)


def test_hand_made_case_by_value():
    """A case small enough to check by eye: two rows of 6, one split sequence, one padding row."""
    src = torch.arange(100, 111)  # sequences: [100..103], [104..110] (7 tokens, split 6 + 1)
    offs = torch.tensor([0, 4, 11])
    seg_seq, seg_start, seg_len = torch.tensor([1, 0, 1]), torch.tensor([0, 0, 6]), torch.tensor([6, 4, 1])
    bins = torch.tensor([0, 1, 3])
    ids, lab, pos, doc, cu = OPS.pack_batch(src, None, offs, seg_seq, seg_start, seg_len, bins, 3, 6, False, 6)
    assert ids.tolist() == [[104, 105, 106, 107, 108, 109], [100, 101, 102, 103, 110, 0], [0] * 6]
    assert lab.tolist() == [[-100, 105, 106, 107, 108, 109], [-100, 101, 102, 103, -100, -100], [-100] * 6]
    assert pos.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 0], [0, 1, 2, 3, 4, 5]]
    assert doc.tolist() == [[0] * 6, [1, 1, 1, 1, 2, 3], [4] * 6]
    assert cu.tolist() == [0, 6, 10, 11, 12, 18]


def test_non_contiguous_source_is_handled():
    case = make_case(3, dtype=torch.float32, feature=(3,), flat=False)
    cu, cu_seg = run_layout(case, "cpu")
    wide = torch.zeros(case.src.shape[0], 6)
    wide[:, ::2] = case.src
    strided = wide[:, ::2]
    assert not strided.is_contiguous()
    got = OPS.pack(strided, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.num_rows, case.row_len,
                   False, 0.0, None)
    assert same_bits(got, OPS.pack(case.src, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg,
                                   case.num_rows, case.row_len, False, 0.0, None))


def test_many_segments_layout():
    lengths = np.random.default_rng(0).integers(1, 9, 20_000)
    plan = packkit.plan(lengths, 64)
    layout = packkit.pack_layout(plan.segments, flat=False, row_len=64, num_rows=plan.num_bins + 3)
    sl, bo = torch.from_numpy(plan.segments.length.copy()), torch.from_numpy(plan.segments.bin_offsets.copy())
    cu, cu_seg = OPS.layout(sl, bo, layout.num_rows, 64, False, layout.num_cu_seqlens)
    ref_cu, ref_seg = reference_layout(sl, bo, layout.num_rows, 64, False)
    assert torch.equal(cu, ref_cu) and torch.equal(cu_seg, ref_seg)


# --- opcheck and torch.compile over every op --------------------------------------------------------
def op_calls(case, ops=OPS):
    """(op, args) for every pack-family op on one case."""
    cu, cu_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat)
    packed = reference_pack(case.src, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.num_rows,
                            case.row_len, case.flat, 0.0)
    ids = case.src if case.src.dtype in (torch.int64, torch.int32) and case.src.dim() == 1 else \
        torch.arange(case.src.shape[0], dtype=torch.int64)
    n = len(case.lengths)
    return [
        (ops.layout, (case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat,
                      case.layout.num_cu_seqlens)),
        (ops.pack, (case.src, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.num_rows,
                    case.row_len, case.flat, 1.0, -100.0 if case.src.dtype != torch.bool else 1.0)),
        (ops.pack_batch, (ids, None, case.src_offsets, *case.plan_tensors, case.num_rows, case.row_len, case.flat,
                          case.layout.num_cu_seqlens, 0, -100, True, 0)),
        (ops.unpack, (packed, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.flat,
                      case.src.shape[0], 0.0)),
        (ops.unpack_padded, (packed, case.seg_seq, case.seg_start, cu, cu_seg, case.flat, n, 9, 0.0)),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_index", range(6))
def test_opcheck(backend, case_index):
    device, ops = on(backend), ops_for(backend)
    case = sample_cases()[case_index].to(device)
    for op, args in op_calls(case, ops):
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flat", [True, False])
def test_compile_fullgraph_dynamic_no_recompile(backend, flat):
    device, ops = on(backend), ops_for(backend)
    from torch._dynamo.testing import CompileCounter

    def step(ids, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, num_rows, row_len, num_cu):
        out = ops.pack_batch(ids, None, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, num_rows, row_len,
                             flat, num_cu)
        cu, cu_seg = ops.layout(seg_length, bin_offsets, num_rows, row_len, flat, num_cu)
        back = ops.unpack(out[0] * 2, src_offsets, seg_seq, seg_start, cu, cu_seg, flat, ids.shape[0], 0.0)
        return out, back

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    for i, n in enumerate((5, 9, 14, 20, 33)):
        rng = np.random.default_rng(i)
        lengths = rng.integers(1, 30, n)
        plan = packkit.plan(lengths, 32)
        layout = packkit.pack_layout(plan.segments, flat=flat, row_len=None if flat else 32,
                                     num_rows=None if flat else plan.num_bins + 2)
        ids = torch.from_numpy(rng.integers(0, 1000, int(lengths.sum()))).to(device)
        offs = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))).to(device)
        segs = [torch.from_numpy(a.copy()).to(device) for a in plan.segments]
        got, back = compiled(ids, offs, *segs, layout.num_rows, layout.row_len, layout.num_cu_seqlens)
        ref = reference_pack_batch(ids.cpu(), None, offs.cpu(), *[s.cpu() for s in segs], layout.num_rows,
                                   layout.row_len, flat, 0, -100, True, 0)
        assert all(same_bits(g, r) for g, r in zip(got, ref))
        assert torch.equal(back.cpu(), ids.cpu() * 2)
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames for 5 batch sizes"


# --- bad input: clear errors, never a crash ---------------------------------------------------------
def _good():
    case = make_case(11, flat=False, extra_rows=1, overlong="split", max_seqs=8)
    while case.seg_seq.numel() < 2:
        case = make_case(int(case.lengths.sum()) + 12, flat=False, extra_rows=1, max_seqs=8)
    cu, cu_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat)
    return case, cu, cu_seg


def test_bad_layout_inputs():
    case, _, _ = _good()
    n_cu = case.layout.num_cu_seqlens
    sl, bo = case.seg_length, case.bin_offsets
    with pytest.raises(RuntimeError, match="num_cu_seqlens must be"):
        OPS.layout(sl, bo, case.num_rows, case.row_len, False, n_cu + 1)
    with pytest.raises(RuntimeError, match="does not fit"):
        OPS.layout(sl, bo, case.num_rows, 1, False, n_cu)
    with pytest.raises(RuntimeError, match="bins but num_rows"):
        OPS.layout(sl, bo, 0, case.row_len, False, n_cu)
    with pytest.raises(RuntimeError, match="int64"):
        OPS.layout(sl.int(), bo, case.num_rows, case.row_len, False, n_cu)
    with pytest.raises(RuntimeError, match="num_rows must be 1"):
        OPS.layout(sl, bo, 2, case.row_len, True, n_cu)
    with pytest.raises(RuntimeError, match="2\\^31"):
        OPS.layout(sl, bo, 2**20, 2**20, False, n_cu)
    bad = bo.clone()
    bad[-1] += 1
    with pytest.raises(RuntimeError, match="bin_offsets"):
        OPS.layout(sl, bad, case.num_rows, case.row_len, False, n_cu)
    zero = sl.clone()
    zero[0] = 0
    with pytest.raises(RuntimeError, match="lengths must be >= 1"):
        OPS.layout(zero, bo, case.num_rows, case.row_len, False, n_cu)


def test_bad_pack_inputs():
    case, cu, cu_seg = _good()
    args = [case.src, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.num_rows, case.row_len, False,
            0.0, None]

    def call(**changes):
        a = list(args)
        names = ["src", "src_offsets", "seg_seq", "seg_start", "cu", "cu_seg"]
        for k, v in changes.items():
            a[names.index(k)] = v
        return OPS.pack(*a)

    offs = case.src_offsets.clone()
    offs[1] = int(offs[2]) + 1
    with pytest.raises(RuntimeError, match="non-decreasing"):
        call(src_offsets=offs)
    with pytest.raises(RuntimeError, match="exceeds the source"):
        call(src_offsets=case.src_offsets + 1)
    with pytest.raises(RuntimeError, match="names sequence"):
        call(seg_seq=case.seg_seq + 100)
    start = case.seg_start.clone()
    start[0] += 50
    with pytest.raises(RuntimeError, match="starts at token 50 with 20 tokens"):
        call(seg_start=start)
    with pytest.raises(RuntimeError, match="int32"):
        call(cu=cu.long())
    with pytest.raises(RuntimeError, match="one more entry"):
        call(cu=cu[:-1])
    with pytest.raises(RuntimeError, match="end at the packed token count"):
        OPS.pack(*args[:7], case.row_len + 1, *args[8:])
    with pytest.raises(RuntimeError, match="0-d"):
        call(src=torch.tensor(3))


@gpu_gate.needs_cuda_kernels
def test_mismatched_devices():
    case, cu, cu_seg = _good()
    with pytest.raises(RuntimeError, match="same device"):
        OPS.pack(case.src.cuda(), case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.num_rows,
                 case.row_len, False, 0.0, None)


def test_bad_pack_batch_and_unpack_inputs():
    case, cu, cu_seg = _good()
    n_cu = case.layout.num_cu_seqlens
    with pytest.raises(RuntimeError, match="int64 or int32"):
        OPS.pack_batch(case.src.float(), None, case.src_offsets, *case.plan_tensors, case.num_rows, case.row_len,
                       False, n_cu)
    with pytest.raises(RuntimeError, match="as long as input_ids"):
        OPS.pack_batch(case.src, case.src[:-1], case.src_offsets, *case.plan_tensors, case.num_rows, case.row_len,
                       False, n_cu)
    packed = torch.zeros(case.num_rows, case.row_len)
    with pytest.raises(RuntimeError, match="end at the packed token count"):
        OPS.unpack(packed[:, :-1], case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, False,
                   case.src.shape[0], 0.0)
    with pytest.raises(RuntimeError, match="at least 2 dims"):
        OPS.unpack(packed.flatten(), case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, False,
                   case.src.shape[0], 0.0)
    with pytest.raises(RuntimeError, match="num_sequences is"):
        OPS.unpack_padded(packed, case.seg_seq, case.seg_start, cu, cu_seg, False, 0, 4, 0.0)


# --- GPU only: CUDA-graph capture and torch.compile(mode="reduce-overhead") -------------------------
DEVICE_BACKENDS = [pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
                   pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_cuda_graph_capture_and_replay(backend):
    OPS = ops_for(backend)
    case = make_case(21, dtype=torch.int64, flat=False, extra_rows=2, max_seqs=10).to("cuda")
    args = (case.src, None, case.src_offsets, *case.plan_tensors, case.num_rows, case.row_len, False,
            case.layout.num_cu_seqlens)
    OPS.pack_batch(*args)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # raises if anything synchronises or allocates from the host
        out = OPS.pack_batch(*args)
    case.src.add_(1)  # new data in the same buffers, replayed without re-planning
    graph.replay()
    torch.cuda.synchronize()
    ref = reference_pack_batch(case.src.cpu(), None, case.src_offsets.cpu(), *[t.cpu() for t in case.plan_tensors],
                               case.num_rows, case.row_len, False, 0, -100, True, 0)
    assert all(same_bits(g, r) for g, r in zip(out, ref))


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_compile_reduce_overhead_replays(backend):
    OPS = ops_for(backend)
    case = make_case(22, dtype=torch.int64, flat=False, extra_rows=1, max_seqs=10).to("cuda")

    def step(ids, offs, seg_seq, seg_start, seg_length, bin_offsets):
        return OPS.pack_batch(ids, None, offs, seg_seq, seg_start, seg_length, bin_offsets, case.num_rows,
                              case.row_len, False, case.layout.num_cu_seqlens)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(4):
        ids = case.src + i
        got = [t.clone() for t in compiled(ids, case.src_offsets, *case.plan_tensors)]
        ref = reference_pack_batch(ids.cpu(), None, case.src_offsets.cpu(), *[t.cpu() for t in case.plan_tensors],
                                   case.num_rows, case.row_len, False, 0, -100, True, 0)
        assert all(same_bits(g, r) for g, r in zip(got, ref))


@pytest.mark.parametrize("dtype,feature,zeros", [(torch.int32, (), 0), (torch.float32, (3,), 0),
                                                 (torch.int64, (), 40_000)])
def test_large_cpu_pack_source_order_matches_reference(dtype, feature, zeros):
    """Inputs of >= 1M elements take the CPU op's source-order path (segments copied in the order they lie
    in src, split over torch's threads); with many empty sequences (zeros) the plan-order fallback. Both
    must equal the reference bit for bit, padding rows and the masked first label included."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 1200, 2400).astype(np.int64)
    lengths = np.concatenate((lengths, np.zeros(zeros, np.int64)))
    rng.shuffle(lengths)
    plan = packkit.plan(lengths, 4096, algorithm="obfd", overlong="split")
    layout = packkit.pack_layout(plan.segments, flat=False, row_len=4096, num_rows=plan.num_bins + 2)
    src = random_source(rng, int(lengths.sum()), dtype, feature)
    assert src.numel() >= 1 << 20
    offsets = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))
    segs = [torch.from_numpy(np.array(a)) for a in plan.segments]
    cu, cu_seg = reference_layout(segs[2], segs[3], layout.num_rows, 4096, False)
    poison_allocator("cpu", 64 << 20)
    out = OPS.pack(src, offsets, segs[0], segs[1], cu, cu_seg, layout.num_rows, 4096, False, 3.0, -100.0)
    ref = reference_pack(src, offsets, segs[0], segs[1], cu, cu_seg, layout.num_rows, 4096, False, 3.0, -100.0)
    assert same_bits(out, ref)
    if dtype != torch.float32:
        got = OPS.pack_batch(src, None, offsets, *segs, layout.num_rows, 4096, False, layout.num_cu_seqlens, 5, -100,
                             True, 0)
        want = reference_pack_batch(src, None, offsets, *segs, layout.num_rows, 4096, False, 5, -100, True, 0)
        for name, g, r in zip(("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens"), got, want):
            assert same_bits(g, r), name
