"""Declared argument rules (issue 57): an entry point states each argument's rule once, as data, and
:func:`check_args` applies them all before any work; what a user callback returns goes through
:func:`callback_costs`. Every rule is O(1) on a scalar or O(number of sequences) on a host array, and none reads
device data (a CUDA 0-d tensor is refused by name rather than synced). Each failure is a ValueError / TypeError
that names the argument and says what is allowed (docs/reliability.md lists the rules).

    n, t, flag = check_args(Int("num_rows", 1, 2**31 - 1), Real("temperature", 0.0, inf=False), Bool("shuffle"),
                            values=(num_rows, temperature, shuffle))
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence

import numpy as np
import torch


MAX_INT = 2**63 - 1  # a count or token cap held in int64
MAX_RANKS = 2**24  # ranks, rows per step: the planner sizes per-step state by them (planner.md)


class Rule:
    """One argument's rule: ``check(value)`` returns the value as the entry point uses it, or raises."""
    name: str
    optional: bool = False

    def check(self, value):
        if value is None and self.optional:
            return None
        return self._check(value)

    def _check(self, value):  # pragma: no cover - each rule defines it
        raise NotImplementedError


def _scalar(value, name: str):
    """A 0-d host tensor or numpy scalar as a Python number (bools kept as bools, so rules can refuse them)."""
    if isinstance(value, torch.Tensor):
        if value.is_meta:  # a shape, no value: named, not torch's bare RuntimeError from .item()
            raise ValueError(f"{name} is a meta tensor: meta tensors carry no data (shape and dtype only); pass a "
                             "number")
        if value.dim() != 0:
            raise TypeError(f"{name} must be a number, got a tensor of shape {tuple(value.shape)}")
        if value.device.type != "cpu":  # reading it would sync the device: the argument layer never does
            raise TypeError(f"{name} is a 0-d tensor on {value.device}; pass a Python number (reading it would sync)")
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


class Int(Rule):
    """An integer in ``[low, high]`` (Python or numpy int, or a 0-d integer host tensor); bools and floats
    refused (2.5 is never truncated to 2)."""

    def __init__(self, name: str, low: Optional[int] = None, high: Optional[int] = None, *, optional=False):
        self.name, self.low, self.high, self.optional = name, low, high, optional

    def _check(self, value) -> int:
        v = _scalar(value, self.name)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{self.name} must be an int, got {type(value).__name__} {value!r:.60}")
        lo = "-inf" if self.low is None else self.low
        hi = "inf" if self.high is None else self.high
        if self.low is not None and v < self.low:
            raise ValueError(f"{self.name} must be >= {lo} (an int in [{lo}, {hi}]), got {v}")
        if self.high is not None and v > self.high:
            raise ValueError(f"{self.name} must be <= {hi} (an int in [{lo}, {hi}]), got {v}")
        return int(v)


class Real(Rule):
    """A real number in ``[low, high]``: ints and floats, never a bool, a complex or a string; NaN always
    refused, infinities unless ``inf=True``."""

    def __init__(self, name: str, low: Optional[float] = None, high: Optional[float] = None, *, inf=False,
                 optional=False):
        self.name, self.low, self.high, self.inf, self.optional = name, low, high, inf, optional

    def _check(self, value) -> float:
        v = _scalar(value, self.name)
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{self.name} must be a real number, got {type(value).__name__} {value!r:.60}")
        try:
            v = float(v)
        except OverflowError:  # an int beyond float64 (10**400): named, not a bare OverflowError
            raise ValueError(f"{self.name} must be a finite number, got an int of {len(str(abs(int(v))))} digits "
                             "(beyond float64)") from None
        if math.isnan(v) or (math.isinf(v) and not self.inf):
            raise ValueError(f"{self.name} must be a finite number, got {v}")
        if (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
            lo = "-inf" if self.low is None else self.low
            hi = "inf" if self.high is None else self.high
            raise ValueError(f"{self.name} must be in [{lo}, {hi}], got {v}")
        return v


class Bool(Rule):
    def __init__(self, name: str, *, optional=False):
        self.name, self.optional = name, optional

    def _check(self, value) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{self.name} must be a bool, got {type(value).__name__} {value!r:.60}")
        return bool(value)


class Choice(Rule):
    def __init__(self, name: str, options: Sequence[str], *, optional=False):
        self.name, self.options, self.optional = name, tuple(options), optional

    def _check(self, value) -> str:
        if not isinstance(value, str) or value not in self.options:
            raise ValueError(f"{self.name} must be one of {', '.join(map(repr, self.options))}, got {value!r:.60}")
        return value


class Instance(Rule):
    """``isinstance(value, types)``; ``what`` says in words what is expected."""

    def __init__(self, name: str, types, what: str, *, optional=False):
        self.name, self.types, self.what, self.optional = name, types, what, optional

    def _check(self, value):
        if not isinstance(value, self.types):
            raise TypeError(f"{self.name} must be {self.what}, got {type(value).__name__}")
        return value


def check_rows_per_step(rows: int, num_items: int, what: str) -> None:
    """The planner's bound on rows per step, ``max(2**16, number of sequences)`` (planner.MAX_EMPTY_RANKS), checked
    where a wrapper multiplies its own arguments into the planner's ``dp_size``: ``what`` names those arguments
    (the planner's message would name ``dp_size`` alone)."""
    limit = max(2**16, num_items)
    if rows > limit:
        raise ValueError(f"{what} = {rows} rows per step is more than {limit} (max(2**16, number of sequences)): "
                         f"the plan's size and time would be set by it, not by the data")


def check_args(*rules: Rule, values: Sequence) -> tuple:
    """Each value checked by its rule, in order; the checked values."""
    return tuple(rule.check(v) for rule, v in zip(rules, values, strict=True))


def callback_costs(values, n: int, name: str, item: str = "sequence") -> np.ndarray:
    """What a cost callback (or array) gave, as ``n`` float64 costs, checked: real numbers (no bool, complex,
    strings or None), one per item (shape ``(n,)``, or ``n`` values along one axis), each finite and >= 0, and a
    finite sum (an overflowing cost gives an inf sum, hence a NaN balance). ``name`` says which callback, ``item``
    what it is called on."""
    if values is None:
        raise ValueError(f"{name} returned None; it must return real costs (one number >= 0 per {item})")
    if isinstance(values, torch.Tensor):
        if values.dtype == torch.bool or values.is_complex():
            raise ValueError(f"{name} returned a {values.dtype} tensor; it must return real costs (one number >= 0 "
                             f"per {item})")
        values = values.detach().to("cpu", torch.float64).numpy()
    else:
        values = np.asarray(values)
    if values.dtype.kind not in "iuf":
        if values.dtype.kind == "O":  # Python numbers in a list: real ones only (astype would parse "4" as 4.0)
            real = all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in values.flat)
            values = values.astype(np.float64) if real else None
        if values is None or values.dtype.kind not in "iuf":
            kind = "None" if values is None or values.dtype.kind == "O" else values.dtype.name
            raise ValueError(f"{name} returned {kind}; it must return real costs (one number >= 0 per {item}, "
                             "e.g. a float numpy array or tensor)")
    if values.size != n or (values.ndim != 1 and sorted(values.shape)[:-1] != [1] * (values.ndim - 1)):
        raise ValueError(f"{name} returned costs of shape {tuple(values.shape)} for {n} {item}s; it must return one "
                         f"cost per {item}")
    values = values.astype(np.float64, copy=False).reshape(-1)
    finite = np.isfinite(values)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"{name} returned a non-finite cost ({values[i]}) for {item} {i} ({int((~finite).sum())} "
                         "in all): an overflow? scale the costs down")
    if n and values.min() < 0:
        i = int(np.flatnonzero(values < 0)[0])
        raise ValueError(f"{name} returned a negative cost ({values[i]}) for {item} {i}; costs must be >= 0 (an "
                         "integer overflow wraps to negative: compute in float64 or int64)")
    with np.errstate(over="ignore"):
        total = values.sum()
    if not np.isfinite(total):
        raise ValueError(f"{name} returned costs that sum to inf (the largest is {values.max():.3g}): the balance "
                         "would be NaN; scale the costs down")
    return values


def read_only_call(fn, lengths: np.ndarray, name: str = "cost callable"):
    """``fn(lengths)`` with ``lengths`` handed over as a read-only view, so a callback cannot change packkit's own
    array (and the plan made from it); a write is a ValueError naming ``name``."""
    view = np.asarray(lengths).view()
    view.flags.writeable = False
    try:
        return fn(view)
    except ValueError as exc:
        if "read-only" not in str(exc):
            raise
        raise ValueError(f"{name} wrote into its lengths argument (packkit's own array, handed over read-only: "
                         f"{exc}); compute the costs into a new array, e.g. lengths * 2.0 or lengths.copy()") from None
