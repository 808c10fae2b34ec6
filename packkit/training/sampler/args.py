"""Argument conversion shared by the sampler's modules."""
from __future__ import annotations

import hashlib
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


def cost_tag(cost, probe: np.ndarray) -> str:
    """The cost model as a string for a state's fingerprint. A callable is named by a digest of its costs on
    ``probe`` (the sampler's distinct lengths): two lambdas share a ``__qualname__`` but not their values."""
    if isinstance(cost, str):
        return cost
    if isinstance(cost, (tuple, list)):
        return f"({float(cost[0])!r}, {float(cost[1])!r})"
    values = np.ascontiguousarray(np.asarray(cost(probe.astype(np.int64)), dtype=np.float64))
    digest = hashlib.blake2b(values.tobytes(), digest_size=16).hexdigest()
    return f"callable:{getattr(cost, '__qualname__', type(cost).__name__)}:{digest}"
