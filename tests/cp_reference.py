"""Plain-PyTorch reference of packkit.shard_context_parallel (semantics every backend equals bit for bit).

Written the obvious way, independently of the kernels' index math: pad every segment (zigzag) or the
row (contiguous), shift labels per segment on the padded row, then cut it into chunks with Python loops.
"""
from __future__ import annotations

import torch


def reference_shard(input_ids, labels, position_ids, cu_seqlens, cp_size, cp_rank, mode, pad_id=0,
                    ignore_index=-100):
    """input_ids/labels/position_ids: 1-D [T]; cu_seqlens: list of ints. Returns a dict of 1-D tensors
    (input_ids, labels, shift_labels, position_ids, src_index, seq_idx) and the local/padded cu_seqlens lists."""
    cu = [int(c) for c in cu_seqlens]
    T = input_ids.numel()
    ids, split, shift, pos, src, seg = [], [], [], [], [], []  # the padded row, segment by segment
    padded_cu = [0]
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        n = b - a
        for i in range(a, b):
            ids.append(int(input_ids[i]))
            split.append(int(labels[i]))
            shift.append(int(labels[i + 1]) if i + 1 < b else ignore_index)
            pos.append(int(position_ids[i]))
            src.append(i)
            seg.append(s)
        if mode == "zigzag":
            m = 2 * cp_size
            pad = (-n) % m
            last = int(position_ids[b - 1]) + 1 if n else 0
            for k in range(pad):
                ids.append(pad_id); split.append(ignore_index); shift.append(ignore_index); pos.append(last + k)
                src.append(-1); seg.append(s)
        padded_cu.append(len(ids))
    if mode == "contiguous":
        pad = (-T) % cp_size
        for k in range(pad):
            ids.append(pad_id); split.append(ignore_index); shift.append(ignore_index); pos.append(k); src.append(-1)
            seg.append(len(cu) - 1)
    rows = (ids, split, shift, pos, src, seg)
    keep = []
    local_cu = [0]
    if mode == "zigzag":
        for s in range(len(cu) - 1):
            a, b = padded_cu[s], padded_cu[s + 1]
            c = (b - a) // (2 * cp_size)
            for chunk in (cp_rank, 2 * cp_size - 1 - cp_rank):
                keep.extend(range(a + chunk * c, a + (chunk + 1) * c))
            local_cu.append(local_cu[-1] + 2 * c)
    else:
        n = len(ids) // cp_size
        lo, hi = cp_rank * n, (cp_rank + 1) * n
        keep = list(range(lo, hi))
        bounds = cu + ([len(ids)] if len(ids) > T else [])
        for e in bounds[1:]:
            e = min(max(e - lo, 0), n)
            if e > local_cu[-1]:
                local_cu.append(e)
        if n and local_cu[-1] != n:
            local_cu.append(n)
    out = {name: torch.tensor([row[k] for k in keep], dtype=torch.int64)
           for name, row in zip(("input_ids", "labels", "shift_labels", "position_ids", "src_index", "seq_idx"), rows)}
    return out, local_cu, padded_cu
