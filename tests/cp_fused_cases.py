"""Cases and the plain-PyTorch reference of the fused CP path (packkit.pack_context_parallel): pack with
tests/pack_reference.py, then split with tests/cp_reference.py. Shared by tests/test_cp_fused.py,
tests/triton_interp/test_cp_triton.py and tests/gpu/test_cuda_paths.py."""
from __future__ import annotations

import numpy as np
import torch

import packkit
from cp_reference import reference_shard
from packkit.context_parallel.fused import FusedPlan
from pack_reference import reference_pack_batch
from packkit.packing.sequences import identity_segments, pack_layout

KEYS = ("input_ids", "labels", "shift_labels", "position_ids", "seq_idx")


def make_case(seed):
    """Random sequences/labels and pack options (flat or padded, a plan or none, row padding, first labels)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    lengths = rng.integers(1, 30, n)
    id_dtype = (torch.int64, torch.int32)[seed % 2]
    seqs = [torch.from_numpy(rng.integers(1, 30000, int(k))).to(id_dtype) for k in lengths]
    labels = [torch.from_numpy(rng.integers(-100, 30000, int(k))) for k in lengths] if seed % 3 else None
    kw = dict(labels=labels, mask_first_label=bool(seed % 4), position_ids_start=int(rng.integers(0, 3)),
              pad_token_id=int(rng.integers(0, 5)))
    if seed % 5 == 0:
        kw.update(capacity=int(lengths.max() + rng.integers(0, 9)), layout="padded",
                  num_rows=None if seed % 2 else int(n + 1))
    elif seed % 5 == 1:
        kw.update(capacity=24, overlong="split")
    elif seed % 5 == 2:
        kw.update(row_len=int(lengths.sum() + rng.integers(0, 7)))
    return seqs, lengths, kw


def reference(seqs, lengths, kw, cp, rank, mode):
    """Pack with the pack reference, then split with the CP reference (no packkit kernels)."""
    flat = torch.cat(seqs)
    labels = torch.cat(kw["labels"]) if kw.get("labels") is not None else None
    if kw.get("capacity"):
        segments = packkit.plan(lengths, kw["capacity"], overlong=kw.get("overlong", "error")).segments
    else:
        segments = identity_segments(np.asarray(lengths, np.int64))
    shape = pack_layout(segments, flat=kw.get("layout", "flat") == "flat", row_len=kw.get("row_len") or (
        kw["capacity"] if kw.get("layout") == "padded" else None), num_rows=kw.get("num_rows"))
    offsets = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))).long()
    ids, lab, pos, _, cu = reference_pack_batch(
        flat, labels, offsets, *(torch.from_numpy(np.array(a)) for a in segments), shape.num_rows, shape.row_len, shape.flat,
        kw["pad_token_id"], -100, kw["mask_first_label"], kw["position_ids_start"])
    ref, local_cu, padded_cu = reference_shard(ids.reshape(-1), lab.reshape(-1), pos.reshape(-1), cu.tolist(), cp,
                                               rank, mode, kw["pad_token_id"])
    return ref, local_cu, padded_cu, ids.dtype, lab.dtype


def check_reference(out, seqs, lengths, kw, cp, rank, mode):
    ref, local_cu, padded_cu, id_dtype, lab_dtype = reference(seqs, lengths, kw, cp, rank, mode)
    assert out["input_ids"].dtype == id_dtype and out["labels"].dtype == out["shift_labels"].dtype == lab_dtype
    for key in KEYS:  # every element (the outputs were allocated over poisoned memory)
        assert out[key].shape == (1, len(ref[key])), key
        assert out[key][0].cpu().to(torch.int64).tolist() == ref[key].tolist(), key
    assert out["cu_seq_lens_q"].tolist() == local_cu and out["cu_seq_lens_k"] is out["cu_seq_lens_q"]
    assert out["max_length_q"] == out["max_length_k"] == max(np.diff(local_cu), default=0)
    if mode == "zigzag":
        assert out["cu_seqlens_padded"].tolist() == padded_cu
    else:
        assert "cu_seqlens_padded" not in out
    return ref


def op_args(seed, mode, cp=3, rank=1):
    """``packkit::cp_shard``'s arguments for a fused pack + shard of case ``seed`` (rank ``rank`` of ``cp``)."""
    seqs, lengths, _ = make_case(seed)
    flat = torch.cat(seqs)
    segments = identity_segments(np.asarray(lengths, np.int64))
    fused = FusedPlan(segments, pack_layout(segments, flat=True, row_len=int(sum(lengths)) + 2), lengths, cp, rank,
                      mode)
    cu = torch.from_numpy(fused.cu.astype(np.int32))
    cup = torch.from_numpy(fused.cup.astype(np.int32)) if mode == "zigzag" else cu
    return (flat, flat.clone(), None, cu, cup, cp, rank, mode == "zigzag", fused.local_len, 0, -100,
            torch.from_numpy(fused.seg_src), 2, -100)
