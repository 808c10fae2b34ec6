"""Host-side tensor helpers every packing module shares: converting a user's value to a tensor, describing
it in an error message, and moving plan arrays to the device without a copy or a sync."""
from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import torch


def first_dim(value) -> Optional[int]:
    """Length of a sequence-like value along its first axis, or None for scalars / strings / dicts."""
    if isinstance(value, torch.Tensor) or isinstance(value, np.ndarray):
        return int(value.shape[0]) if value.ndim >= 1 else None
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
        return None
    return len(value)


def describe(value) -> str:
    """A short shape description for error messages."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    n = first_dim(value)
    return f"{type(value).__name__} of length {n}" if n is not None else f"{type(value).__name__} {value!r:.40}"


def to_tensor(value, name: str, index: int) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"sample {index}: field {name!r} ({describe(value)}) cannot become a tensor: {exc}") from None


def host_tensor(array: np.ndarray) -> torch.Tensor:
    """A no-copy tensor over a (read-only) plan array; the ops only ever read it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(array))


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
