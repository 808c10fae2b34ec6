"""The tree mask as a dense ``[B, 1, S, S]`` tensor (the reference) and as a FlexAttention ``BlockMask``.

A query ``q`` sees key ``k`` iff ``k <= q < subtree_end[k]``: ``subtree_end[k]`` is the end of the subtree of
``k``'s node in the depth-first row, so this is causal inside a node, full over the ancestors' tokens (they come
first and their subtree holds ``q``), and nothing from siblings or other trees (their subtree ends before ``q``).
Padding tokens have ``subtree_end`` = the row length, so they see only padding and no row is empty.
"""
from __future__ import annotations

import torch

_compiled = {}
# Where flex and its block masks run compiled (eager flex on CUDA is the dense reference), and with which backend:
# tests compile on the CPU with the "eager" backend to count Dynamo's graphs without code generation.
COMPILE_ON = ("cuda",)
COMPILE_BACKEND = "inductor"


def compiled(name: str):
    """``torch.compile`` of flex_attention (``"flex"``) or create_block_mask (``"block_mask"``), once per process,
    with dynamic shapes: batches of other row counts and lengths reuse the compiled code (a few graphs in all, for
    torch's 0/1 specialisations), where a static compile recompiled per shape until Dynamo's recompile limit (8)
    fell back to eager flex and its dense S x S scores."""
    key = (name, COMPILE_BACKEND)
    fn = _compiled.get(key)
    if fn is None:
        from torch.nn.attention import flex_attention as flex_module

        target = {"flex": flex_module.flex_attention, "block_mask": flex_module.create_block_mask}[name]
        fn = _compiled[key] = torch.compile(target, dynamic=True, backend=COMPILE_BACKEND)
    return fn


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
    make = compiled("block_mask") if se.device.type in COMPILE_ON else create_block_mask
    return make(mask_mod, batch, None, length, length, device=se.device, BLOCK_SIZE=block_size)


def dense_tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
                         softcap=None, sink=None) -> torch.Tensor:
    """The reference: query/key/value ``[B, H, S, D]`` (heads matched), bool ``mask`` ``[B, 1, S, S]`` ->
    ``[B, H, S, D]``. SDPA, or, with ``softcap`` / ``sink``, the same math written out (fp32 at least): scores
    soft-capped before the softmax, the per-head sink logit joining every row's log-sum-exp."""
    if softcap is None and sink is None:
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    s = torch.matmul(query.to(acc), key.to(acc).transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    if sink is not None:
        lse = torch.logaddexp(lse, sink.to(acc).view(1, -1, 1, 1))
    return torch.matmul(torch.exp(s - lse), value.to(acc)).to(query.dtype)


def flex_tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask, scale: float,
                        softcap=None, sink=None):
    """query ``[B, H, S, D]``, key/value ``[B, H_kv, S, D]`` -> ``[B, H, S, D]``. ``softcap``: a ``score_mod``;
    ``sink`` ``[H]``: applied from flex's LSE, ``out * sigmoid(lse - sink)``."""
    from torch.nn.attention import flex_attention as flex_module

    fn = compiled("flex") if query.device.type in COMPILE_ON else flex_module.flex_attention
    kw = {}
    if softcap is not None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return softcap * torch.tanh(score / softcap)
        kw["score_mod"] = score_mod
    if sink is not None:  # torch >= 2.9 returns aux outputs; earlier ones the LSE itself
        kw.update({"return_aux": flex_module.AuxRequest(lse=True)} if hasattr(flex_module, "AuxRequest")
                  else {"return_lse": True})
    out = fn(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=key.shape[1] != query.shape[1], **kw)
    if sink is None:
        return out
    out, aux = out
    lse = getattr(aux, "lse", aux)
    weight = torch.sigmoid(lse - sink.to(lse.dtype).view(1, -1, 1))  # exp(lse - logaddexp(lse, sink))
    return (out.to(weight.dtype) * weight[..., None]).to(query.dtype)
