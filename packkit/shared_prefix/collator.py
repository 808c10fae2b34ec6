"""``SharedPrefixCollator``: a DataLoader ``collate_fn`` for preference and group data in TRL's format.

DPO (TRL's tokenized preference columns ``prompt_ids``, ``chosen_ids``, ``rejected_ids``) packs each pair as a
group of two completions, chosen first, so :func:`packkit.shared_prefix.dpo_logps` returns ``(chosen, rejected)``;
with ``completions_key`` (e.g. ``"completion_ids"``: a list of completions per example) any group size works.
A field the collator does not know is an error, not a silent drop (name it in ``ignore_keys`` to drop it).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .attention_meta import ATTENTION_PATHS
from .checks import check_choice, check_device, check_overlong, check_real
from .pack import pack_groups
from ..planning.planner import _as_count

DPO_KEYS = ("chosen_ids", "rejected_ids")


class SharedPrefixCollator:
    def __init__(self, capacity: Optional[int] = None, *, prompt_key: str = "prompt_ids",
                 completion_keys: Sequence[str] = DPO_KEYS, completions_key: Optional[str] = None,
                 ignore_keys: Sequence[str] = (), device=None, attention: str = "auto", overlong: str = "error"):
        # Checked here, at construction, with the messages pack_groups gives (not at the first batch).
        capacity = None if capacity is None else _as_count(capacity, "capacity")
        check_choice(attention, "attention", ATTENTION_PATHS)
        check_overlong(overlong)
        check_device(device)
        _key(prompt_key, "prompt_key")
        if completions_key is not None:
            _key(completions_key, "completions_key")
        else:
            _keys(completion_keys, "completion_keys")
            if len(completion_keys) == 0:
                raise ValueError("completion_keys must name at least one field (or pass completions_key)")
        _keys(ignore_keys, "ignore_keys")
        self.capacity = capacity
        self.prompt_key = prompt_key
        self.completion_keys = () if completions_key else tuple(completion_keys)
        self.completions_key = completions_key
        self.ignore_keys = set(ignore_keys)
        self.device = device
        self.attention = attention
        self.overlong = overlong
        self._known = {prompt_key, *self.completion_keys, *([completions_key] if completions_key else [])}

    def __call__(self, features: Sequence[dict]):
        """``(batch, info)``: call the model with ``**batch`` and score with ``completion_logprobs(logits, info)``."""
        if isinstance(features, (dict, str, bytes)) or not hasattr(features, "__iter__"):
            raise TypeError(f"SharedPrefixCollator takes a list of example dicts (a DataLoader batch), got "
                            f"{type(features).__name__}")
        features = list(features)
        if not features:
            raise ValueError("SharedPrefixCollator got an empty list of examples")
        prompts, completions = [], []
        for i, f in enumerate(features):
            if not isinstance(f, dict):
                raise TypeError(f"example {i} is a {type(f).__name__}; expected a dict with {sorted(self._known)}")
            unknown = set(f) - self._known - self.ignore_keys
            if unknown:
                raise ValueError(f"example {i} has fields {sorted(unknown)} the shared-prefix collator does not pack; "
                                 f"it packs {sorted(self._known)} (the prompt_key / completion_keys / completions_key "
                                 f"given; pass ignore_keys=[...] to drop others)")
            missing = self._known - set(f)
            if missing:
                raise ValueError(f"example {i} lacks {sorted(missing)} (the prompt_key / completion_keys / "
                                 f"completions_key given)")
            prompts.append(_ids(f[self.prompt_key], i, self.prompt_key))
            if self.completions_key:
                group = f[self.completions_key]
                if isinstance(group, (str, bytes, dict)) or not isinstance(group, Sequence):
                    raise TypeError(f"example {i}: {self.completions_key!r} must be a list of token sequences, got "
                                    f"{type(group).__name__}")
                completions.append([_ids(c, i, self.completions_key) for c in group])
            else:
                completions.append([_ids(f[k], i, k) for k in self.completion_keys])
        return pack_groups(prompts, completions, capacity=self.capacity, device=self.device, attention=self.attention,
                           overlong=self.overlong)


def _ids(value, example: int, key: str):
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
        raise TypeError(f"example {example}: {key!r} must be a token sequence (a list, numpy array or 1-D tensor), "
                        f"got {type(value).__name__}")
    # A CPU tensor's ints as a list; float / bool tensors stay tensors so pack_groups refuses their dtype.
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not (
            value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        return value.tolist()
    return value


def _key(value, name: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a field name (str), got {type(value).__name__} {value!r}")


def _keys(values, name: str) -> None:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, set, frozenset)):
        raise TypeError(f"{name} must be a list of field names, got {type(values).__name__} {values!r}"
                        + (" (a str would be read as its characters: wrap it in a list)" if isinstance(values, str)
                           else ""))
    for v in values:
        _key(v, f"{name} entry")


def _pair_values(value, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor [P] of summed log-probs (dpo_logps), got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {value.dtype}")
    if value.device.type == "cpu" and value.numel() and not bool(torch.isfinite(value.detach()).all()):
        raise ValueError(f"{name} holds a non-finite value (NaN or inf)")  # host values: free to check
    return value


def dpo_loss(chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, *,
             beta: float = 0.1) -> torch.Tensor:
    """DPO's sigmoid loss (TRL's default ``loss_type="sigmoid"``, no label smoothing), mean over pairs.

    All four are floating tensors of one shape ``[P]`` on one device (no broadcasting); ``beta`` a finite real
    > 0. No pairs: 0."""
    beta = check_real(beta, "beta", low=0.0, low_open=True)
    args = {"chosen": chosen, "rejected": rejected, "ref_chosen": ref_chosen, "ref_rejected": ref_rejected}
    for name, value in args.items():
        _pair_values(value, name)
    shapes = {name: tuple(v.shape) for name, v in args.items()}
    if len(set(shapes.values())) > 1 or chosen.dim() != 1:
        raise ValueError(f"chosen, rejected, ref_chosen and ref_rejected must all be [P] (one value per pair), got "
                         + ", ".join(f"{k} {list(v)}" for k, v in shapes.items()))
    devices = {name: v.device for name, v in args.items()}
    if len(set(devices.values())) > 1:
        raise ValueError("chosen, rejected, ref_chosen and ref_rejected must be on one device, got "
                         + ", ".join(f"{k} on {v}" for k, v in devices.items()))
    logits = beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
    # Mean over pairs; no pairs (an empty micro-batch) gives 0, as grpo_token_mean_loss does, never NaN.
    return -torch.nn.functional.logsigmoid(logits).sum() / max(logits.numel(), 1)
