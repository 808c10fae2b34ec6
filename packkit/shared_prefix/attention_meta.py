"""The attention metadata a shared-prefix batch carries to every attention layer (``batch["shared_prefix"]``).

One object per packed batch: the per-token ``subtree_end`` (query ``q`` sees key ``k`` iff
``k <= q < subtree_end[k]``), the packed node layout, and, built on first use and reused by every layer,
the two-pass varlen metadata or the FlexAttention ``BlockMask``.
"""
from __future__ import annotations

import torch

from typing import Optional

from .layout import TreeLayout

ATTENTION_PATHS = ("auto", "varlen", "flex", "dense")


class SharedPrefixAttention:
    """Per-batch attention state. ``path``: ``"auto"`` picks, per call, the two-pass FlashAttention varlen
    path for CUDA fp16/bf16, FlexAttention for other CUDA dtypes, and the two-pass math on the CPU (exact,
    memory linear in the row); ``"dense"`` (a ``[B, 1, S, S]`` mask) is the reference for small cases."""

    def __init__(self, layout: TreeLayout, subtree_end: torch.Tensor, cu_seqlens: torch.Tensor,
                 node_idx: torch.Tensor, path: str = "auto", position_ids: Optional[torch.Tensor] = None):
        if path not in ATTENTION_PATHS:
            raise ValueError(f"unknown attention {path!r}; allowed: {', '.join(ATTENTION_PATHS)}")
        self.layout = layout
        self.subtree_end = subtree_end  # int32 [rows, row_len]
        self.cu_seqlens = cu_seqlens  # int32: every node and every row's padding tail
        self.node_idx = node_idx
        self.path = path
        # The batch's packed positions, and their version counter then: the attention checks a call's
        # position_ids against them by identity (no device read).
        self.position_ids = position_ids
        self._positions_version = None if position_ids is None else position_ids._version
        self.max_path = layout.max_path
        # Attention calls made with this batch: a model that never routes its attention through the registered
        # function (recurrent layers, its own attention code) would treat the rows as plain sequences, and
        # completion_logprobs refuses its logits when this is still 0.
        self.calls = 0
        self._passes = None
        self._block_mask = None
        self._dense = None

    def __repr__(self) -> str:
        return (f"SharedPrefixAttention(rows={self.layout.num_rows}, row_len={self.layout.row_len}, "
                f"nodes={len(self.layout.order)}, path={self.path!r})")

    def bind_positions(self, position_ids: torch.Tensor) -> None:
        """Check calls against ``position_ids`` from now on (a vision-language batch's text row, ``[4, R, S]``'s
        row 0 view, which is what Qwen-VL models hand their attention layers)."""
        self.position_ids = position_ids
        self._positions_version = position_ids._version

    def positions_match(self, position_ids: Optional[torch.Tensor]) -> bool:
        """Whether ``position_ids`` are this batch's own packed positions, unmodified: the same storage, offset,
        shape and strides, and no in-place write since packing (host metadata only, no device sync)."""
        mine = self.position_ids
        if mine is None or not isinstance(position_ids, torch.Tensor):
            return False
        if position_ids is mine:
            return mine._version == self._positions_version
        return (position_ids.device == mine.device and position_ids.data_ptr() == mine.data_ptr()
                and position_ids.shape == mine.shape and position_ids.stride() == mine.stride()
                and position_ids.dtype == mine.dtype and position_ids._version == self._positions_version)

    def choose(self, query: torch.Tensor) -> str:
        if self.path != "auto":
            return self.path
        if query.device.type == "cuda":
            return "varlen" if query.dtype in (torch.float16, torch.bfloat16) else "flex"
        return "varlen"

    def passes(self, device: torch.device):
        if self._passes is None:
            from .attention.two_pass import varlen_passes

            self._passes = varlen_passes(self.layout, device)
        return self._passes

    def block_mask(self):
        if self._block_mask is None:
            from .attention.masks import tree_block_mask

            self._block_mask = tree_block_mask(self.subtree_end)
        return self._block_mask

    def dense_mask(self) -> torch.Tensor:
        if self._dense is None:
            from .attention.masks import dense_tree_mask

            self._dense = dense_tree_mask(self.subtree_end)
        return self._dense

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale, softcap=None,
                 sink=None) -> torch.Tensor:
        """query ``[B, H, S, D]``, key/value ``[B, H_kv, S, D]`` -> ``[B, S, H, D]``. ``softcap``: scores become
        ``softcap * tanh(scores / softcap)``; ``sink`` ``[H]``: a per-head sink logit in every row's softmax."""
        batch, heads, length, dim = query.shape
        self.calls += 1
        if (batch, length) != tuple(self.subtree_end.shape):
            raise ValueError(f"the shared-prefix batch is {tuple(self.subtree_end.shape)} tokens but the attention "
                             f"got [B={batch}, S={length}]: pass the batch's input_ids/position_ids unchanged")
        scale = dim ** -0.5 if scale is None else scale
        path = self.choose(query)
        if path == "flex":
            from .attention.masks import flex_tree_attention

            if query.device.type == "cpu" and torch.is_grad_enabled() and (
                    query.requires_grad or (sink is not None and sink.requires_grad)):
                raise ValueError("FlexAttention has no backward on the CPU (torch raises NotImplementedError); use "
                                 "attention='varlen' (the exact two-pass math) or 'dense' for training on the CPU, "
                                 "or run under torch.no_grad()")

            return flex_tree_attention(query, key, value, self.block_mask(), scale, softcap, sink).transpose(1, 2)
        if key.shape[1] != heads:  # grouped-query attention: each query head gets its key/value head
            key = key.repeat_interleave(heads // key.shape[1], dim=1)
            value = value.repeat_interleave(heads // value.shape[1], dim=1)
        if path == "dense":
            from .attention.masks import dense_tree_attention

            return dense_tree_attention(query, key, value, self.dense_mask(), scale, softcap, sink).transpose(1, 2)
        from .attention.two_pass import two_pass_attention

        q = query.transpose(1, 2).reshape(batch * length, heads, dim)
        k = key.transpose(1, 2).reshape(batch * length, heads, dim)
        v = value.transpose(1, 2).reshape(batch * length, heads, value.shape[-1])
        out = two_pass_attention(q, k, v, self.passes(query.device), scale, softcap, sink)
        return out.reshape(batch, length, heads, out.shape[-1])
