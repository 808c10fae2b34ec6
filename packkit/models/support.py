"""``packkit.packing_support(model_or_config)``: per packing path, whether a model packs exactly, needs
``prepare_model`` first, or is refused (and why). It changes nothing."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from .kernels import SPECS, check_spec, hub_kernels
from .verdicts import FLEX_LAYER_TYPES, MIXERS, PATHS, REFUSED, STAND_INS_VERIFIED, VERIFIED

EXACT, PREPARE, REFUSE, UNVERIFIED = "exact", "exact after prepare_model", "refused", "unverified"


@dataclass(frozen=True)
class Verdict:
    status: str  # "exact", "exact after prepare_model", "refused" or "unverified"
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.status != REFUSE


class SupportTable(dict):
    """``{path: Verdict}`` for one model type (``.model_type``); ``str()`` is a small table."""

    def __init__(self, model_type: str, verdicts: dict):
        super().__init__(verdicts)
        self.model_type = model_type

    def __str__(self) -> str:
        lines = [f"packkit packing support for model type {self.model_type!r}:"]
        lines += [f"  {path:16s} {v.status}{': ' + v.why if v.why else ''}" for path, v in self.items()]
        return "\n".join(lines)


def _config(model_or_config):
    config = getattr(model_or_config, "config", model_or_config)
    if not hasattr(config, "model_type"):
        raise TypeError(f"packing_support expects a transformers model or config, got {type(model_or_config).__name__}")
    return config


def model_type_of(model_or_config) -> str:
    """The model type verdicts are kept under: the text model's for a multimodal wrapper found in the tables."""
    config = _config(model_or_config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for candidate in (getattr(text, "model_type", None), config.model_type):
        if candidate in REFUSED or candidate in MIXERS or candidate in VERIFIED:
            return candidate
    return str(config.model_type)


def modeling_modules(model_or_config) -> list:
    """The modeling modules whose functions the model's layers call (a model's own; a config's by its type)."""
    import torch

    if isinstance(model_or_config, torch.nn.Module):
        names = sorted({type(m).__module__ for m in model_or_config.modules()
                        if type(m).__module__.startswith("transformers.models.")})
        return [importlib.import_module(n) for n in names]
    config = _config(model_or_config)
    found = []
    for cfg in {id(c): c for c in (config, config.get_text_config())}.values():
        name = type(cfg).__module__.replace(".configuration_", ".modeling_")
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            continue
    return found


def _layer_types(config) -> list:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    return list(types) if isinstance(types, (list, tuple)) else []


@dataclass
class Analysis:
    model_type: str
    kernels: list  # HubKernel: boundary kernels of the model's modules
    mixers: tuple  # mixer class names run per document (MIXERS)
    problems: list  # why a stand-in cannot be installed

    @property
    def recurrent(self) -> bool:
        return bool(self.mixers) or any(k.name in SPECS for k in self.kernels) or self.model_type in (
            STAND_INS_VERIFIED) or self.model_type in (
            "rwkv", "xlstm", "recurrent_gemma", "minimax", "zaya")

    @property
    def stand_ins(self) -> bool:
        return bool(self.mixers) or any((not k.real or k.devices is not None) and k.name in SPECS for k in self.kernels)


def analyse(model_or_config) -> Analysis:
    model_type = model_type_of(model_or_config)
    kernels = [k for module in modeling_modules(model_or_config) for k in hub_kernels(module)]
    problems = [p for p in map(check_spec, kernels) if p]
    if model_type in STAND_INS_VERIFIED and not kernels and not MIXERS.get(model_type):
        # a family known to need stand-ins where none was found: a transformers version whose decorator packkit
        # does not recognise; refused by name, never packed through an unpatched layer
        import transformers
        problems.append(f"model type {model_type!r} runs recurrent kernels, but packkit found none of transformers' "
                        f"hub-kernel functions in its modules (transformers {transformers.__version__}): no "
                        "per-document stand-in can be installed")
    return Analysis(model_type, kernels, MIXERS.get(model_type, ()), problems)


GPU_ONLY = "not run by packkit's CPU model zoo: transformers' flash-attention kernels need a GPU"


def _verdict(info: Analysis, config, path: str) -> Verdict:
    verdict = _path_verdict(info, config, path)
    if path == "flash_attention" and verdict.ok:
        return Verdict(verdict.status, "; ".join(filter(None, (verdict.why, GPU_ONLY))))
    return verdict


def _path_verdict(info: Analysis, config, path: str) -> Verdict:
    refused = REFUSED.get(info.model_type, {})
    if path in refused:
        return Verdict(REFUSE, refused[path])
    if info.recurrent:
        if path == "shared_prefix":
            return Verdict(REFUSE, "its recurrent / linear-attention layers would carry their state from one branch "
                                   "of a shared-prefix tree into the next")
        if path == "flex_attention":
            other = sorted({t for t in _layer_types(config) if t not in FLEX_LAYER_TYPES})
            return Verdict(REFUSE, "the flex path's BlockMask covers attention layers only" + (
                f"; layer type(s) {', '.join(other)} have none" if other else "") + ": use sdpa or packkit_varlen")
        if info.problems:
            return Verdict(REFUSE, info.problems[0])
        if info.stand_ins and info.model_type not in STAND_INS_VERIFIED:
            return Verdict(UNVERIFIED, "packkit runs its recurrent layers once per document, but its model zoo has "
                                       f"not checked model type {info.model_type!r}")
        if info.stand_ins:
            return Verdict(PREPARE, "packkit runs its recurrent layers once per document where the kernel package "
                                    "does not (not installed here, or not for the inputs' device)")
        return Verdict(EXACT, "the kernel packages' functions keep the documents apart (cu_seqlens / seq_idx)")
    if info.model_type in VERIFIED:
        return Verdict(EXACT)
    return Verdict(UNVERIFIED, f"model type {info.model_type!r} is not in packkit's model zoo or survey")


def packing_support(model_or_config, path: Optional[str] = None):
    """Per packing path (``packkit.models.verdicts.PATHS``), the :class:`Verdict` for this model or config: exact,
    exact after :func:`packkit.prepare_model`, refused (with why) or unverified. With ``path``: that path's verdict.
    Changes nothing."""
    config = _config(model_or_config)
    info = analyse(model_or_config)
    if path is not None:
        if path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
        return _verdict(info, config, path)
    return SupportTable(info.model_type, {p: _verdict(info, config, p) for p in PATHS})


FLAT_ROW_KERNELS = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda", "fused_recurrent_kda")


def check_batch_layout(model_config, layout: str, block_mask: bool, context_parallel: bool) -> None:
    """Refuse (ValueError naming the model type, the layout and why) a collator layout the model cannot take
    exactly: ``PackingCollator(model_config=...)`` calls it once, at construction."""
    info = analyse(model_config)

    def refuse(what: str, why: str):
        raise ValueError(f"PackingCollator(model_config=...): model type {info.model_type!r} cannot take {what}: {why}")

    if block_mask:
        verdict = _verdict(info, _config(model_config), "flex_attention")
        if not verdict.ok:
            refuse("return_block_mask=True (the flex_attention path)", verdict.why)
    if context_parallel and info.recurrent:
        refuse("context_parallel", "its recurrent / linear-attention layers would need each document's state carried "
                                   "from one context-parallel rank's shard to the next")
    if layout == "padded" and any(k.name in FLAT_ROW_KERNELS for k in info.kernels):
        refuse("layout='padded'", "its linear-attention kernels (flash-linear-attention) take cu_seqlens for one flat "
                                  "row only (batch size 1); use layout='flat'")
