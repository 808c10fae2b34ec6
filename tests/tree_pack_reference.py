"""Plain-PyTorch reference of ``packkit::tree_pack`` (every backend equals it bit for bit): a packed prefix
forest, node by node, in Python loops over host values."""
from __future__ import annotations

import torch


def reference_tree_pack(input_ids, labels, node_src, node_dst, node_len, node_pos, node_end, row_offsets, num_rows,
                        row_len, pad_id=0, ignore_index=-100):
    src, dst, ln, pos, end, ro = (t.cpu().tolist() for t in (node_src, node_dst, node_len, node_pos, node_end,
                                                              row_offsets))
    ids = input_ids.cpu()
    lab = ids if labels is None else labels.cpu()
    total = num_rows * row_len
    out_ids = torch.full((total,), pad_id, dtype=ids.dtype)
    out_lab = torch.full((total,), ignore_index, dtype=lab.dtype)
    out_pos = torch.zeros(total, dtype=torch.int64)
    out_node = torch.full((total,), -1, dtype=torch.int32)
    out_end = torch.full((total,), row_len, dtype=torch.int32)
    cu = []
    for r in range(num_rows):
        at = r * row_len
        for i in range(ro[r], ro[r + 1]):
            cu.append(dst[i])
            n = ln[i]
            out_ids[at:at + n] = ids[src[i]:src[i] + n]
            out_lab[at:at + n] = lab[src[i]:src[i] + n]
            out_pos[at:at + n] = torch.arange(pos[i], pos[i] + n)
            out_node[at:at + n] = i
            out_end[at:at + n] = end[i]
            at += n
        cu.append(at)
        out_pos[at:(r + 1) * row_len] = torch.arange((r + 1) * row_len - at)
    cu.append(total)
    shape = (num_rows, row_len)
    return (out_ids.view(shape), out_lab.view(shape), out_pos.view(shape), out_node.view(shape), out_end.view(shape),
            torch.tensor(cu, dtype=torch.int32))
