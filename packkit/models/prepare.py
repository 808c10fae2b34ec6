"""``packkit.prepare_model(model)`` / ``packkit.unprepare_model(model)``: make a model ready for packed batches, or
refuse it by name; and undo it.

What it installs (everything is validated before anything is patched, so a refused model is never half-patched):

- the per-document stand-ins of transformers' recurrent-layer kernel functions (``packkit.models.kernels``), where
  the kernel package is not installed: module-level names of the modeling module, shared by every model of that
  module, counted so that the last ``unprepare_model`` restores them;
- for Mamba-1 families (Mamba, FalconMamba, Jamba), whose layers get no document boundaries from transformers, a
  per-document forward on each mixer (``packkit.models.mixers``);
- a forward pre-hook on the model that reads each call's boundaries (for the mixers) and refuses a packed call
  whose recurrent layers would not see them (restarting ``position_ids`` without ``cu_seq_lens_q`` / ``seq_idx``).

``mixer="masked"`` (Mamba-2 and Bamba, ``packkit.models.masked_mixers``) installs instead a mixer that keeps the documents
apart by masking on the device (no host read: a ``torch.compile(fullgraph=True)`` step holds).
"""
from __future__ import annotations

import copy
import sys
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch

from .documents import spans_from_position_ids
from .kernels import SPECS, stand_in
from .masked_mixers import MASKED_MIXERS, check_masked_mixer, install_masked_mixer
from .mixers import install_mixer, remove_mixer
from .support import PREPARE, REFUSE, UNVERIFIED, analyse, packing_support
from .verdicts import PATHS, attention_path

ATTR = "_packkit_prepared"
MIXER_KINDS = ("per_document", "masked")
_INSTALLED = {}  # (module name, attr) -> [original, stand-in, count]


@dataclass
class Prepared:
    path: str
    model_type: str
    mixer: str = "per_document"
    kernels: list = field(default_factory=list)  # (module name, attr) keys of _INSTALLED this model counts in
    mixers: list = field(default_factory=list)
    hook: Optional[object] = None
    boundaries: dict = field(default_factory=dict)  # the last call's cu_seq_lens_q / seq_idx / position_ids

    def __deepcopy__(self, memo):
        """A deepcopy of a prepared model (a reference or EMA model) is prepared too: its mixers and hook are its
        own, and it counts in the module-level stand-ins it runs, so unpreparing one copy keeps them for the rest."""
        copied = Prepared(self.path, self.model_type, self.mixer, list(self.kernels))
        memo[id(self)] = copied  # before the mixers: each refers back to this state
        copied.mixers = [copy.deepcopy(m, memo) for m in self.mixers]
        copied.hook = copy.deepcopy(self.hook, memo)
        for key in copied.kernels:
            if key in _INSTALLED:
                _INSTALLED[key][2] += 1
        return copied


def _refuse(model_type: str, path: str, why: str) -> ValueError:
    return ValueError(f"packkit.prepare_model: model type {model_type!r} cannot be packed exactly on the {path!r} "
                      f"path: {why}")


def _pre_hook(recurrent: bool):
    def hook(module, args, kwargs):
        state = getattr(module, ATTR)  # the model's own (a deepcopy's hook is this function, its state a copy)
        bounds = {k: kwargs.get(k) for k in ("cu_seq_lens_q", "seq_idx", "position_ids")}
        state.boundaries = bounds
        if recurrent and bounds["cu_seq_lens_q"] is None and bounds["seq_idx"] is None and \
                isinstance(bounds["position_ids"], torch.Tensor):
            ids = kwargs.get("input_ids", args[0] if args else None)
            embeds = kwargs.get("inputs_embeds")
            shape = (ids if isinstance(ids, torch.Tensor) else embeds).shape[:2]
            if spans_from_position_ids(bounds["position_ids"], shape[0], shape[1], "prepare_model") is not None:
                raise ValueError(f"packkit: model type {state.model_type!r} was called with packed position_ids but "
                                 "without cu_seq_lens_q / seq_idx: its recurrent layers would run across the documents; "
                                 "pass the whole packkit batch (PackingCollator returns both)")
    return hook


def prepare_model(model: torch.nn.Module, path: Optional[str] = None, mixer: str = "per_document") -> torch.nn.Module:
    """Ready ``model`` (a transformers model) for packed batches on ``path`` (default: the path of its
    ``config._attn_implementation``; one of ``packkit.models.verdicts.PATHS``) and return it, or raise ValueError
    naming the model type, the path and why it cannot be exact. Idempotent; :func:`unprepare_model` undoes it.

    ``mixer``: ``"per_document"`` (default: recurrent mixers run once per document, boundaries read on the host) or
    ``"masked"`` (Mamba-2 and Bamba: the documents kept apart by masks on the device, no host read, so a
    ``torch.compile(fullgraph=True)`` step holds; O(length^2) per row, for short rows)."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"prepare_model expects a transformers model (torch.nn.Module with .config), got "
                        f"{type(model).__name__}")
    if mixer not in MIXER_KINDS:
        raise ValueError(f"prepare_model: mixer must be one of {', '.join(MIXER_KINDS)}, got {mixer!r}")
    if path is None:
        path = attention_path(getattr(model.config, "_attn_implementation", None))
    elif path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    info = analyse(model)
    verdict = packing_support(model, path)
    if verdict.status == REFUSE:
        raise _refuse(info.model_type, path, verdict.why)
    if mixer == "masked" and info.model_type not in MASKED_MIXERS:
        raise _refuse(info.model_type, path, f"mixer='masked' exists for model type(s) {', '.join(MASKED_MIXERS)} "
                                             "only (use the default mixer='per_document')")
    state = getattr(model, ATTR, None)
    if state is not None:  # prepared already: the patches do not depend on the path
        if state.mixer != mixer:
            raise ValueError(f"prepare_model: the model is prepared with mixer={state.mixer!r}; call "
                             f"packkit.unprepare_model(model) before preparing it with mixer={mixer!r}")
        state.path = path
        return model
    if verdict.status == UNVERIFIED:
        warnings.warn(f"packkit.prepare_model: {verdict.why}; packed results are not checked against per-sample for it",
                      stacklevel=2)
    # Plan everything first: a model is patched completely or not at all.
    kernels = []
    if (verdict.status == PREPARE or info.kernels) and not info.mixers:  # a mixer runs its layer per document whole
        for kernel in info.kernels:
            replacement = stand_in(kernel)
            if replacement is not None:
                kernels.append((kernel, replacement))
    mixer_modules = [m for m in model.modules() if type(m).__name__ in info.mixers]
    if info.mixers and not mixer_modules:
        raise _refuse(info.model_type, path, f"none of its modules is a {' / '.join(info.mixers)}")
    if mixer == "masked":
        mixer_modules = [m for m in model.modules() if type(m).__name__ in MASKED_MIXERS[info.model_type]]
        why = next(filter(None, map(check_masked_mixer, mixer_modules)), None) if mixer_modules else (
            f"none of its modules is a {' / '.join(MASKED_MIXERS[info.model_type])}")
        if why is not None:
            raise _refuse(info.model_type, path, why)
    state = Prepared(path, info.model_type, mixer)
    for kernel, replacement in kernels:
        key = (kernel.module.__name__, kernel.attr)
        entry = _INSTALLED.get(key)
        if entry is None or getattr(kernel.module, kernel.attr) is not entry[1]:
            _INSTALLED[key] = entry = [getattr(kernel.module, kernel.attr), replacement, 0]
            setattr(kernel.module, kernel.attr, replacement)
        entry[2] += 1
        state.kernels.append(key)  # names, not modules: a prepared model stays deep-copyable
    for module in mixer_modules:
        (install_masked_mixer if mixer == "masked" else install_mixer)(module, state)
        state.mixers.append(module)
    # Kernel families read the boundaries from the call's keywords; the mixers (masked ones too) also from
    # position_ids, so only kernel families refuse packed position_ids alone.
    kernel_bounds = not info.mixers and mixer != "masked" and any(k.name in SPECS for k in info.kernels)
    if info.recurrent:
        state.hook = model.register_forward_pre_hook(_pre_hook(kernel_bounds), with_kwargs=True)
    setattr(model, ATTR, state)
    return model


def prepare_trainer_model(trainer) -> None:
    """:func:`prepare_model` on ``trainer.model`` when the trainer holds one (the trainer integrations' one call)."""
    model = getattr(trainer, "model", None)
    if model is not None:
        prepare_model(model)


def unprepare_model(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`prepare_model` on ``model`` (nothing to do when it is not prepared); returns it. A module-level
    stand-in is restored when the last model that uses it is unprepared (and only if nobody replaced it since)."""
    state = getattr(model, ATTR, None)
    if state is None:
        return model
    if state.hook is not None:
        state.hook.remove()
    for module in state.mixers:
        remove_mixer(module)
    for name, attr in state.kernels:
        entry = _INSTALLED.get((name, attr))
        if entry is None:
            continue
        entry[2] -= 1
        if entry[2] <= 0:
            module = sys.modules.get(name)
            if module is not None and getattr(module, attr) is entry[1]:
                setattr(module, attr, entry[0])
            del _INSTALLED[(name, attr)]
    delattr(model, ATTR)
    return model


def prepared_path(model) -> Optional[str]:
    """The path ``model`` was prepared for, or None."""
    state = getattr(model, ATTR, None)
    return None if state is None else state.path
