"""Plain-PyTorch reference for the pack ops: slow, obvious loops, no packkit code.

Every backend (CPU C++, CUDA, Triton) must equal these functions bit for bit. The semantics:

layout: output positions are split into segments listed by ``cu_seqlens``. For ``flat`` the output
is one row of ``row_len`` tokens (num_rows must be 1): every plan segment, bin after bin, then one
padding segment if tokens remain. For ``padded`` it is ``num_rows`` rows of ``row_len``: row ``b``
holds bin ``b``'s segments (no segments if ``b >= num_bins``) and then, if the row is not full, one
padding segment for its tail. ``cu_seg[k]`` is the plan segment behind output segment ``k``, or -1
for padding.
"""
from __future__ import annotations

import torch


def reference_layout(seg_length, bin_offsets, num_rows, row_len, flat):
    seg_length = [int(x) for x in seg_length]
    bin_offsets = [int(x) for x in bin_offsets]
    num_bins = len(bin_offsets) - 1
    starts, owners = [], []
    if flat:
        pos = 0
        for j, n in enumerate(seg_length):
            starts.append(pos), owners.append(j)
            pos += n
        assert pos <= row_len
        if pos < row_len:
            starts.append(pos), owners.append(-1)
        end = row_len
    else:
        assert num_bins <= num_rows
        for b in range(num_rows):
            pos = b * row_len
            if b < num_bins:
                for j in range(bin_offsets[b], bin_offsets[b + 1]):
                    starts.append(pos), owners.append(j)
                    pos += seg_length[j]
            assert pos <= (b + 1) * row_len
            if pos < (b + 1) * row_len:
                starts.append(pos), owners.append(-1)
        end = num_rows * row_len
    cu = torch.tensor(starts + [end], dtype=torch.int32)
    return cu, torch.tensor(owners, dtype=torch.int32)


def reference_pack(src, src_offsets, seg_seq, seg_start, cu, cu_seg, num_rows, row_len, flat, pad_value,
                   first_value=None):
    feature = tuple(src.shape[1:])
    total = row_len if flat else num_rows * row_len
    out = torch.empty((total, *feature), dtype=src.dtype)
    for k in range(len(cu_seg)):
        a, b, j = int(cu[k]), int(cu[k + 1]), int(cu_seg[k])
        if j < 0:
            out[a:b] = pad_value
            continue
        s = int(src_offsets[int(seg_seq[j])]) + int(seg_start[j])
        out[a:b] = src[s:s + (b - a)]
        if first_value is not None:
            out[a] = first_value
    return out if flat else out.reshape(num_rows, row_len, *feature)


def reference_pack_batch(input_ids, labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, num_rows,
                         row_len, flat, pad_id, ignore_index, mask_first_label, position_start):
    cu, cu_seg = reference_layout(seg_length, bin_offsets, num_rows, row_len, flat)
    ids = reference_pack(input_ids, src_offsets, seg_seq, seg_start, cu, cu_seg, num_rows, row_len, flat, pad_id)
    lab_src = input_ids if labels is None else labels
    lab = reference_pack(lab_src, src_offsets, seg_seq, seg_start, cu, cu_seg, num_rows, row_len, flat,
                         ignore_index, ignore_index if mask_first_label else None)
    total = int(cu[-1])
    pos = torch.empty(total, dtype=torch.int64)
    seq_idx = torch.empty(total, dtype=torch.int32)
    for k in range(len(cu_seg)):
        a, b = int(cu[k]), int(cu[k + 1])
        pos[a:b] = torch.arange(position_start, position_start + b - a)
        seq_idx[a:b] = k
    shape = (total,) if flat else (num_rows, row_len)
    return ids, lab, pos.reshape(shape), seq_idx.reshape(shape), cu


def reference_unpack(packed, src_offsets, seg_seq, seg_start, cu, cu_seg, flat, pad_value):
    token_dims = 1 if flat else 2
    feature = tuple(packed.shape[token_dims:])
    packed = packed.reshape(-1, *feature)
    out = torch.full((int(src_offsets[-1]), *feature), pad_value, dtype=packed.dtype)
    for k in range(len(cu_seg)):
        j = int(cu_seg[k])
        if j >= 0:
            a, b = int(cu[k]), int(cu[k + 1])
            s = int(src_offsets[int(seg_seq[j])]) + int(seg_start[j])
            out[s:s + b - a] = packed[a:b]
    return out


def reference_unpack_padded(packed, seg_seq, seg_start, cu, cu_seg, flat, num_sequences, max_len, pad_value):
    token_dims = 1 if flat else 2
    feature = tuple(packed.shape[token_dims:])
    packed = packed.reshape(-1, *feature)
    out = torch.full((num_sequences, max_len, *feature), pad_value, dtype=packed.dtype)
    for k in range(len(cu_seg)):
        j = int(cu_seg[k])
        if j >= 0:
            a, b = int(cu[k]), int(cu[k + 1])
            i, s = int(seg_seq[j]), int(seg_start[j])
            n = max(0, min(b - a, max_len - s))
            out[i, s:s + n] = packed[a:a + n]
    return out
