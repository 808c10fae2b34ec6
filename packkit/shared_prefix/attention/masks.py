"""The tree mask as a dense ``[B, 1, S, S]`` tensor (the reference) and as a FlexAttention ``BlockMask``.

A query ``q`` sees key ``k`` iff ``k <= q < subtree_end[k]``: ``subtree_end[k]`` is the end of the subtree of
``k``'s node in the depth-first row, so this is causal inside a node, full over the ancestors' tokens (they come
first and their subtree holds ``q``), and nothing from siblings or other trees (their subtree ends before ``q``).
Padding tokens have ``subtree_end`` = the row length, so they see only padding and no row is empty.
"""
from __future__ import annotations

import torch

_compiled = {}


def dense_tree_mask(subtree_end: torch.Tensor) -> torch.Tensor:
    """bool ``[B, 1, S, S]`` (True = attend) from int ``subtree_end`` ``[B, S]``."""
    se = subtree_end.long()
    s = se.shape[-1]
    idx = torch.arange(s, device=se.device)
    q, k = idx.view(1, s, 1), idx.view(1, 1, s)
    return ((k <= q) & (q < se[:, None, :])).unsqueeze(1)


def tree_block_mask(subtree_end: torch.Tensor, *, block_size: int = 128):
    """A FlexAttention ``BlockMask`` of the tree for ``[B, S]`` rows. On the CPU flex runs its dense math
    reference (exact in every dtype, the block size only prunes); compiled on CUDA, blocks fully outside the
    tree are skipped and partial blocks apply ``mask_mod`` per element."""
    from torch.nn.attention.flex_attention import create_block_mask

    se = subtree_end.to(torch.int32)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx < se[b, kv_idx])

    batch, length = se.shape
    return create_block_mask(mask_mod, batch, None, length, length, device=se.device, BLOCK_SIZE=block_size,
                             _compile=se.device.type == "cuda")


def flex_tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask, scale: float):
    """query ``[B, H, S, D]``, key/value ``[B, H_kv, S, D]`` -> ``[B, H, S, D]``."""
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if query.device.type == "cuda":  # eager flex on CUDA is the dense reference; compile it once per process
        fn = _compiled.setdefault("flex", torch.compile(flex_attention, dynamic=False))
    return fn(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=key.shape[1] != query.shape[1])
