"""``SharedPrefixCollator``: a DataLoader ``collate_fn`` for preference and group data in TRL's format.

DPO (TRL's tokenized preference columns ``prompt_ids``, ``chosen_ids``, ``rejected_ids``) packs each pair as a
group of two completions, chosen first, so :func:`packkit.shared_prefix.dpo_logps` returns ``(chosen, rejected)``;
with ``completions_key`` (e.g. ``"completion_ids"``: a list of completions per example) any group size works.
A field the collator does not know is an error, not a silent drop (name it in ``ignore_keys`` to drop it).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .pack import pack_groups

DPO_KEYS = ("chosen_ids", "rejected_ids")


class SharedPrefixCollator:
    def __init__(self, capacity: Optional[int] = None, *, prompt_key: str = "prompt_ids",
                 completion_keys: Sequence[str] = DPO_KEYS, completions_key: Optional[str] = None,
                 ignore_keys: Sequence[str] = (), device=None, attention: str = "auto", overlong: str = "error"):
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
        if not features:
            raise ValueError("SharedPrefixCollator got an empty list of examples")
        prompts, completions = [], []
        for i, f in enumerate(features):
            if not isinstance(f, dict):
                raise TypeError(f"example {i} is a {type(f).__name__}; expected a dict with {sorted(self._known)}")
            unknown = set(f) - self._known - self.ignore_keys
            if unknown:
                raise ValueError(f"example {i} has fields {sorted(unknown)} the shared-prefix collator does not pack; "
                                 f"it packs {sorted(self._known)} (pass ignore_keys=[...] to drop others)")
            missing = self._known - set(f)
            if missing:
                raise ValueError(f"example {i} lacks {sorted(missing)}")
            prompts.append(_ids(f[self.prompt_key]))
            if self.completions_key:
                completions.append([_ids(c) for c in f[self.completions_key]])
            else:
                completions.append([_ids(f[k]) for k in self.completion_keys])
        return pack_groups(prompts, completions, capacity=self.capacity, device=self.device, attention=self.attention,
                           overlong=self.overlong)


def _ids(value):
    return value.tolist() if isinstance(value, torch.Tensor) else value


def dpo_loss(chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, *,
             beta: float = 0.1) -> torch.Tensor:
    """DPO's sigmoid loss (TRL's default ``loss_type="sigmoid"``, no label smoothing), mean over pairs."""
    logits = beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
    return -torch.nn.functional.logsigmoid(logits).mean()
