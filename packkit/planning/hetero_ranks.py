"""Heterogeneous data-parallel ranks (a mixed H100 / A100 pool): ``plan(..., algorithm="ogbfd", dp_size=n,
capacity=[c_0, ..., c_{n-1}], rank_speed=[v_0, ...])``. Rank ``i``'s row at every step holds at most ``c_i``
tokens and takes ``cost / v_i``; steps are balanced in that time (C++: ``csrc/planner/hetero_steps.cpp``).
What LightBinPack's ``ohgbfd`` does, whose capacities stand in for speed."""
from __future__ import annotations

import numbers

import numpy as np

from .arg_rules import MAX_INT, Real

MAX_RANKS = 1 << 16  # one capacity / speed per rank: the bound keeps a list's size from setting the work


def is_per_rank(value) -> bool:
    """True for a capacity given per rank (a list, tuple, 1-D array or tensor) rather than one number."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return not (isinstance(value, np.ndarray) and value.ndim == 0)
    return type(value).__name__ == "Tensor" and getattr(value, "ndim", 0) == 1


def _array(value, name: str) -> np.ndarray:
    if type(value).__name__ == "Tensor":
        if value.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor: it has no values to plan with")
        value = value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)) and len(value) > MAX_RANKS:
        raise ValueError(f"{name} has {len(value)} entries; at most {MAX_RANKS} ranks are supported")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a list of numbers, one per rank: {exc}") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one entry per rank), got shape {array.shape}")
    if len(array) > MAX_RANKS:
        raise ValueError(f"{name} has {len(array)} entries; at most {MAX_RANKS} ranks are supported")
    return array


def _check_entries(values, name: str, kind: str) -> None:
    """What numpy would coerce silently in a per-rank list, refused by name (the declared rules, arg_rules): a bool
    anywhere (``[True, 10]`` is not ``[1, 10]``), an int beyond int64 (capacity) or float64 (rank_speed). The
    array checks after this name the rest (floats in capacity, <= 0, NaN, strings) as before."""
    if len(values) > MAX_RANKS:
        raise ValueError(f"{name} has {len(values)} entries; at most {MAX_RANKS} ranks are supported")
    what = "integers (tokens per row)" if kind == "int" else "real numbers (relative throughput)"
    for r, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name} per rank must hold {what}, not bools; rank {r} has {v!r}")
        if isinstance(v, numbers.Integral):
            if kind == "int" and not -MAX_INT - 1 <= int(v) <= MAX_INT:
                raise ValueError(f"{name} entries must be < 2**63 (int64); rank {r} has {int(v)}")
            if kind == "real":
                Real(f"{name}[{r}]").check(v)  # 10**400: beyond float64, named


def rank_capacities(capacity, dp_size: int) -> np.ndarray:
    """``capacity`` as ``dp_size`` positive int64 token caps (one number: the same for every rank)."""
    if not is_per_rank(capacity):
        return np.full(dp_size, int(capacity), dtype=np.int64)
    if isinstance(capacity, (list, tuple)):  # each entry under the declared rule: [True, 10] is not [1, 10]
        _check_entries(capacity, "capacity", "int")
    array = _array(capacity, "capacity")
    if array.dtype.kind not in "iu" or array.dtype == np.bool_:
        if array.dtype == object and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in array):
            if any(int(v) >= 2**63 for v in array):
                raise ValueError("capacity entries must be < 2**63")
            array = array.astype(np.int64)
        else:
            raise TypeError(f"capacity per rank must hold integers (tokens per row), got dtype {array.dtype}")
    if len(array) != dp_size:
        raise ValueError(f"capacity has {len(array)} entries but dp_size={dp_size}: give one capacity per rank")
    if array.dtype == np.uint64 and int(array.max()) >= 2**63:
        raise ValueError("capacity entries must be < 2**63")
    array = array.astype(np.int64)
    if (array <= 0).any():
        bad = int(np.flatnonzero(array <= 0)[0])
        raise ValueError(f"capacity must be > 0 for every rank; rank {bad} has {int(array[bad])}")
    return array


def rank_speeds(rank_speed, dp_size: int) -> np.ndarray:
    """``rank_speed`` as ``dp_size`` finite float64 speeds > 0 (None: all 1)."""
    if rank_speed is None:
        return np.ones(dp_size)
    if isinstance(rank_speed, (bool, np.bool_)) or not (isinstance(rank_speed, numbers.Real) or is_per_rank(rank_speed)):
        raise TypeError(f"rank_speed must be a list of real numbers, one per rank, got {type(rank_speed).__name__}")
    if isinstance(rank_speed, (list, tuple)):  # each entry under the declared rule: [True, 2] is not [1, 2]
        _check_entries(rank_speed, "rank_speed", "real")
    elif isinstance(rank_speed, numbers.Integral):
        Real("rank_speed").check(rank_speed)  # 10**400: beyond float64, named
    array = _array([rank_speed] * dp_size if isinstance(rank_speed, numbers.Real) else rank_speed, "rank_speed")
    if array.dtype.kind not in "iuf":
        raise TypeError(f"rank_speed must hold real numbers (relative throughput), got dtype {array.dtype}")
    if len(array) != dp_size:
        raise ValueError(f"rank_speed has {len(array)} entries but dp_size={dp_size}: give one speed per rank")
    array = array.astype(np.float64)
    if not (np.isfinite(array).all() and (array > 0).all()):
        bad = int(np.flatnonzero(~(np.isfinite(array) & (array > 0)))[0])
        raise ValueError(f"rank_speed must be finite and > 0 for every rank; rank {bad} has {float(array[bad])}")
    return array


def check_hetero(algorithm: str, capacities: np.ndarray, pad_to_multiple_of: int) -> None:
    """Per-rank capacities or speeds are balanced by ogbfd alone; padded documents must fill every rank's row."""
    if algorithm != "ogbfd":
        raise ValueError(f"per-rank capacity / rank_speed are planned by algorithm='ogbfd' (steps balanced in "
                         f"time); got algorithm={algorithm!r}")
    bad = capacities % pad_to_multiple_of != 0
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise ValueError(f"capacity of rank {r} ({int(capacities[r])}) must be a multiple of "
                         f"pad_to_multiple_of={pad_to_multiple_of}")
