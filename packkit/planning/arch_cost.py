"""The training FLOPs of one document, per architecture: what :func:`packkit.transformer_cost` returns for a model
config whose cost is not one dense ``a * l + b * l**2``.

Two parts, forward + backward = 3 x forward (as ``cost_model``):

* **Per token** (``linear``): every matmul weight a token goes through, counted on the model itself, built from the
  config on the ``meta`` device (no memory, no data): ``nn.Linear`` / GPT-2 ``Conv1D`` weights, convolutions
  (``weight.numel()`` multiply-adds per token: short convolutions of SSM / linear-attention layers), and routed
  experts at ``top_k / num_experts`` of their weights (each token goes through ``top_k`` of them; shared experts
  and routers in full). MLA's low-rank projections are ordinary Linears here. Plus, per recurrent layer, its
  state update in recurrent form (below). Embedding lookups, norms and activations are not matmuls (left out).
* **Per (query, key) pair** of each attention layer: ``6 * n_heads * (d_qk + d_v)`` FLOPs (``Q K^T`` and ``P V``),
  times the pairs the layer's mask lets a document of ``l`` tokens compute — full causal ``l (l + 1) / 2``, a
  sliding window ``w`` (a query sees keys less than ``w`` back, transformers' rule) ``sum_i min(i + 1, w)``, chunks
  of ``c`` (Llama 4) the full count of each chunk; linear-attention and state-space layers have none.

Recurrent layers (``mixer_cost``, added per document): Gated DeltaNet (Qwen3.5, Qwen3-Next, OLMo-hybrid:
``linear_num_value_heads``, ``linear_key_head_dim`` ``d_k``, ``linear_value_head_dim`` ``d_v``) in the chunked form
its kernels run (fla's, per ``cu_seqlens`` document, and transformers' torch fallback: chunks of ``C = 64``, the last
one computed whole), per head and padded token ``C * (2 d_k + d_v)`` multiply-adds within the chunk and
``3 d_k d_v`` through the state; Mamba 1 and 2 mixers (Mamba, FalconMamba, Jamba, Mamba2, Bamba, Granite-4 hybrid,
Nemotron-H, Falcon-H1, Zamba2), per token. Short convolutions (LFM2 ``conv`` layers) are their weights. Other
recurrent mixers (KDA, Zamba v1, RWKV, xLSTM, RG-LRU) have no validated count here: their configs raise
``ValueError`` naming the model type and why (pass a cost callable), as do a layer type this module has no count for
and a missing figure (never a silent dense count).
"""
from __future__ import annotations

import copy
import json

import numpy as np

from .hf_inputs import config_from_mapping
from .mixer_cost import HYBRID_FULL_ATTENTION, SCAN_FAMILIES, DeltaScan, refusal, unused_adapter_macs
from .mixer_cost import scans as mixer_scans

_ATTENTION = {"full_attention": "full", "attention": "full", "global": "full", "sliding_attention": "window",
              "local": "window", "chunked_attention": "chunk"}
_LINEAR_ATTENTION = {"linear_attention"}
_CONV = {"conv"}  # LFM2 short convolutions: their weights are all their cost
_NO_MIXING = {"mlp", "moe"}  # Nemotron-H layers of an MLP / MoE alone: their weights are all their cost
_TOP_K = ("num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k", "moe_top_k")
_NUM_EXPERTS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")


def _first(config, names, what: str, required: bool = True):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if required:
        raise ValueError(f"transformer_cost needs {what} ({' / '.join(names)}) of a "
                         f"{getattr(config, 'model_type', 'model')} config; it has none")
    return None


def layer_kinds(config) -> list:
    """Each decoder layer's kind and limit: ``("full", None)``, ``("window", w)``, ``("chunk", c)``,
    ``("linear_attention", None)``, ``("conv", None)``, ``("scan", None)`` (a Mamba mixer) or ``("hybrid", None)``
    (full attention beside a Mamba mixer: Falcon-H1)."""
    model_type = str(getattr(config, "model_type", "model"))
    reason = refusal(model_type)
    if reason:
        raise ValueError(f"transformer_cost has no count for {model_type}: {reason}; pass a cost callable")
    layers = int(_first(config, ("num_hidden_layers", "n_layer", "num_layers"), "the layer count"))
    types = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None)
    if not types:
        window = getattr(config, "sliding_window", None)
        sliding = window is not None and getattr(config, "use_sliding_window", True) is not False
        types = ["sliding_attention" if sliding else "full_attention"] * layers
    if len(types) != layers:
        raise ValueError(f"config.layer_types has {len(types)} entries for {layers} layers")
    kinds = []
    for t in types:
        t = str(t)
        if t in _ATTENTION:
            kind = _ATTENTION[t]
            limit = None
            if kind == "window":
                limit = _first(config, ("sliding_window",), "the sliding window")
            elif kind == "chunk":
                limit = _first(config, ("attention_chunk_size",), "the attention chunk size")
            kinds.append((kind, None if limit is None else int(limit)))
        elif t in _LINEAR_ATTENTION and model_type in SCAN_FAMILIES:
            kinds.append(("scan", None))
        elif t == "hybrid" and model_type in HYBRID_FULL_ATTENTION:
            kinds.append(("hybrid", None))
        elif t in _LINEAR_ATTENTION:
            if getattr(config, "linear_num_value_heads", None) is None:  # a Mamba / KDA mixer, not Gated DeltaNet
                raise ValueError(f"transformer_cost has no count for the linear-attention layers of {model_type} "
                                 "(a recurrent mixer other than Gated DeltaNet); pass a cost callable")
            kinds.append(("linear_attention", None))
        elif t in _CONV or t in _NO_MIXING:
            kinds.append((t if t in _CONV else "mlp", None))
        else:
            raise ValueError(f"transformer_cost has no count for layer type {t!r} ({model_type}); pass a cost callable")
    return kinds


def pairs(kind: str, limit, lengths: np.ndarray) -> np.ndarray:
    """(query, key) pairs one layer of ``kind`` computes for documents of ``lengths`` tokens (causal)."""
    l = np.asarray(lengths, dtype=np.float64)
    if kind in ("full", "hybrid"):
        return l * (l + 1) / 2
    if kind == "window":  # sum_i min(i + 1, w)
        w = float(limit)
        inside = np.minimum(l, w)
        return inside * (inside + 1) / 2 + np.maximum(l - w, 0) * w
    if kind == "chunk":
        c = float(limit)
        full, rest = np.floor(l / c), np.mod(l, c)
        return full * c * (c + 1) / 2 + rest * (rest + 1) / 2
    return np.zeros_like(l)


def _head_sizes(config) -> tuple:
    heads = int(_first(config, ("num_attention_heads", "n_head"), "the attention head count"))
    if getattr(config, "kv_lora_rank", None) is not None:  # MLA: query/key heads of nope + rope parts
        d_qk = int(_first(config, ("qk_nope_head_dim",), "the MLA no-rope head size")) + int(
            _first(config, ("qk_rope_head_dim",), "the MLA rope head size"))
        return heads, d_qk, int(_first(config, ("v_head_dim",), "the MLA value head size"))
    d = getattr(config, "head_dim", None)
    if d is None:
        d = int(_first(config, ("hidden_size", "n_embd"), "the hidden size")) // heads
    return heads, int(d), int(d)


def _delta_scan(config):
    """One Gated DeltaNet layer's chunked delta rule (module docstring)."""
    heads = int(_first(config, ("linear_num_value_heads",), "the linear-attention value heads"))
    d_k = int(_first(config, ("linear_key_head_dim",), "the linear-attention key head size"))
    d_v = int(_first(config, ("linear_value_head_dim",), "the linear-attention value head size"))
    return DeltaScan(heads, d_k, d_v)


def _build_meta(config):
    """The model of ``config`` on the meta device (its causal LM, else its base model: no LM head counted)."""
    import torch
    import transformers

    with torch.device("meta"):
        try:
            return transformers.AutoModelForCausalLM.from_config(config), True
        except ValueError:  # no causal-LM class for this (text) config: the base model
            return transformers.AutoModel.from_config(config), False


def _matmul_weights(model, top_k, num_experts, include_lm_head: bool) -> float:
    """Multiply-adds per token through ``model``'s matmul weights (module docstring): every 2-D weight outside an
    embedding (Linears, GPT-2 Conv1D, MoE routers), every convolution, and routed experts' 3-D weights."""
    import torch

    total = 0.0
    for name, module in model.named_modules():
        parts = name.split(".")
        if isinstance(module, torch.nn.Embedding) or (not include_lm_head and parts[-1] == "lm_head"):
            continue
        routed = "experts" in parts
        for pname, param in module.named_parameters(recurse=False):
            if pname == "A_log":  # a Mamba 1 state matrix: elementwise (mixer_cost), not a matmul weight
                continue
            if param.dim() == 2 or isinstance(module, torch.nn.Conv1d) and pname == "weight":
                n = float(param.numel())
            elif param.dim() == 3 and routed:  # fused experts: [E, out, in]
                if not num_experts or param.shape[0] != num_experts:
                    raise ValueError(f"{name}.{pname}: expert weights of shape {tuple(param.shape)} but the config "
                                     f"has {num_experts} experts")
                n = float(param.numel())
            else:
                continue
            total += n * top_k / num_experts if routed and num_experts else n
    return total


class DocumentCost:
    """Training FLOPs of documents: ``cost(lengths)`` -> one float64 per length (``lengths``: an int array, as the
    planners call a cost callable). ``linear`` FLOPs per token, plus each attention layer's pairs times its
    ``pair_flops``. Pass it as ``cost=`` to :func:`packkit.plan` and the samplers. Not an ``(a, b)`` pair: windowed,
    chunked and recurrent layers make the cost no single quadratic (``iter`` raises TypeError saying so)."""

    def __init__(self, model_type: str, linear: float, layers: list, scans: tuple = ()):
        self.model_type = model_type
        self.linear = float(linear)
        self.layers = [(kind, limit, float(f)) for kind, limit, f in layers]  # (kind, limit, FLOPs per pair)
        self.scans = tuple(scans)  # mixer_cost scans: each a callable, training FLOPs per document

    def attention(self, lengths) -> np.ndarray:
        out = np.zeros(np.shape(lengths), dtype=np.float64)
        for kind, limit, flops in self.layers:
            if flops:
                out += flops * pairs(kind, limit, lengths)
        return out

    def __call__(self, lengths) -> np.ndarray:
        l = np.asarray(lengths, dtype=np.float64)
        out = self.linear * l + self.attention(l)
        for scan in self.scans:
            out += scan(l)
        return out

    def __iter__(self):
        raise TypeError(f"the cost of {self.model_type} (layers: {sorted({k for k, _, _ in self.layers})}) is no "
                        "(a, b) pair; pass transformer_cost(config) itself as cost=")

    def __eq__(self, other):
        return isinstance(other, DocumentCost) and (self.model_type, self.linear, self.layers, self.scans) == (
            other.model_type, other.linear, other.layers, other.scans)

    def __hash__(self):
        return hash((self.model_type, self.linear, tuple(self.layers), self.scans))

    def __repr__(self):
        kinds = {}
        for kind, limit, _ in self.layers:
            key = kind if limit is None else f"{kind} {limit}"
            kinds[key] = kinds.get(key, 0) + 1
        scans = f"; {len(self.scans)} scans" if self.scans else ""
        return f"DocumentCost({self.model_type}: {self.linear:.4g} FLOPs/token; layers {kinds}{scans})"


def _config_key(config) -> str:
    return json.dumps(config.to_dict(), sort_keys=True, default=str)


_CACHE: dict = {}  # config JSON -> (model_type, linear, layers, scans): a meta model is built once per config


def _model_cost(config, include_lm_head: bool):
    key = (_config_key(config), include_lm_head)
    if key not in _CACHE:
        if len(_CACHE) >= 32:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _cost_of(config, include_lm_head)
    return _CACHE[key]


def _cost_of(config, include_lm_head: bool):
    kinds = layer_kinds(config)
    attends = any(k in ("full", "window", "chunk", "hybrid") for k, _ in kinds)
    heads, d_qk, d_v = _head_sizes(config) if attends else (0, 0, 0)  # Mamba configs have no attention heads
    top_k = _first(config, _TOP_K, "", False)
    num_experts = _first(config, _NUM_EXPERTS, "", False)
    if num_experts and not top_k:
        raise ValueError(f"a {config.model_type} config with {num_experts} experts needs num_experts_per_tok")
    deltas = tuple(_delta_scan(config) for k, _ in kinds if k == "linear_attention")
    model, has_head = _build_meta(config)  # after every figure is read: a missing one is named, not a crash inside
    macs = _matmul_weights(model, top_k or 1, num_experts or 0, include_lm_head)
    macs -= unused_adapter_macs(model)  # Zamba2: each layer runs one of the adapters it holds
    if include_lm_head and not has_head:
        macs += float(_first(config, ("hidden_size",), "the hidden size")) * float(config.vocab_size)
    linear = 6.0 * macs
    scans = deltas
    if config.model_type in SCAN_FAMILIES:
        scans += tuple(mixer_scans(model, config.model_type, sum(k in ("scan", "hybrid") for k, _ in kinds)))
    pair = 6.0 * heads * (d_qk + d_v)
    layers = [(k, limit, pair if k in ("full", "window", "chunk", "hybrid") else 0.0) for k, limit in kinds]
    return config.model_type, linear, layers, scans


def architecture_cost(config, overrides: dict, include_lm_head: bool):
    """``(a, b)`` when every layer is full causal attention (the dense form, exact), else a :class:`DocumentCost`."""
    config = config_from_mapping(config)
    text = getattr(config, "text_config", None)
    # A multimodal config: its text part. Checked by the layer count too, since loaders (ms-swift's) copy the text
    # part's hidden_size to the top level.
    if text is not None and (getattr(config, "hidden_size", None) is None
                             or getattr(config, "num_hidden_layers", None) is None):
        config = text
    if overrides:
        config = copy.deepcopy(config)
        for attr, value in overrides.items():
            setattr(config, attr, value)
    model_type, linear, layers, scans = _model_cost(config, include_lm_head)
    if all(kind == "full" for kind, _, _ in layers) and not scans:
        b = sum(f for _, _, f in layers) / 2
        return linear + b, b
    return DocumentCost(model_type, linear, layers, scans)
