"""Inputs shaped by transformers, read the same way by the cost models and the multimodal packing: a model config
given as a dict (``config.to_dict()``), and ``[num, 3]`` image / video grids (``image_grid_thw``)."""
from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np


def config_from_mapping(config):
    """``config`` itself, or the transformers config a dict describes (it must carry its ``model_type``)."""
    if not isinstance(config, Mapping):
        return config
    import transformers

    values = dict(config)
    if "model_type" not in values:
        raise ValueError("a config dict needs its model_type (config.to_dict() has it)")
    return transformers.AutoConfig.for_model(values.pop("model_type"), **values)


def as_grids(value, label: str) -> np.ndarray:
    """``[k, 3]`` int64 (t, h, w) grids from a tensor, array or nested list (``None`` or empty: none); ValueError
    starting with ``label`` for any other shape, a float dtype or a value < 1."""
    if value is None:
        return np.zeros((0, 3), np.int64)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    grids = np.asarray(value)
    if grids.size == 0:
        return np.zeros((0, 3), np.int64)
    if grids.ndim == 1 and grids.shape[0] == 3:
        grids = grids[None]
    if grids.ndim != 2 or grids.shape[1] != 3 or grids.dtype.kind not in "iu" or (grids < 1).any():
        raise ValueError(f"{label} must be [num, 3] positive integer (t, h, w) grids, got shape {grids.shape} "
                         f"dtype {grids.dtype}")
    return grids.astype(np.int64, copy=False)
