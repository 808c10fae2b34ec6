"""Out-variants of the pack family (``packkit::*_out``): bit-exact vs the reference into poisoned buffers,
identical to the functional ops, opcheck, torch.compile, and clear errors for bad outputs.

CUDA variants of the same checks run when a GPU is present (skipped otherwise).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpu_gate
import packkit  # noqa: F401  (registers the ops)
from pack_reference import (reference_layout, reference_pack, reference_pack_batch, reference_unpack,
                            reference_unpack_padded)
from pack_samples import DTYPES, FEATURES, make_case, random_source, sample_cases

pytestmark = pytest.mark.core

OPS = torch.ops.packkit
DEVICES = ["cpu", pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels)]


def poisoned(shape, dtype, device, byte=0xA5):
    """An output buffer full of garbage: any element an op forgets to write cannot look right."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if out.numel():
        out.view(-1).view(torch.uint8).fill_(byte)
    return out


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte-exact equality (NaN payloads, -0.0 and bool bytes included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def token_shape(case):
    return (case.row_len,) if case.flat else (case.num_rows, case.row_len)


def pack_batch_outputs(case, ids_dtype, label_dtype, device, byte=0xA5):
    shape, n = token_shape(case), case.layout.num_cu_seqlens
    return [poisoned(shape, ids_dtype, device, byte), poisoned(shape, label_dtype, device, byte),
            poisoned(shape, torch.int64, device, byte), poisoned(shape, torch.int32, device, byte),
            poisoned((n,), torch.int32, device, byte), poisoned((n - 1,), torch.int32, device, byte)]


case_params = dict(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(DTYPES), feature=st.sampled_from(FEATURES),
                   flat=st.booleans())


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**case_params, byte=st.sampled_from([0x00, 0xA5, 0xFF]), max_len=st.integers(0, 45))
def test_out_variants_match_reference_into_poisoned_buffers(device, seed, dtype, feature, flat, byte, max_len):
    case = make_case(seed, dtype=dtype, feature=feature, flat=flat)
    c = case.to(device)
    n = case.layout.num_cu_seqlens
    ref_cu, ref_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat)
    cu, cu_seg = poisoned((n,), torch.int32, device, byte), poisoned((n - 1,), torch.int32, device, byte)
    assert OPS.layout_out(c.seg_length, c.bin_offsets, c.num_rows, c.row_len, c.flat, cu, cu_seg) is None
    assert same_bytes(cu, ref_cu) and same_bytes(cu_seg, ref_seg)

    first = (1.0 if dtype == torch.bool else 7.0) if seed % 2 else None
    packed = poisoned((*token_shape(case), *feature), dtype, device, byte)
    OPS.pack_out(c.src, c.src_offsets, c.seg_seq, c.seg_start, cu, cu_seg, c.flat, packed, 1.0, first)
    ref_packed = reference_pack(case.src, case.src_offsets, case.seg_seq, case.seg_start, ref_cu, ref_seg,
                                case.num_rows, case.row_len, case.flat, 1.0, first)
    assert same_bytes(packed, ref_packed)
    assert same_bytes(packed, OPS.pack(c.src, c.src_offsets, c.seg_seq, c.seg_start, cu, cu_seg, c.num_rows,
                                       c.row_len, c.flat, 1.0, first))

    out = poisoned((case.src.shape[0], *feature), dtype, device, byte)
    OPS.unpack_out(packed, c.src_offsets, c.seg_seq, c.seg_start, cu, cu_seg, c.flat, out, 0.0)
    assert same_bytes(out, reference_unpack(ref_packed, case.src_offsets, case.seg_seq, case.seg_start, ref_cu,
                                            ref_seg, case.flat, 0.0))
    out_p = poisoned((len(case.lengths), max_len, *feature), dtype, device, byte)
    OPS.unpack_padded_out(packed, c.seg_seq, c.seg_start, cu, cu_seg, c.flat, out_p, 0.0)
    assert same_bytes(out_p, reference_unpack_padded(ref_packed, case.seg_seq, case.seg_start, ref_cu, ref_seg,
                                                     case.flat, len(case.lengths), max_len, 0.0))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), flat=st.booleans(), id_dtype=st.sampled_from([torch.int64, torch.int32]),
       label_dtype=st.sampled_from([None, torch.int64, torch.int32]), mask_first=st.booleans(),
       position_start=st.sampled_from([0, 2]), byte=st.sampled_from([0x00, 0xA5, 0xFF]))
def test_pack_batch_out_matches_reference_and_functional(device, seed, flat, id_dtype, label_dtype, mask_first,
                                                         position_start, byte):
    case = make_case(seed, dtype=id_dtype, flat=flat)
    labels = None
    if label_dtype is not None:
        labels = random_source(np.random.default_rng(seed + 1), case.src.shape[0], label_dtype)
    c = case.to(device)
    dev_labels = None if labels is None else labels.to(device)
    outs = pack_batch_outputs(case, id_dtype, id_dtype if labels is None else label_dtype, device, byte)
    OPS.pack_batch_out(c.src, dev_labels, c.src_offsets, *c.plan_tensors, c.flat, *outs, 5, -100, mask_first,
                       position_start)
    ref = reference_pack_batch(case.src, labels, case.src_offsets, *case.plan_tensors, case.num_rows, case.row_len,
                               case.flat, 5, -100, mask_first, position_start)
    for name, g, r in zip(("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens"), outs, ref):
        assert same_bytes(g, r), name
    _, ref_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat)
    assert same_bytes(outs[5], ref_seg), "cu_seg"
    functional = OPS.pack_batch(c.src, dev_labels, c.src_offsets, *c.plan_tensors, c.num_rows, c.row_len, c.flat,
                                case.layout.num_cu_seqlens, 5, -100, mask_first, position_start)
    assert all(same_bytes(g, f) for g, f in zip(outs, functional))


@pytest.mark.parametrize("device", DEVICES)
def test_reused_storage_across_batches(device):
    """One poisoned storage per output, many batches of varying size packed into prefix views of it:
    every call overwrites all it returns, whatever the previous batch left there."""
    storage = [poisoned((4096,), dtype, device) for dtype in (torch.int64, torch.int64, torch.int64, torch.int32,
                                                              torch.int32, torch.int32)]
    for seed in range(12):
        rng = np.random.default_rng(seed)
        lengths = rng.integers(0, 40, int(rng.integers(1, 20)))
        plan = packkit.plan(lengths, 48, overlong="split")
        flat = bool(seed % 2)
        layout = packkit.pack_layout(plan.segments, flat=flat, row_len=None if flat else 48,
                                     num_rows=None if flat else plan.num_bins + seed % 3)
        shape = (layout.row_len,) if flat else (layout.num_rows, layout.row_len)
        numel, n = int(np.prod(shape)), layout.num_cu_seqlens
        outs = [s[:numel].view(shape) for s in storage[:4]] + [storage[4][:n], storage[5][:n - 1]]
        src = torch.from_numpy(rng.integers(0, 1000, int(lengths.sum())))
        offs = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))))
        segs = [torch.from_numpy(a.copy()) for a in plan.segments]
        dev = [t.to(device) for t in (src, offs, *segs)]
        OPS.pack_batch_out(dev[0], None, dev[1], *dev[2:], flat, *outs)
        ref = reference_pack_batch(src, None, offs, *segs, layout.num_rows, layout.row_len, flat, 0, -100, True, 0)
        assert all(same_bytes(g, r) for g, r in zip(outs, ref)), seed


def out_op_calls(case):
    """(op, args) for every out-variant on one case, outputs poisoned."""
    cu, cu_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat)
    packed = reference_pack(case.src, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.num_rows,
                            case.row_len, case.flat, 0.0)
    ids = case.src if case.src.dtype in (torch.int64, torch.int32) and case.src.dim() == 1 else \
        torch.arange(case.src.shape[0], dtype=torch.int64)
    feature, dtype, n = tuple(case.src.shape[1:]), case.src.dtype, case.layout.num_cu_seqlens
    return [
        (OPS.layout_out, (case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat,
                          poisoned((n,), torch.int32, "cpu"), poisoned((n - 1,), torch.int32, "cpu"))),
        (OPS.pack_out, (case.src, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.flat,
                        poisoned((*token_shape(case), *feature), dtype, "cpu"), 1.0,
                        -100.0 if dtype != torch.bool else 1.0)),
        (OPS.pack_batch_out, (ids, None, case.src_offsets, *case.plan_tensors, case.flat,
                              *pack_batch_outputs(case, ids.dtype, ids.dtype, "cpu"), 0, -100, True, 0)),
        (OPS.unpack_out, (packed, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, case.flat,
                          poisoned((case.src.shape[0], *feature), dtype, "cpu"), 0.0)),
        (OPS.unpack_padded_out, (packed, case.seg_seq, case.seg_start, cu, cu_seg, case.flat,
                                 poisoned((len(case.lengths), 9, *feature), dtype, "cpu"), 0.0)),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case_index", range(6))
def test_opcheck_out_variants(device, case_index):
    case = sample_cases()[case_index]
    for op, args in out_op_calls(case):
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_with_out_variant(device):
    """torch.compile keeps the mutation: the caller's buffers hold the batch after the compiled call."""
    torch._dynamo.reset()

    def step(ids, offs, seg_seq, seg_start, seg_length, bin_offsets, out_ids, out_labels, out_pos, out_doc, out_cu,
             out_seg):
        OPS.pack_batch_out(ids, None, offs, seg_seq, seg_start, seg_length, bin_offsets, False, out_ids, out_labels,
                           out_pos, out_doc, out_cu, out_seg)
        return out_ids.sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for seed in (31, 32, 33):
        case = make_case(seed, flat=False, extra_rows=1, max_seqs=10)
        c = case.to(device)
        outs = pack_batch_outputs(case, torch.int64, torch.int64, device)
        total = compiled(c.src, c.src_offsets, *c.plan_tensors, *outs)
        ref = reference_pack_batch(case.src, None, case.src_offsets, *case.plan_tensors, case.num_rows,
                                   case.row_len, False, 0, -100, True, 0)
        assert all(same_bytes(g, r) for g, r in zip(outs, ref))
        assert int(total) == int(ref[0].sum())


# --- bad outputs: clear errors before anything is written --------------------------------------------
def _case():
    return make_case(11, flat=False, extra_rows=1, overlong="split", max_seqs=8, dtype=torch.float32, feature=(3,))


def test_bad_pack_out_outputs():
    case = _case()
    cu, cu_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, False)
    args = (case.src, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, False)
    good_shape = (case.num_rows, case.row_len, 3)
    with pytest.raises(RuntimeError, match=r"out must have shape \[.*\], got"):
        OPS.pack_out(*args, torch.empty(case.num_rows, case.row_len, 4))
    with pytest.raises(RuntimeError, match="out must have 3 dims"):
        OPS.pack_out(*args, torch.empty(case.num_rows * case.row_len, 3))
    with pytest.raises(RuntimeError, match="out has dtype Double but must be Float"):
        OPS.pack_out(*args, torch.empty(good_shape, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="out must be contiguous"):
        OPS.pack_out(*args, torch.empty(case.num_rows, 3, case.row_len).transpose(1, 2))
    with pytest.raises(RuntimeError, match="end at the packed token count"):  # row_len taken from out
        OPS.pack_out(*args, torch.empty(case.num_rows, case.row_len + 1, 3))
    with pytest.raises(RuntimeError, match="out overlaps src"):
        big = torch.zeros(case.src.numel() + case.num_rows * case.row_len * 3)
        src = big[:case.src.numel()].view_as(case.src).copy_(case.src)
        OPS.pack_out(src, *args[1:], big[case.src.numel() // 2:][:case.num_rows * case.row_len * 3].view(good_shape))
    before = torch.full(good_shape, 7.0)
    with pytest.raises(RuntimeError, match="dtype"):
        OPS.pack_out(case.src.double(), *args[1:], before)
    assert torch.equal(before, torch.full(good_shape, 7.0)), "a rejected call must not write"


def test_bad_pack_batch_out_outputs():
    case = make_case(12, flat=False, extra_rows=1, max_seqs=8)
    outs = pack_batch_outputs(case, torch.int64, torch.int64, "cpu")
    call = lambda o: OPS.pack_batch_out(case.src, None, case.src_offsets, *case.plan_tensors, False, *o)  # noqa: E731
    call(outs)  # the good call works
    names = ["out_input_ids", "out_labels", "out_position_ids", "out_seq_idx", "out_cu_seqlens", "out_cu_seg"]
    for i, name in enumerate(names):
        bad = list(outs)
        bad[i] = outs[i].to(torch.int16)
        with pytest.raises(RuntimeError, match=f"{name} has dtype Short"):
            call(bad)
    bad = list(outs)
    bad[1] = outs[1][:-1]
    with pytest.raises(RuntimeError, match="out_labels must have shape"):
        call(bad)
    bad = list(outs)
    bad[5] = outs[5][:-1]
    with pytest.raises(RuntimeError, match="out_cu_seg must have shape"):
        call(bad)
    bad = list(outs)
    bad[4] = torch.empty(outs[4].numel() + 1, dtype=torch.int32)
    bad[5] = torch.empty(outs[5].numel() + 1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="num_cu_seqlens must be"):
        call(bad)
    bad = list(outs)
    bad[1] = outs[0]  # ids and labels into the same buffer
    with pytest.raises(RuntimeError, match="out_input_ids overlaps out_labels"):
        call(bad)
    with pytest.raises(RuntimeError, match="out_input_ids overlaps input_ids"):
        OPS.pack_batch_out(outs[0].view(-1)[:case.src.numel()], None, case.src_offsets, *case.plan_tensors, False,
                           *outs)


def test_bad_unpack_out_outputs():
    case = _case()
    cu, cu_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, False)
    packed = torch.zeros(case.num_rows, case.row_len, 3)
    args = (packed, case.src_offsets, case.seg_seq, case.seg_start, cu, cu_seg, False)
    with pytest.raises(RuntimeError, match=r"out must have shape"):
        OPS.unpack_out(*args, torch.empty(case.src.shape[0], 2))
    with pytest.raises(RuntimeError, match="exceeds the source"):  # num_src_tokens taken from out
        OPS.unpack_out(*args, torch.empty(case.src.shape[0] - 1, 3))
    with pytest.raises(RuntimeError, match="out must have 3 dims"):
        OPS.unpack_padded_out(packed, *args[2:], torch.empty(len(case.lengths), 3))
    with pytest.raises(RuntimeError, match="out overlaps packed"):
        OPS.unpack_padded_out(packed, *args[2:], packed[:1, :4])
    with pytest.raises(RuntimeError, match="cu_seqlens must be 1-D int32"):
        OPS.layout_out(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, False,
                       torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="cu_seg must have shape"):
        OPS.layout_out(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, False, cu.clone(),
                       cu_seg[:-1].clone())


@gpu_gate.needs_cuda_kernels
def test_out_on_wrong_device():
    case = _case()
    cu, cu_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, False)
    c = case.to("cuda")
    with pytest.raises(RuntimeError, match="same device"):
        OPS.pack_out(c.src, c.src_offsets, c.seg_seq, c.seg_start, cu.cuda(), cu_seg.cuda(), False,
                     torch.empty(case.num_rows, case.row_len, 3))


@gpu_gate.needs_cuda_kernels
def test_cuda_graph_replays_into_static_buffers():
    """The point of out-variants on a GPU: capture pack_batch_out once, replay with new data in place."""
    case = make_case(23, dtype=torch.int64, flat=False, extra_rows=2, max_seqs=10)
    c = case.to("cuda")
    outs = pack_batch_outputs(case, torch.int64, torch.int64, "cuda")
    args = (c.src, None, c.src_offsets, *c.plan_tensors, False, *outs)
    OPS.pack_batch_out(*args)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        OPS.pack_batch_out(*args)
    for step in range(3):
        c.src.copy_(case.src + 10 * (step + 1))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference_pack_batch(case.src + 10 * (step + 1), None, case.src_offsets, *case.plan_tensors,
                                   case.num_rows, case.row_len, False, 0, -100, True, 0)
        assert all(same_bytes(g, r) for g, r in zip(outs, ref)), step


@pytest.mark.parametrize("backend", [pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
                                     pytest.param("triton", marks=gpu_gate.needs_triton_gpu)])
def test_pack_sequences_reuse_on_cuda(backend):
    buffers = packkit.PackBuffers(2)
    rng = np.random.default_rng(7)
    for step in range(4):
        seqs = [rng.integers(1, 1000, int(n)).tolist() for n in rng.integers(1, 50, int(rng.integers(2, 20)))]
        opts = dict(capacity=64, layout="padded" if step % 2 else "flat", device="cuda", backend=backend)
        fresh = packkit.pack_sequences(seqs, **opts)
        reused = packkit.pack_sequences(seqs, out=buffers, **opts)
        for key, value in fresh.items():
            assert (same_bytes(value, reused[key]) if isinstance(value, torch.Tensor) else value == reused[key]), key
