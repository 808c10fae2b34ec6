"""``packkit.transformer_cost``: the ``(a, b)`` cost model of a decoder-only transformer.

A packed row's training time is, to first order, its FLOPs. For one document of ``l`` tokens a
decoder layer stack costs ``a * l + b * l**2``; a row's cost is the sum over its documents (with
document masking, tokens never attend across documents). Pass the pair as ``cost=`` to
:func:`packkit.plan`, :class:`packkit.PackedBatchSampler` or ``packkit.pack_dataset``.

Derivation (multiply-add = 2 FLOPs; forward + backward = 3 x forward, the usual MFU convention:
the backward pass does two matmuls per forward matmul, one for the input gradient and one for the
weight gradient):

* **Linear part, per token.** Each token goes through every weight matrix once. With hidden size
  ``h``, ``n_q`` query heads and ``n_kv`` key/value heads of size ``d``, intermediate size ``f`` and
  ``L`` layers, the matmul weights per layer are ``h*n_q*d`` (Q) + ``2*h*n_kv*d`` (K, V) +
  ``n_q*d*h`` (O) + ``3*h*f`` (gated MLP: gate, up, down; ``2*h*f`` without a gate), plus the LM head
  ``h*V`` once. Forward = ``2 * P`` FLOPs per token for ``P`` such weights; ``a_linear = 6 * P``.
  Embedding lookups, norms, activations and rotary embeddings are not matmuls and are left out
  (a few percent at most).
* **Attention, per token pair.** A query attends to a key in each of ``n_q`` heads with a
  ``d``-long dot product (Q K^T) and a ``d``-long weighted sum (P V): ``4 * n_q * d`` FLOPs per pair
  per layer forward, ``12 * n_q * d * L`` forward + backward. Causal attention inside one document
  of ``l`` tokens has ``l * (l + 1) / 2`` pairs (the diagonal included), so attention costs
  ``6 * n_q * d * L * (l**2 + l)``: ``b = 6 * n_q * d * L`` and the diagonal adds ``b`` to ``a``.

So ``a = 6 * P + 6 * n_q * d * L`` and ``b = 6 * n_q * d * L``. The ratio ``a / b`` is the document
length at which attention and the linear layers cost the same (about 57,000 tokens for
Llama-3-8B, 38,000 for Llama-3.2-1B): below that, tokens dominate the cost.
Kernels that compute whole masked tiles do a bit more attention work than this count; flash-attn's
backward recomputes ``Q K^T`` (2.5 x forward for attention instead of 2 x). Both change ``b`` by a
constant factor, which matters less for balance than the shape ``a * l + b * l**2`` itself.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping

_FIELDS = {  # keyword -> transformers config attribute
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "intermediate_size": "intermediate_size",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "vocab_size": "vocab_size",
    "head_dim": "head_dim",
}
_REQUIRED = ("hidden_size", "num_layers", "intermediate_size", "num_heads", "vocab_size")


def _read_config(config) -> dict:
    """The fields of a transformers config (object or dict); multimodal configs use their text part."""
    if not isinstance(config, Mapping):
        text = getattr(config, "text_config", None) if not (
            hasattr(config, "hidden_size") and hasattr(config, "num_hidden_layers")) else None
        if text is not None:
            config = text
        get = lambda name: getattr(config, name, None)  # noqa: E731
    else:
        if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
            config = config["text_config"]
        get = config.get
    return {key: get(attr) for key, attr in _FIELDS.items() if get(attr) is not None}


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


def _has_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


def transformer_cost(config=None, *, hidden_size=None, num_layers=None, intermediate_size=None, num_heads=None,
                     num_kv_heads=None, vocab_size=None, head_dim=None, gated_mlp: bool = True,
                     include_lm_head: bool = True):
    """``(a, b)``: training FLOPs of one document of ``l`` tokens are ``a * l + b * l**2`` (or a per-document
    cost callable for architectures no pair describes: below).

    Args:
        config: a transformers ``PretrainedConfig`` (or its ``to_dict()``), e.g. ``LlamaConfig``;
            read: ``hidden_size, num_hidden_layers, intermediate_size, num_attention_heads,
            num_key_value_heads`` (default: ``num_attention_heads``), ``vocab_size``, ``head_dim``
            (default: ``hidden_size // num_attention_heads``). A multimodal config's
            ``text_config`` is used when the top level has no ``hidden_size``.
        hidden_size, num_layers, intermediate_size, num_heads, num_kv_heads, vocab_size, head_dim:
            the same figures given directly; they override the config's.
        gated_mlp: three MLP matrices (gate, up, down: Llama, Mistral, Qwen, Gemma) or two.
        include_lm_head: count the output projection (``hidden_size x vocab_size``).

    The derivation is in this module's docstring. Raises TypeError/ValueError naming a missing or
    invalid figure.

    With a config (and transformers installed) the model itself is counted, built on the ``meta`` device
    (``packkit.planning.arch_cost``): MoE layers at their active experts, MLA at its query/key and value head
    sizes, every matmul weight the architecture has. The result is ``(a, b)`` when every layer is full causal
    attention, else a :class:`~packkit.planning.arch_cost.DocumentCost` (sliding-window, chunked,
    linear-attention / state-space layers: no single quadratic), a callable to pass as ``cost=`` the same way.
    """
    given = {"hidden_size": hidden_size, "num_layers": num_layers, "intermediate_size": intermediate_size,
             "num_heads": num_heads, "num_kv_heads": num_kv_heads, "vocab_size": vocab_size, "head_dim": head_dim}
    for flag, name in ((gated_mlp, "gated_mlp"), (include_lm_head, "include_lm_head")):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
    if config is not None and _has_transformers():
        if not gated_mlp:
            raise ValueError("gated_mlp applies to the keyword form; with a config the model's own MLP is counted")
        overrides = {_FIELDS[k]: _positive_int(v, k) for k, v in given.items() if v is not None}
        from .arch_cost import architecture_cost

        return architecture_cost(config, overrides, include_lm_head)
    fields = _read_config(config) if config is not None else {}
    fields.update({k: v for k, v in given.items() if v is not None})
    missing = [k for k in _REQUIRED if k not in fields]
    if missing:
        raise ValueError(f"transformer_cost needs {', '.join(missing)} (from config= or as keywords)")
    h = _positive_int(fields["hidden_size"], "hidden_size")
    layers = _positive_int(fields["num_layers"], "num_layers")
    f = _positive_int(fields["intermediate_size"], "intermediate_size")
    n_q = _positive_int(fields["num_heads"], "num_heads")
    n_kv = _positive_int(fields.get("num_kv_heads", n_q), "num_kv_heads")
    vocab = _positive_int(fields["vocab_size"], "vocab_size")
    if "head_dim" in fields:
        d = _positive_int(fields["head_dim"], "head_dim")
    elif h % n_q:
        raise ValueError(f"hidden_size {h} is not a multiple of num_heads {n_q}; pass head_dim")
    else:
        d = h // n_q
    if n_q % n_kv:
        raise ValueError(f"num_heads {n_q} must be a multiple of num_kv_heads {n_kv}")

    per_layer = h * n_q * d + 2 * h * n_kv * d + n_q * d * h + (3 if gated_mlp else 2) * h * f
    weights = layers * per_layer + (h * vocab if include_lm_head else 0)
    b = 6.0 * n_q * d * layers
    a = 6.0 * weights + b
    return a, b
