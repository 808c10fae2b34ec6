"""packkit.pack_sequences / unpack_sequences: the function people call."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
import gpu_gate
from pack_reference import reference_pack_batch

pytestmark = pytest.mark.core

transformers = pytest.importorskip("transformers")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def random_sequences(seed, n=None, max_len=50, min_len=1):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 20)) if n is None else n
    return [rng.integers(3, 1000, int(rng.integers(min_len, max_len + 1))).tolist() for _ in range(n)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), with_labels=st.booleans(), start=st.sampled_from([0, 2]))
def test_flat_default_equals_hf_data_collator_with_flattening(seed, with_labels, start):
    seqs = random_sequences(seed)
    rng = np.random.default_rng(seed + 1)
    labels = [rng.integers(-100, 1000, len(s)).tolist() for s in seqs] if with_labels else None
    features = [{"input_ids": s, **({"labels": l} if labels else {})} for s, l in zip(seqs, labels or seqs)]
    hf = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True,
                                                 position_ids_start=start)(features)
    ours = packkit.pack_sequences(seqs, labels=labels, position_ids_start=start)
    assert set(ours) == set(hf)
    for key, value in hf.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype, key
            assert torch.equal(ours[key], value), key
        else:
            assert type(ours[key]) is type(value) and ours[key] == value, key


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["lists", "tensors", "flat"])
def test_input_forms_agree(device, source):
    seqs = random_sequences(5, n=30)
    lengths = [len(s) for s in seqs]
    if source == "lists":
        batch = packkit.pack_sequences(seqs, capacity=64, layout="padded", device=device)
    elif source == "tensors":
        batch = packkit.pack_sequences([torch.tensor(s) for s in seqs], capacity=64, layout="padded", device=device)
    else:
        flat = torch.tensor([t for s in seqs for t in s])
        batch = packkit.pack_sequences(flat, lengths, capacity=64, layout="padded", device=device)
    plan = packkit.plan(lengths, 64)
    segs = [torch.from_numpy(a.copy()) for a in plan.segments]
    flat = torch.tensor([t for s in seqs for t in s])
    offs = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))))
    ref = reference_pack_batch(flat, None, offs, *segs, plan.num_bins, 64, False, 0, -100, True, 0)
    for key, r in zip(("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q"), ref):
        assert torch.equal(batch[key].cpu(), r), key
        assert batch[key].device.type == device


def test_padded_layout_semantics():
    seqs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]]
    plan = packkit.plan([3, 2, 6], 6, algorithm="nf")
    batch = packkit.pack_sequences(seqs, plan=plan, layout="padded", num_rows=4)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 10, 11], [0] * 6, [0] * 6]
    assert batch["labels"].tolist() == [[-100, 2, 3, -100, 5, -100], [-100, 7, 8, 9, 10, 11], [-100] * 6, [-100] * 6]
    # Padding continues as its own document, so position-based detection never sees 1-token documents.
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]] + \
        [[0, 1, 2, 3, 4, 5]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 12, 18, 24]
    assert batch["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2], [3] * 6, [4] * 6, [5] * 6]
    assert batch["max_length_q"] == 6
    # The flattened [rows * row_len] view is a valid varlen batch: segments tile it exactly.
    cu = batch["cu_seq_lens_q"]
    assert int(cu[-1]) == batch["input_ids"].numel() and bool((cu[1:] > cu[:-1]).all())


def test_flat_static_length_and_overlong_split():
    seqs = random_sequences(9, n=12, max_len=40)
    lengths = [len(s) for s in seqs]
    plan = packkit.plan(lengths, 16, overlong="split")
    batch = packkit.pack_sequences(seqs, plan=plan, layout="flat", row_len=plan.kept_tokens + 7)
    assert batch["input_ids"].shape == (1, plan.kept_tokens + 7)
    assert batch["input_ids"][0, -7:].tolist() == [0] * 7
    assert batch["position_ids"][0, -7:].tolist() == list(range(7))
    assert batch["max_length_q"] == max(int(plan.segments.length.max()), 7)
    assert int(batch["cu_seq_lens_q"][-2]) == plan.kept_tokens


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_unpack_round_trip_with_features(device, layout):
    seqs = random_sequences(3, n=25, max_len=60)
    lengths = np.array([len(s) for s in seqs])
    batch, info = packkit.pack_sequences(seqs, capacity=48, overlong="split", layout=layout, device=device,
                                         return_info=True)
    # A per-token model output with a feature dim, e.g. [rows, L, 5] logits.
    out = torch.randn(*batch["input_ids"].shape, 5, device=device)
    back = packkit.unpack_sequences(out, info)
    ids_back = packkit.unpack_sequences(batch["input_ids"], info)
    assert ids_back.tolist() == [t for s in seqs for t in s]
    padded = packkit.unpack_sequences(batch["input_ids"], info, padded=True, pad_value=-1)
    assert padded.shape == (len(seqs), lengths.max())
    for i, s in enumerate(seqs):
        assert padded[i, :len(s)].tolist() == s and (padded[i, len(s):] == -1).all()
    # The feature rows follow their tokens: pack the token *indices* and read the map off.
    # (indices + 1 with padding 0: packkit refuses negative ids and pad_token_id)
    index_batch = packkit.pack_sequences(torch.arange(int(lengths.sum())) + 1, lengths, capacity=48, overlong="split",
                                         layout=layout, device=device, pad_token_id=0)
    where = index_batch["input_ids"].reshape(-1) - 1
    flat_out = out.reshape(-1, 5)
    expected = torch.empty_like(back)
    expected[where[where >= 0]] = flat_out[where >= 0]
    assert torch.equal(back, expected)


def test_dropped_tokens_come_back_as_pad():
    seqs = [[1] * 5, [2] * 30, [3] * 4]
    batch, info = packkit.pack_sequences(seqs, capacity=10, overlong="drop", layout="padded", return_info=True)
    back = packkit.unpack_sequences(batch["input_ids"], info, pad_value=-7)
    assert back.tolist() == [1] * 5 + [-7] * 30 + [3] * 4


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(layout="ragged"), ValueError, "unknown layout"),
    (dict(layout="padded"), ValueError, "needs a plan or a capacity"),
    (dict(capacity=4), ValueError, "longer than"),
    (dict(capacity=64, layout="padded", num_rows=1), ValueError, "num_rows=1"),
    (dict(capacity=64, layout="padded", row_len=8), ValueError, "more than row_len=8"),
    (dict(row_len=3), ValueError, "flat layout has row_len=3"),
    (dict(backend="tpu"), ValueError, "unknown backend"),
    (dict(backend="cuda"), ValueError, "needs a CUDA device"),
    (dict(labels=[[1, 2]]), ValueError, "same lengths"),
    (dict(capacity=64, layout="padded", num_rows=-1), ValueError, "non-negative"),
])
def test_bad_arguments(kwargs, error, match):
    seqs = [[1, 2, 3, 4, 5], [6, 7], list(range(40)), list(range(30)), list(range(50))]
    with pytest.raises(error, match=match):
        packkit.pack_sequences(seqs, **kwargs)


def test_bad_sources_and_plans():
    with pytest.raises(TypeError, match="list of sequences"):
        packkit.pack_sequences("hello")
    with pytest.raises(TypeError, match="needs lengths"):
        packkit.pack_sequences(torch.arange(5))
    with pytest.raises(ValueError, match="lengths sum to 4"):
        packkit.pack_sequences(torch.arange(5), [2, 2])
    with pytest.raises(TypeError, match="integer token id"):
        packkit.pack_sequences([[1, 2], [3, "x"]])
    with pytest.raises(TypeError, match="integer tensor"):
        packkit.pack_sequences([torch.tensor([1.0, 2.0])])
    with pytest.raises(ValueError, match="1-D"):
        packkit.pack_sequences([torch.zeros(3, 2, dtype=torch.long)])
    other = packkit.plan([5, 5], 10)
    with pytest.raises(ValueError, match="for 2 sequences but 3"):
        packkit.pack_sequences([[1], [2], [3]], plan=other)
    with pytest.raises(ValueError, match="made for other lengths"):
        packkit.pack_sequences([[1, 2], [3, 4, 5, 6, 7]], plan=other, layout="padded")
    with pytest.raises(TypeError, match="packkit.Plan"):
        packkit.pack_sequences([[1, 2]], plan={"bins": [[0]]})


def test_empty_and_zero_length_sequences():
    batch = packkit.pack_sequences([[], [5, 6], []])
    assert batch["input_ids"].tolist() == [[5, 6]] and batch["cu_seq_lens_q"].tolist() == [0, 2]
    empty = packkit.pack_sequences([[], []])
    assert empty["input_ids"].shape == (1, 0) and empty["cu_seq_lens_q"].tolist() == [0]


@pytest.mark.parametrize("device", DEVICES)
def test_pack_on_device_round_trip(device):
    seqs = random_sequences(13, n=40, max_len=90)
    lengths = torch.tensor([len(s) for s in seqs], device=device)
    flat = torch.tensor([t for s in seqs for t in s], device=device)
    batch, info = packkit.pack_on_device(flat, lengths, 128, overlong="split")
    assert batch["input_ids"].device.type == device
    assert torch.equal(packkit.unpack_sequences(batch["input_ids"], info), flat)
    assert int(batch["cu_seq_lens_q"][-1]) == batch["input_ids"].numel()


@gpu_gate.needs_cuda
def test_device_packing_with_host_lengths_never_synchronises():
    seqs = random_sequences(14, n=64, max_len=300)
    lengths = np.array([len(s) for s in seqs])
    flat = torch.tensor([t for s in seqs for t in s], device="cuda")
    packkit.pack_on_device(flat, lengths, 1024)  # warm up (allocator, module loading)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch, _ = packkit.pack_on_device(flat, lengths, 1024)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert batch["input_ids"].is_cuda


def test_huge_num_rows_is_refused_before_allocating():
    """Fuzz finding: num_rows=2**32 allocated a 32 GB per-row array before the 2^31-token check."""
    with pytest.raises(ValueError, match="fewer than 2\\^31 tokens"):
        packkit.pack_sequences([[1, 2, 3]], capacity=4, layout="padded", num_rows=2**32)


def test_sequences_of_different_feature_shapes_are_a_value_error():
    """Fuzz finding: tensors of different trailing shapes reached torch.cat (RuntimeError)."""
    with pytest.raises(ValueError, match=r"sequences\[1\] has shape \(1, 3\) but sequences\[0\] has \(2,\)"):
        packkit.pack_sequences([torch.tensor([1, 2]), torch.tensor([[1, 2, 3]])], capacity=8)


# --- mask_first_label=False against values built here (audit, issue 27: a pack_sequences that always masked
# passed every test). Planted-bug control: pass mask_first_label=True to the op unconditionally -> these fail.
@pytest.mark.parametrize("with_labels", [False, True])
def test_mask_first_label_false_keeps_every_first_label_flat(with_labels):
    seqs = random_sequences(11, n=7)
    labels = [[(t * 7) % 997 + 1 for t in s] for s in seqs] if with_labels else None
    source = labels if with_labels else seqs
    kept = packkit.pack_sequences(seqs, labels=labels, mask_first_label=False)
    assert kept["labels"][0].tolist() == [t for s in source for t in s]  # every label, first ones included
    masked = packkit.pack_sequences(seqs, labels=labels, mask_first_label=True)
    assert masked["labels"][0].tolist() == [-100 if j == 0 else t for s in source for j, t in enumerate(s)]


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_mask_first_label_false_equals_reference_with_a_plan(layout):
    seqs = random_sequences(12, n=15, max_len=40)
    lengths = [len(s) for s in seqs]
    plan = packkit.plan(lengths, 48)
    flat_ids = torch.tensor([t for s in seqs for t in s], dtype=torch.int64)
    seg = plan.segments
    src_offsets = torch.tensor(np.concatenate(([0], np.cumsum(lengths))), dtype=torch.int64)
    rows = plan.num_bins if layout == "padded" else 1
    row_len = 48 if layout == "padded" else int(sum(lengths))
    for mask in (False, True):
        got = packkit.pack_sequences(seqs, plan=plan, layout=layout, mask_first_label=mask)
        want = reference_pack_batch(flat_ids, None, src_offsets, *(torch.from_numpy(a) for a in seg), rows, row_len,
                                    layout == "flat", 0, -100, mask, 0)
        assert torch.equal(got["labels"].reshape(want[1].shape), want[1]), mask
        real = got["input_ids"] != 0  # ids are drawn from [3, 1000): 0 is padding
        ids, first = got["input_ids"][real], got["position_ids"][real] == 0
        # Independent of the reference: labels are the ids, -100 at each document's first token iff masking.
        assert torch.equal(got["labels"][real], torch.where(first & mask, torch.full_like(ids, -100), ids)), mask


@pytest.mark.parametrize("has_cuda_kernels", [True, False])
def test_backend_choice_for_cuda_devices_without_a_gpu(monkeypatch, has_cuda_kernels):
    """Backend selection is pure Python: its CUDA-device branches are tested here, GPU or not (the GPU
    test tests/gpu/test_cuda_paths.py::test_auto_backend_uses_the_cuda_kernels only runs with kernels built)."""
    from packkit.packing import ops
    from packkit.packing.sequences import _backend_for

    from packkit.packing import sequences

    monkeypatch.setattr(ops, "HAS_CUDA_KERNELS", has_cuda_kernels)
    cuda = torch.device("cuda", 0)
    # "auto" asks the self-check verdict (tests/test_backend_check.py); here, what it returns is what is used.
    monkeypatch.setattr(sequences, "auto_backend", lambda device: "checked:" + str(device))
    assert _backend_for(cuda, "auto") == "checked:cuda:0"
    assert _backend_for(cuda, "triton") == "triton"
    if has_cuda_kernels:
        assert _backend_for(cuda, "cuda") == "cuda"
    else:
        with pytest.raises(ValueError, match="CUDA kernels are not loaded"):
            _backend_for(cuda, "cuda")
    with pytest.raises(ValueError, match="data is on a CUDA device"):
        _backend_for(cuda, "cpu")
    for backend in ("auto", "cpu"):
        assert _backend_for(torch.device("cpu"), backend) == "cpu"
    for backend in ("cuda", "triton"):
        with pytest.raises(ValueError, match="needs a CUDA device"):
            _backend_for(torch.device("cpu"), backend)
    with pytest.raises(ValueError, match="packs on CPU or CUDA devices"):
        _backend_for(torch.device("meta"), "auto")
    with pytest.raises(ValueError, match="unknown backend"):
        _backend_for(cuda, "tpu")


def test_pack_on_device_passes_overlong_on():
    """pack_on_device works on CPU tensors too; its overlong= reaches the planner (kills a mutmut survivor that
    dropped it; docs/mutation.md)."""
    ids = torch.arange(1, 31)
    batch, info = packkit.pack_on_device(ids, torch.tensor([20, 10]), 12, overlong="split")
    assert batch["input_ids"].shape == (3, 12)
    assert torch.equal(packkit.unpack_sequences(batch["input_ids"], info), ids)  # every token, split and back
    with pytest.raises(ValueError, match="longer than"):
        packkit.pack_on_device(ids, torch.tensor([20, 10]), 12)  # the default policy is "error"
