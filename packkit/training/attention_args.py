"""Every keyword argument transformers passes to an attention function packkit registers, and what each of the two
functions (``packkit_varlen``, ``packkit_shared_prefix``) does with it: implemented, refused (ValueError naming the
feature and the model type), or not an attention input. An argument missing from :data:`ARGUMENTS` is refused by
name, never dropped.

transformers calls ``f(module, query, key, value, attention_mask, dropout=, scaling=, **kwargs)``. The union below
was measured on transformers 5.24 by running tiny random configs of llama, mistral, ministral, qwen2, qwen2_moe, qwen3,
qwen3_moe, mixtral, gemma, gemma2, gemma3_text, gpt_oss, olmo, olmo2, olmo3, cohere, cohere2, exaone4, phi,
starcoder2, granite, granitemoe, jetmoe, apertus, arcee, helium, hunyuan_v1_dense, ernie4_5, bitnet, minimax, lfm2,
gpt2, gpt_neox, opt, seed_oss, llama4_text, with a PackingCollator batch (``num_items_in_batch`` included) and
``output_attentions`` / ``output_hidden_states``: the model's own forward keywords reach the attention too.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch


class Arg(NamedTuple):
    meaning: str
    varlen: str  # what packkit_varlen does
    shared_prefix: str  # what packkit_shared_prefix does


_NOT_INPUT = "not an attention input: accepted, unused"
ARGUMENTS = {
    "dropout": Arg("attention-probability dropout (config.attention_dropout in training)",
                   "0 implemented; > 0 refused: neither varlen_attn nor the CPU per-document attention has dropout",
                   "0 implemented; > 0 refused: every branch would share one dropout draw of its prefix"),
    "scaling": Arg("the score scale (None: head_dim ** -0.5)", "implemented", "implemented"),
    "is_causal": Arg("False for encoders / bidirectional layers (also read from module.is_causal)",
                     "implemented: False runs non-causal documents",
                     "True implemented; False refused: tree attention is causal"),
    "sliding_window": Arg("a query sees keys with q - k < sliding_window (also read from module.sliding_window and "
                          "config.layer_types, which some models window through the mask only; chunked layers "
                          "(attention_chunk_size) likewise, read from the layer: no effect when the chunk is at least "
                          "the longest document / path)",
                          "implemented when shorter than max_length_q: CUDA torch's window_size=(w - 1, 0) (refused on "
                          "a torch without window_size), CPU a per-document mask (q - k < w); chunks shorter than a "
                          "document: CPU a per-document chunk mask, CUDA refused; both refused for non-causal layers, "
                          "where transformers' mask and flash paths disagree by one token",
                          "implemented when >= the longest tree path (no effect); shorter refused"),
    "softcap": Arg("Gemma 2 logit soft-capping: scores -> softcap * tanh(scores / softcap) before the softmax",
                   "CPU implemented: the per-document math, exact gradient; CUDA refused: varlen_attn has no "
                   "soft-capping",
                   "implemented: dense / two-pass math, Flex score_mod"),
    "s_aux": Arg("GPT-OSS attention sinks: one logit per head joins every row's softmax, no value",
                 "CPU implemented: out * exp(lse - logaddexp(lse, sink)), with the sink's gradient; CUDA refused: "
                 "varlen_attn's LSE has no gradient",
                 "implemented: out * exp(lse - logaddexp(lse, sink)), with the sink's gradient"),
    "position_ids": Arg("the token positions the model's rotary embedding used",
                        "read only without cu_seq_lens_q: documents start where a row's positions do not go up by "
                        "one (transformers' packed-position rule); mRoPE rows refused",
                        "checked: must be the batch's own tensor (identity, no device sync); absent refused"),
    "cu_seq_lens_q": Arg("document boundaries of a flat packed batch", "implemented (required)",
                         "refused: a flat packed batch's, not a shared-prefix one"),
    "cu_seq_lens_k": Arg("key document boundaries", "implemented (default cu_seq_lens_q)",
                         "refused: a flat packed batch's, not a shared-prefix one"),
    "max_length_q": Arg("longest document (host int)", "implemented (required)",
                        "refused: a flat packed batch's, not a shared-prefix one"),
    "max_length_k": Arg("longest key document", "implemented (default max_length_q)",
                        "refused: a flat packed batch's, not a shared-prefix one"),
    "seq_idx": Arg("per-token document index of a PackingCollator batch (for recurrent layers)",
                   "not read: documents come from cu_seq_lens_q",
                   "refused: a flat packed batch's, not a shared-prefix one"),
    "shared_prefix": Arg("the SharedPrefixAttention of a pack_groups / pack_tree batch",
                         "refused: needs attn_implementation packkit_shared_prefix", "implemented (required)"),
    "use_cache": Arg("the model call's use_cache", "accepted; cached keys (key length != query length) refused",
                     "False implemented; True refused: the cache would hold every branch as one sequence"),
    "output_attentions": Arg("return attention weights", "False implemented; True refused: no weights are formed",
                             "False implemented; True refused: no weights are formed"),
    "output_hidden_states": Arg("the model call's flag", _NOT_INPUT, _NOT_INPUT),
    "output_router_logits": Arg("MoE models' flag", _NOT_INPUT, _NOT_INPUT),
    "num_items_in_batch": Arg("the loss normaliser of a PackingCollator batch", _NOT_INPUT, _NOT_INPUT),
}


def model_type(module: torch.nn.Module) -> str:
    config = getattr(module, "config", None)
    return str(getattr(config, "model_type", None) or type(module).__name__)


def layer_limits(module: torch.nn.Module, sliding_window):
    """``(window, chunk)`` of this attention layer as transformers' own masks apply them. Some models pass no
    ``sliding_window`` keyword and window their layers only through the mask transformers builds (Qwen2-MoE:
    ``module.sliding_window``; any ``config.layer_types`` "sliding_attention"), and chunked layers (Llama 4,
    ``attention_chunk_size``) only ever through the mask; a registered attention gets no mask, so read them here."""
    config = getattr(module, "config", None)
    types, idx = getattr(config, "layer_types", None), getattr(module, "layer_idx", None)
    layer_type = types[idx] if isinstance(idx, int) and types is not None and 0 <= idx < len(types) else None

    def as_int(x):  # None, 0, bools: no limit
        return x if type(x) is int and x > 0 else None

    candidates = (sliding_window, getattr(module, "sliding_window", None),
                  getattr(config, "sliding_window", None) if layer_type == "sliding_attention" else None)
    window = next((w for w in map(as_int, candidates) if w is not None), None)
    chunk = as_int(getattr(config, "attention_chunk_size", None)) if layer_type == "chunked_attention" else None
    return window, chunk


def refusal(function: str, module: torch.nn.Module, feature: str, why: str) -> ValueError:
    """The error every refusal raises: the attention function, the model type, the feature and why."""
    return ValueError(f"{function} on model type {model_type(module)!r}: {feature} is refused: {why}")


def refuse_unknown(function: str, module: torch.nn.Module, unknown: dict) -> None:
    """An argument outside :data:`ARGUMENTS` is one packkit has not checked it can honour: refuse it by name."""
    if unknown:
        names = ", ".join(sorted(unknown))
        raise refusal(function, module, f"the argument(s) {names}",
                      "packkit neither implements nor knows them, and dropping one could change the result; known: "
                      + ", ".join(sorted(ARGUMENTS)))


def check_numbers(function: str, module: torch.nn.Module, *, scaling=None, softcap=None, sliding_window=None,
                  dropout=0.0, max_lengths=()) -> None:
    """The numeric keyword arguments, refused by name unless they are numbers of the kind meant: a bool is not a
    soft-cap (``softcap=True`` ran as a cap of 1.0), a scale or cap must be finite and > 0, a window an int >= 0
    (None or 0: no window). O(1); tensors are not read."""
    for name, what, value in (("scaling", "scale", scaling), ("softcap", "soft-cap", softcap)):
        if value is None:
            continue
        if isinstance(value, torch.Tensor):  # a model's tensor scale: its metadata only (no device sync)
            if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
                raise refusal(function, module, f"{name} of shape {tuple(value.shape)} and dtype {value.dtype}",
                              f"a {what} is one real number")
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value > 0):
            raise refusal(function, module, f"{name}={value!r}", f"a {what} must be a number > 0 and finite (or None; "
                          f"not a bool)")
    if isinstance(dropout, bool) or not isinstance(dropout, (numbers.Real, torch.Tensor)) or (
            isinstance(dropout, torch.Tensor) and dropout.numel() != 1):
        raise refusal(function, module, f"dropout={dropout!r}", "a dropout probability is a number")
    for name, value in max_lengths:
        if isinstance(value, torch.Tensor):  # metadata only (no device sync)
            if value.numel() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
                raise refusal(function, module, f"{name} of shape {tuple(value.shape)} and dtype {value.dtype}",
                              "it is the batch's longest document, one int")
        elif value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0):
            raise refusal(function, module, f"{name}={value!r}", "it is the batch's longest document, an int >= 0")
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(
            sliding_window, numbers.Integral) or sliding_window < 0):
        raise refusal(function, module, f"sliding_window={sliding_window!r}", "a window is an int >= 0 (or None)")


def mask_guard(function: str):
    """A transformers mask function (``AttentionMaskInterface``) for ``function``: transformers builds no mask for an
    attention it does not know and passes the attention ``None`` even when the model was called with an
    ``attention_mask``; registered under the same name, this sees the user's mask and refuses it (it builds none).
    transformers then also runs its packed-position detection (one small device sync per mask type and forward)."""
    def guard(*args, attention_mask=None, config=None, **kwargs):
        if attention_mask is not None:
            kind = getattr(config, "model_type", None) or "this model"
            raise ValueError(f"{function} on model type {kind!r}: the model was called with an attention_mask, which "
                             "transformers does not pass to this attention (it would be silently ignored); refused: "
                             "a packkit batch carries its own document / tree structure, so call the model without "
                             "attention_mask")
        return None
    return guard


def register(name: str, function) -> str:
    """Register ``function`` and its mask guard with transformers under ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, mask_guard(name))
    return name
