"""Shared-prefix attention registered with transformers::

    name = packkit.shared_prefix.register_attention()     # "packkit_shared_prefix"
    model.set_attn_implementation(name)
    batch, info = packkit.shared_prefix.pack_groups(prompts, completions)
    logits = model(**batch, use_cache=False).logits

The model passes ``batch["shared_prefix"]`` through to every attention layer. transformers builds no mask for
a registered implementation it does not know, so no ``[S, S]`` mask is ever made unless the dense path asks.
What cannot be exact is refused with an error naming the cause.
"""
from __future__ import annotations

from typing import Optional

import torch

from .attention_meta import SharedPrefixAttention

NAME = "packkit_shared_prefix"
# Layer kinds whose state would flow across branches (recurrent / linear attention / convolution).
_ATTENTION_LAYERS = {"full_attention", "sliding_attention", "attention", "global", "local", "chunked_attention"}
_RECURRENT_MODELS = ("mamba", "jamba", "falcon_h1", "qwen3_next", "bamba", "zamba", "nemotron_h", "granitemoehybrid",
                     "lfm2", "recurrent_gemma", "rwkv", "minimax", "xlstm", "olmo_hybrid", "kimi_linear")


def _check_model(module: torch.nn.Module) -> None:
    config = getattr(module, "config", None)
    if config is None:
        return
    model_type = str(getattr(config, "model_type", ""))
    layer_types = getattr(config, "layer_types", None) or []
    other = sorted({str(t) for t in layer_types} - _ATTENTION_LAYERS)
    if other or any(model_type.startswith(m) for m in _RECURRENT_MODELS):
        raise ValueError(f"shared-prefix attention cannot be exact for {model_type or 'this model'}: it has "
                         f"recurrent / linear-attention layers ({', '.join(other) or model_type}) whose state would "
                         "flow from one branch into the next; pack these sequences without sharing")


def shared_prefix_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                    value: torch.Tensor, attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                                    scaling: Optional[float] = None, shared_prefix: Optional[SharedPrefixAttention] = None,
                                    sliding_window: Optional[int] = None, use_cache: Optional[bool] = None, **kwargs):
    """An HF attention function (``AttentionInterface``): query ``[B, H, S, D]``; returns ``([B, S, H, D], None)``."""
    if not isinstance(shared_prefix, SharedPrefixAttention):
        raise ValueError("shared-prefix attention needs the batch's 'shared_prefix' entry: call the model as "
                         "model(**batch, use_cache=False) with batch from packkit.shared_prefix.pack_groups / pack_tree")
    if dropout:
        raise ValueError(f"shared-prefix attention refuses attention dropout ({dropout}): a shared prefix is one "
                         "forward, so every branch would see the same dropout draw; set the config's "
                         "attention_dropout to 0 or call model.eval()")
    if use_cache or key.shape[-2] != query.shape[-2]:
        raise ValueError("shared-prefix attention refuses a KV cache: the cache would hold every branch of the "
                         "packed tree as one sequence; call the model with use_cache=False")
    if attention_mask is not None:
        raise ValueError("shared-prefix attention takes no attention_mask: the tree in batch['shared_prefix'] is "
                         "the mask; pass the batch unchanged")
    if sliding_window is not None and 0 < sliding_window < shared_prefix.max_path:
        raise ValueError(f"a sliding window of {sliding_window} tokens is shorter than the longest tree path "
                         f"({shared_prefix.max_path} tokens): the window is not implemented on tree masks; use "
                         "unshared packing for these sequences")
    _check_model(module)
    return shared_prefix(query, key, value, scaling), None


def register_attention(name: str = NAME) -> str:
    """Register :func:`shared_prefix_attention_forward` with transformers under ``name``; returns ``name``
    (for ``model.set_attn_implementation(name)`` or ``attn_implementation=name``)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, shared_prefix_attention_forward)
    return name
