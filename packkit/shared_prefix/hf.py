"""Shared-prefix attention registered with transformers::

    name = packkit.shared_prefix.register_attention()     # "packkit_shared_prefix"
    model.set_attn_implementation(name)
    batch, info = packkit.shared_prefix.pack_groups(prompts, completions)
    logits = model(**batch, use_cache=False).logits

The model passes ``batch["shared_prefix"]`` through to every attention layer. transformers builds no mask for
a registered implementation it does not know, so no ``[S, S]`` mask is ever made unless the dense path asks.
Every keyword argument the model passes is implemented or refused by name (``packkit.training.attention_args``):
``scaling``, ``softcap`` (Gemma 2) and ``s_aux`` (GPT-OSS sinks) are implemented on every path; a sliding window
at least the longest tree path has no effect and is accepted, a shorter one refused; dropout, a KV cache,
non-causal layers, a user ``attention_mask`` and positions other than the batch's own are refused.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..training.attention_args import check_numbers, layer_limits, refusal, refuse_unknown, register
from .attention_meta import SharedPrefixAttention

NAME = "packkit_shared_prefix"
# Layer kinds whose state would flow across branches (recurrent / linear attention / convolution).
_ATTENTION_LAYERS = {"full_attention", "sliding_attention", "attention", "global", "local", "chunked_attention"}
_RECURRENT_MODELS = ("mamba", "jamba", "falcon_h1", "qwen3_next", "bamba", "zamba", "nemotron_h", "granitemoehybrid",
                     "lfm2", "recurrent_gemma", "rwkv", "minimax", "xlstm", "olmo_hybrid", "kimi_linear")
_FLAT_BATCH = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
# Qwen-VL vision towers (their sub-config's model_type). model.set_attn_implementation(name) on the whole model hands
# every sub-config the name, so the tower's per-image bidirectional attention arrives here too: it runs transformers'
# SDPA, as the tower does by default (each image is its own call, nothing shared). To keep another tower attention
# (e.g. FlashAttention varlen on a GPU), set only the text model:
# model.set_attn_implementation({"text_config": name}).
VISION_TOWERS = ("qwen2_vl_vision", "qwen2_5_vl_vision", "qwen3_vl_vision", "qwen3_vl_moe_vision")


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
                                    scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                                    sliding_window: Optional[int] = None, softcap: Optional[float] = None, s_aux=None,
                                    position_ids=None, cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None,
                                    max_length_k=None, seq_idx=None,
                                    shared_prefix: Optional[SharedPrefixAttention] = None,
                                    use_cache: Optional[bool] = None, output_attentions=None,
                                    output_hidden_states=None, output_router_logits=None, num_items_in_batch=None,
                                    **unknown):
    """An HF attention function (``AttentionInterface``): query ``[B, H, S, D]``; returns ``([B, S, H, D], None)``.
    The keyword arguments are those of ``packkit.training.attention_args.ARGUMENTS``; any other is refused."""
    refuse_unknown(NAME, module, unknown)
    if str(getattr(getattr(module, "config", None), "model_type", "")) in VISION_TOWERS:
        return _vision_tower_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                                       (cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, seq_idx))
    if not isinstance(shared_prefix, SharedPrefixAttention):
        raise refusal(NAME, module, "a call without the batch's 'shared_prefix' entry", "call the model as "
                      "model(**batch, use_cache=False) with batch from packkit.shared_prefix.pack_groups / pack_tree")
    if dropout:
        raise refusal(NAME, module, f"attention dropout ({dropout})", "a shared prefix is one forward, so every "
                      "branch would see the same dropout draw; set the config's attention_dropout to 0 or call "
                      "model.eval()")
    if use_cache or key.shape[-2] != query.shape[-2]:
        raise refusal(NAME, module, "a KV cache (use_cache=True or cached keys)", "the cache would hold every "
                      "branch of the packed tree as one sequence; call the model with use_cache=False")
    if attention_mask is not None:
        raise refusal(NAME, module, "an attention_mask", "the tree in batch['shared_prefix'] is the mask; pass the "
                      "batch unchanged")
    if output_attentions:
        raise refusal(NAME, module, "output_attentions=True", "no attention weights are formed; call without it")
    flat = [n for n, v in zip(_FLAT_BATCH, (cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, seq_idx))
            if v is not None]
    if flat:
        raise refusal(NAME, module, f"{', '.join(flat)} next to a shared-prefix batch", "they describe a flat "
                      "packed batch's documents, not the tree; pass the pack_groups / pack_tree batch unchanged")
    if not (getattr(module, "is_causal", True) if is_causal is None else is_causal):  # as transformers' SDPA reads it
        raise refusal(NAME, module, "a non-causal (bidirectional) attention layer",
                      "shared-prefix attention is causal along each tree path; pack these sequences without sharing")
    if not shared_prefix.positions_match(position_ids):
        why = ("this model does not pass position_ids to its attention, so they cannot be checked"
               if position_ids is None else "they are not the batch's own packed positions (a branch's positions "
               "continue from its prefix's); pass batch['position_ids'] unchanged")
        raise refusal(NAME, module, "the call's position_ids", why)
    check_numbers(NAME, module, scaling=scaling, softcap=softcap, sliding_window=sliding_window, dropout=dropout)
    sliding_window, chunk = layer_limits(module, sliding_window)
    if chunk is not None and chunk < shared_prefix.max_path:
        raise refusal(NAME, module, f"chunked attention (attention_chunk_size={chunk}, shorter than the longest "
                      f"tree path, {shared_prefix.max_path} tokens)", "chunks are not implemented on tree masks; use "
                      "unshared packing for these sequences")
    if sliding_window is not None and sliding_window < shared_prefix.max_path:
        raise refusal(NAME, module, f"a sliding window of {sliding_window} tokens, shorter than the longest tree "
                      f"path ({shared_prefix.max_path} tokens)", "the window is not implemented on tree masks; use "
                      "unshared packing for these sequences")
    _check_model(module)
    sink = None
    if s_aux is not None:
        heads = query.shape[1]
        if not isinstance(s_aux, torch.Tensor) or tuple(s_aux.shape) != (heads,):
            raise refusal(NAME, module, f"s_aux of shape {tuple(getattr(s_aux, 'shape', ()))}",
                          f"attention sinks are one logit per query head ([{heads}])")
        sink = s_aux
    return shared_prefix(query, key, value, scaling, softcap, sink), None


def _vision_tower_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, flat):
    """A Qwen-VL vision tower's call (one image, or one window, bidirectional): transformers' SDPA on it, the tower's
    default attention, with the same arguments. A varlen call (``cu_seq_lens``: the tower believes it runs flash
    attention) is refused: SDPA would let the images see each other."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    given = [n for n, v in zip(_FLAT_BATCH, flat) if v is not None]
    if given:
        raise refusal(NAME, module, f"{', '.join(given)} in the vision tower", "set only the text model: "
                      "model.set_attn_implementation({'text_config': name})")
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=False if is_causal is None else is_causal)


def register_attention(name: str = NAME) -> str:
    """Register :func:`shared_prefix_attention_forward` with transformers under ``name`` (with a mask guard that
    refuses a user's ``attention_mask``, which transformers would otherwise drop); returns ``name`` (for
    ``model.set_attn_implementation(name)`` or ``attn_implementation=name``)."""
    return register(name, shared_prefix_attention_forward)
