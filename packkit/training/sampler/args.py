"""Argument conversion shared by the sampler's modules."""
from __future__ import annotations

import numbers

import numpy as np
import torch


def int_arg(value, name: str) -> int:
    """A Python int from an int-like (numpy ints, 0-d integer tensors); bools and floats are refused."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point() \
            and value.dtype != torch.bool:
        value = int(value.item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def cost_tag(cost) -> str:
    if isinstance(cost, str):
        return cost
    if isinstance(cost, (tuple, list)):
        return f"({float(cost[0])!r}, {float(cost[1])!r})"
    return f"callable:{getattr(cost, '__module__', '?')}.{getattr(cost, '__qualname__', type(cost).__name__)}"
