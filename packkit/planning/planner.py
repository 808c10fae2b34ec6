"""``packkit.plan``: the bin-packing plan (which sequences share a row), computed by the C++ core.

A plan is a list of bins (rows). Each bin holds *segments* — pieces ``(sequence index, start,
length)`` of source sequences — so the ``split`` policy needs no special case downstream. The CSR
arrays in :attr:`Plan.segments` are what the pack ops consume.
"""
from __future__ import annotations

import math
import numbers
import sys
from functools import cached_property
from typing import Callable, NamedTuple, Optional, Sequence, Union

import numpy as np

from .. import _planner
from .arg_rules import MAX_INT, Int, check_args, read_only_call
from .balance_bound import step_balance_lower_bound
from .float_plan import FLOAT_ALGORITHMS, float_plan, float_sizes, integer_requirement, is_float_capacity
from .hetero_ranks import check_hetero, is_per_rank, rank_capacities, rank_speeds

ALGORITHMS = ("nf", "ffd", "bfd", "obfd", "ogbfd")
OVERLONG_POLICIES = ("error", "drop", "truncate", "split")
COST_MODELS = ("tokens", "attention")
MAX_EMPTY_RANKS = 2**16  # plan() refuses dp_size above max(this, number of sequences) (issue 57)

CostSpec = Union[str, tuple, Callable[[np.ndarray], "np.typing.ArrayLike"]]


class Segments(NamedTuple):
    """The plan in CSR form; bin ``b`` holds segments ``bin_offsets[b]:bin_offsets[b+1]``."""

    seq_index: np.ndarray  # int64 [num_segments]: source sequence of each segment
    start: np.ndarray  # int64 [num_segments]: first token of the segment in its sequence
    length: np.ndarray  # int64 [num_segments]: tokens in the segment (always >= 1)
    bin_offsets: np.ndarray  # int64 [num_bins + 1]


class Plan:
    """Result of :func:`plan`. All arrays are read-only int64 numpy arrays unless noted.

    Attributes:
        bins: list of 1-D int64 arrays, the input indices in each row, in row order (views).
        segments: :class:`Segments` (CSR) — what pack ops consume.
        num_bins: rows, including empty ones (only ``dp_size > 1`` layouts have empty rows).
        lower_bound: ``ceil(kept_tokens / capacity)``, the fewest rows any packer could use.
        efficiency: ``kept_tokens / (num_bins * capacity)`` (1.0 for an empty plan).
        dropped, truncated, split: source indices the over-long policy dropped/truncated/split.
        zero_length: source indices of zero-length sequences; they occupy no tokens and are in no bin.
        num_steps, rank_costs: with ``dp_size`` ranks, bin ``s * dp_size + r`` is rank ``r``'s row at
            step ``s``; ``rank_costs`` is float64 ``[num_steps, dp_size]`` under the cost model.
        balance: ``sum over steps of max rank time / sum over steps of mean rank time`` (>= 1; the
            time a synchronous step waits for its slowest rank, relative to perfect balance); a rank's time is
            its row's cost / its ``rank_speed`` (1 unless given).
        rank_balance: ``max / mean`` of each rank's total time over all steps (>= 1).
        rank_capacity, rank_speed: per-rank token caps and speeds (int64 / float64 ``[dp_size]``); without
            per-rank ones, ``capacity`` and 1 for every rank.
        steps_lower_bound: ``ceil(kept_tokens / sum(rank_capacity))``, the fewest steps any plan could use.
        balance_lower_bound: no plan of the same items into at most ``num_steps`` steps has a lower
            ``balance`` (certified; see :mod:`packkit.balance_bound`). None for callable costs and with
            ``extra_cost``.
    """

    def __init__(self, raw: dict, *, capacity: int, algorithm: str, overlong: str, dp_size: int, num_sequences: int,
                 cost_ab: tuple | None = (1.0, 0.0), pad_to_multiple_of: int = 1, rank_capacity=None,
                 rank_speed=None):
        self.capacity = capacity
        self.heterogeneous = rank_capacity is not None  # per-rank caps or speeds: ogbfd's time-balanced steps
        self.rank_capacity = np.full(dp_size, capacity, np.int64) if rank_capacity is None else rank_capacity
        self.rank_speed = np.ones(dp_size) if rank_speed is None else rank_speed
        self.rank_capacity.flags.writeable = False
        self.rank_speed.flags.writeable = False
        self.pad_to_multiple_of = pad_to_multiple_of  # segments planned at lengths rounded up to this
        self.cost_ab = cost_ab  # (a, b) of the cost model, None for a callable
        self.algorithm = algorithm
        self.overlong = overlong
        self.dp_size = dp_size
        self.num_sequences = num_sequences
        for key in ("seg_seq", "seg_start", "seg_length", "bin_offsets", "dropped", "truncated", "split",
                    "zero_length", "rank_costs"):
            raw[key].flags.writeable = False
        self.segments = Segments(raw["seg_seq"], raw["seg_start"], raw["seg_length"], raw["bin_offsets"])
        self.dropped = raw["dropped"]
        self.truncated = raw["truncated"]
        self.split = raw["split"]
        self.zero_length = raw["zero_length"]
        self.kept_tokens = int(raw["kept_tokens"])
        self.num_steps = int(raw["num_steps"])
        self.empty_bins = int(raw["empty_bins"])
        self.rank_costs = raw["rank_costs"].reshape(self.num_steps, dp_size)

    @classmethod
    def from_bins(cls, lengths, bins, capacity: int, *, algorithm: str = "given") -> "Plan":
        """A plan whose rows are given: ``bins`` is a list of index lists, whole sequences only.

        For rows decided elsewhere (a streaming buffer, a sampler, a hand-made layout). Raises
        ValueError if an index is out of range or repeated, a row is over ``capacity``, or a
        sequence of positive length is in no row (zero-length ones are reported in ``zero_length``).
        """
        array = as_lengths(lengths)
        capacity = _as_count(capacity, "capacity")
        negative = np.flatnonzero(array < 0)
        if len(negative):  # the planner refuses these too; here they would vanish from the plan
            i = int(negative[0])
            raise ValueError(f"{len(negative)} lengths are negative (first at index {i}: {int(array[i])}); "
                             "lengths must be >= 0")
        groups = [np.asarray(b, dtype=np.int64).reshape(-1) for b in bins]
        seq = np.concatenate(groups) if groups else np.zeros(0, np.int64)
        if len(seq) and (seq.min() < 0 or seq.max() >= len(array)):
            raise ValueError(f"bins name index {int(seq.max() if seq.max() >= len(array) else seq.min())} but there "
                             f"are {len(array)} sequences")
        counts = np.bincount(seq, minlength=len(array))
        if len(seq) and counts.max() > 1:
            raise ValueError(f"sequence {int(np.argmax(counts > 1))} is in more than one bin (or twice in one)")
        missing = np.flatnonzero((counts == 0) & (array > 0))
        if len(missing):
            raise ValueError(f"{len(missing)} sequences of positive length are in no bin, e.g. index {int(missing[0])}")
        zero = np.flatnonzero(array == 0)
        keep = array[seq] > 0
        offsets = np.zeros(len(groups) + 1, np.int64)
        offsets[1:] = np.cumsum([int((array[g] > 0).sum()) for g in groups])
        seq = seq[keep]
        seg_length = array[seq]
        if len(seg_length) and int(seg_length.max()) > capacity:
            i = int(seq[np.argmax(seg_length)])
            raise ValueError(f"sequence {i} has {int(array[i])} tokens, more than capacity={capacity}")
        # Sums in Python ints when int64 could overflow (lengths near 2^63: a fuzz finding).
        safe = not len(seg_length) or int(seg_length.max()) <= (2**63 - 1) // len(seg_length)
        cumulative = np.concatenate(([0], np.cumsum(seg_length if safe else seg_length.astype(object))))
        tokens = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
        if len(tokens) and tokens.max() > capacity:
            worst = int(np.argmax(tokens))
            raise ValueError(f"bin {worst} holds {int(tokens[worst])} tokens, more than capacity={capacity}")
        if int(cumulative[-1]) > 2**63 - 1:
            raise ValueError(f"the bins hold {int(cumulative[-1])} tokens in all; at most 2^63 - 1 are supported")
        tokens = tokens.astype(np.int64)
        empty = np.zeros(0, np.int64)
        raw = {"seg_seq": seq, "seg_start": np.zeros(len(seq), np.int64), "seg_length": seg_length,
               "bin_offsets": offsets, "dropped": empty, "truncated": empty.copy(), "split": empty.copy(),
               "zero_length": zero.astype(np.int64), "rank_costs": tokens.astype(np.float64),
               "num_steps": len(groups), "empty_bins": int((tokens == 0).sum()), "kept_tokens": int(cumulative[-1])}
        return cls(raw, capacity=capacity, algorithm=algorithm, overlong="error", dp_size=1, num_sequences=len(array))

    @property
    def num_bins(self) -> int:
        return len(self.segments.bin_offsets) - 1

    @property
    def num_segments(self) -> int:
        return len(self.segments.length)

    @property
    def lower_bound(self) -> int:
        return -(-self.kept_tokens // self.capacity)

    @property
    def efficiency(self) -> float:
        if self.heterogeneous:  # each step offers sum(rank_capacity) tokens
            return self.kept_tokens / (self.num_steps * int(self.rank_capacity.sum())) if self.num_steps else 1.0
        return self.kept_tokens / (self.num_bins * self.capacity) if self.num_bins else 1.0

    @property
    def steps_lower_bound(self) -> int:
        return -(-self.kept_tokens // int(self.rank_capacity.sum()))

    @property
    def rank_times(self) -> np.ndarray:
        """float64 ``[num_steps, dp_size]``: each row's cost / its rank's speed."""
        return self.rank_costs / self.rank_speed

    @cached_property
    def bins(self) -> list[np.ndarray]:
        offsets = self.segments.bin_offsets.tolist()
        seq = self.segments.seq_index
        return [seq[offsets[b]:offsets[b + 1]] for b in range(len(offsets) - 1)]

    @cached_property
    def bin_tokens(self) -> np.ndarray:
        """Tokens in each bin, int64 [num_bins]."""
        cumulative = np.concatenate(([0], np.cumsum(self.segments.length)))
        return cumulative[self.segments.bin_offsets[1:]] - cumulative[self.segments.bin_offsets[:-1]]

    @property
    def max_segment_length(self) -> int:
        """Longest segment: the ``max_seqlen`` flash-attn varlen needs, known on the host."""
        return int(self.segments.length.max()) if self.num_segments else 0

    @property
    def balance(self) -> float:
        if self.num_steps == 0:
            return 1.0
        times = self.rank_times
        mean_total = float(times.mean(axis=1).sum())
        return float(times.max(axis=1).sum()) / mean_total if mean_total > 0 else 1.0

    @property
    def rank_balance(self) -> float:
        totals = self.rank_times.sum(axis=0)
        return float(totals.max() / totals.mean()) if self.num_steps and totals.mean() > 0 else 1.0

    @cached_property
    def balance_lower_bound(self) -> float | None:
        """Certified lower bound on :attr:`balance` over every plan of these items with at most
        :attr:`num_steps` steps (so ``balance / balance_lower_bound`` is the most left to gain)."""
        if self.cost_ab is None or self.heterogeneous:  # the bound's relaxation assumes identical ranks
            return None
        return step_balance_lower_bound(self.padded_lengths, self.capacity, self.dp_size, self.num_steps,
                                        *self.cost_ab)

    @cached_property
    def padded_lengths(self) -> np.ndarray:
        """Each segment's length rounded up to ``pad_to_multiple_of`` (what the plan packed and costed)."""
        m = self.pad_to_multiple_of
        return self.segments.length if m == 1 else (self.segments.length + m - 1) // m * m

    @cached_property
    def padded_bin_tokens(self) -> np.ndarray:
        """Tokens in each bin with every segment padded to ``pad_to_multiple_of`` (<= capacity)."""
        cumulative = np.concatenate(([0], np.cumsum(self.padded_lengths)))
        return cumulative[self.segments.bin_offsets[1:]] - cumulative[self.segments.bin_offsets[:-1]]

    def rank_bins(self, rank: int) -> list[np.ndarray]:
        """Rank ``rank``'s rows, one per step, in step order."""
        from .arg_rules import Int, check_args

        rank, = check_args(Int("rank", 0, self.dp_size - 1), values=(rank,))  # True / 1.0 refused, not coerced
        return self.bins[rank::self.dp_size]

    def to_tensors(self, device=None) -> dict:
        """The CSR arrays as int64 torch tensors (``seg_seq, seg_start, seg_length, bin_offsets``)."""
        import torch

        names = ("seg_seq", "seg_start", "seg_length", "bin_offsets")
        return {n: torch.from_numpy(a.copy()).to(device) for n, a in zip(names, self.segments)}

    def summary(self) -> dict:
        """Plain-Python figures for reports and JSON."""
        out = {
            "algorithm": self.algorithm, "capacity": self.capacity, "dp_size": self.dp_size,
            "sequences": self.num_sequences, "bins": self.num_bins, "lower_bound": self.lower_bound,
            "efficiency": self.efficiency, "kept_tokens": self.kept_tokens, "segments": self.num_segments,
            "dropped": len(self.dropped), "truncated": len(self.truncated), "split": len(self.split),
            "zero_length": len(self.zero_length), "empty_bins": self.empty_bins,
        }
        if self.dp_size > 1:
            out.update(steps=self.num_steps, balance=self.balance, rank_balance=self.rank_balance,
                       balance_lower_bound=self.balance_lower_bound, steps_lower_bound=self.steps_lower_bound)
        if self.heterogeneous:
            out.update(rank_capacity=self.rank_capacity.tolist(), rank_speed=self.rank_speed.tolist())
        return out

    def __repr__(self) -> str:
        s = self.summary()
        extra = f", steps={s['steps']}, balance={s['balance']:.4f}" if self.dp_size > 1 else ""
        return (f"Plan({self.algorithm}, capacity={self.capacity}, bins={s['bins']} (lower bound "
                f"{s['lower_bound']}), efficiency={s['efficiency']:.4%}, dropped={s['dropped']}, "
                f"truncated={s['truncated']}, split={s['split']}, zero_length={s['zero_length']}{extra})")


def _as_count(value, name: str) -> int:
    """A positive Python int from an int-like; bools and floats are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point() and value.dtype != torch.bool:
            value = int(value.item())
        else:
            raise TypeError(f"{name} must be a positive integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    if value >= 2**63:
        raise ValueError(f"{name} must be < 2**63, got {value}")
    return value


_BOOLS = (bool, np.bool_)


def element_types(lengths) -> Optional[frozenset]:
    """The types of a list's / tuple's elements (one C-speed pass: ~11 ns an element), or None for any other input;
    computed once per call and shared by the float and integer checks."""
    return frozenset(map(type, lengths)) if isinstance(lengths, (list, tuple)) else None


def as_lengths(lengths, types: Optional[frozenset] = None) -> np.ndarray:
    """Validates ``lengths`` and returns a contiguous int64 numpy array (no copy when it already is one). A list or
    tuple with a bool among its elements is refused whatever the others are (``[True, 2]`` as ``[True, False]``);
    ``types``: :func:`element_types` of it, when the caller has them."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(lengths, torch.Tensor):
        _refuse_meta(lengths, "lengths")
        if lengths.dtype == torch.bool or lengths.is_floating_point() or lengths.is_complex():
            raise TypeError(f"lengths must be an integer tensor, got dtype {lengths.dtype}")
        if lengths.dim() != 1:
            raise ValueError(f"lengths must be 1-D, got a tensor of shape {tuple(lengths.shape)}")
        if lengths.dtype == getattr(torch, "uint64", None):  # .to(int64) would wrap 2**63 + k to a negative
            return as_lengths(lengths.detach().cpu().numpy())  # the numpy path names the true value
        return lengths.detach().to(device="cpu", dtype=torch.int64).contiguous().numpy()
    if isinstance(lengths, np.ndarray):
        array = lengths
    elif isinstance(lengths, (list, tuple, range)):
        if len(lengths) == 0:
            return np.zeros(0, dtype=np.int64)
        types = element_types(lengths) if types is None else types
        if types is not None and any(issubclass(t, _BOOLS) for t in types):
            bad = next(i for i, x in enumerate(lengths) if isinstance(x, _BOOLS))
            raise TypeError(f"lengths must be integers, not bools; index {bad} is {lengths[bad]!r}")
        if types is not None and types <= {int}:  # plain Python ints: straight to int64 (one pass, no dtype guess)
            try:
                return np.asarray(lengths, dtype=np.int64)
            except OverflowError:  # an int beyond int64: named below
                pass
        try:
            array = np.asarray(lengths)
        except (ValueError, OverflowError) as e:  # ragged nesting, ints beyond int64
            raise ValueError(f"lengths must be a flat sequence of integers: {e}") from None
        if array.dtype.kind == "f" and any(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                                           and not -2**63 <= int(x) < 2**63 for x in lengths):
            # numpy turns [3, 2**63] into float64: name the int that does not fit, not the dtype
            big = next(i for i, x in enumerate(lengths) if isinstance(x, numbers.Integral)
                       and not isinstance(x, bool) and not -2**63 <= int(x) < 2**63)
            raise ValueError(f"lengths must fit in int64; index {big} is {int(lengths[big])}, outside "
                             f"[-2**63, 2**63 - 1]")
    else:
        raise TypeError("lengths must be a list, tuple, numpy array or 1-D integer tensor, "
                        f"got {type(lengths).__name__}")
    if array.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        if array.dtype.kind == "O":
            bad = next((i for i, x in enumerate(array)
                        if isinstance(x, bool) or not isinstance(x, numbers.Integral)), None)
            if bad is None:  # Python ints too large for int64
                big = next((i for i, x in enumerate(array) if not -2**63 <= int(x) < 2**63), None)
                if big is None:
                    raise TypeError("lengths must be integers of an integer dtype, got an array of dtype object "
                                    "(Python ints); convert it, e.g. np.asarray(lengths, dtype=np.int64)")
                raise ValueError(f"lengths must fit in int64; index {big} is {int(array[big])}, outside "
                                 f"[-2**63, 2**63 - 1]")
            raise TypeError(f"lengths must be integers; index {bad} is {type(array[bad]).__name__} {array[bad]!r}")
        raise TypeError(f"lengths must be integers, got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        big = int(np.argmax(array > np.iinfo(np.int64).max))
        raise ValueError(f"lengths must fit in int64; index {big} is {int(array[big])} (dtype {array.dtype})")
    return np.ascontiguousarray(array, dtype=np.int64)


def _cost_model(cost: CostSpec):
    """(a, b, per-item cost function or None) for cost = a * len + b * len**2."""
    if isinstance(cost, str):
        if cost == "tokens":
            return 1.0, 0.0, None
        if cost == "attention":
            return 0.0, 1.0, None
        raise ValueError(f"unknown cost {cost!r}; allowed: 'tokens', 'attention', (a, b) or a callable")
    if hasattr(cost, "hidden_size") or hasattr(cost, "text_config"):  # a transformers config
        from .cost_model import transformer_cost

        cost = transformer_cost(cost)
        if not callable(cost):  # (a, b): every layer full attention
            return (*cost, None)
    if callable(cost):  # a DocumentCost of transformer_cost too
        def item_costs(item_lengths: np.ndarray) -> np.ndarray:
            values = read_only_call(cost, item_lengths)  # a write cannot move a plan
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(values, torch.Tensor):
                _refuse_meta(values, "cost")
                values = values.detach().cpu().numpy()
            values = np.asarray(values)
            check_real_dtype(values.dtype, "cost", "the cost callable's values")
            values = np.asarray(values, dtype=np.float64)
            if values.shape != item_lengths.shape:
                raise ValueError(f"cost callable must return one cost per item (shape {item_lengths.shape}), "
                                 f"got shape {values.shape}")
            if not np.all(np.isfinite(values)) or (values < 0).any():
                raise ValueError("cost callable returned a negative or non-finite cost")
            return values
        return 1.0, 0.0, item_costs
    if isinstance(cost, (bool, np.bool_, complex, np.complexfloating)):
        raise TypeError(f"cost must be 'tokens', 'attention', a pair (a, b) of ints or floats or a callable; got "
                        f"{type(cost).__name__} {cost!r}")
    if isinstance(cost, (tuple, list, np.ndarray)) and len(cost) == 2:
        for c in cost:
            if isinstance(c, (bool, np.bool_)) or isinstance(c, (complex, np.complexfloating)) or (
                    isinstance(cost, np.ndarray) and cost.dtype.kind not in "iuf"):
                raise TypeError(f"cost must hold ints or floats: the pair (a, b) has {type(c).__name__} {c!r}")
    if isinstance(cost, (tuple, list)) and len(cost) == 2 and all(
            isinstance(c, numbers.Real) and not isinstance(c, bool) for c in cost):
        a, b = float(cost[0]), float(cost[1])
        if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b >= 0 and a + b > 0):
            raise ValueError(f"cost coefficients (a, b) must be finite, >= 0 and not both 0, got {cost!r}")
        return a, b, None
    raise TypeError("cost must be 'tokens', 'attention', a pair (a, b) for a*len + b*len**2, "
                    f"or a callable mapping an int64 array of lengths to costs; got {cost!r}")


def check_real_dtype(dtype, name: str, what: str | None = None) -> None:
    """TypeError naming ``name`` unless ``dtype`` is an int or float dtype (bools and complex refused):
    the rule ``extra_cost`` and ``cost`` share."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_ or dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold ints or floats, got dtype {dtype}"
                        + (f" ({what})" if what else ""))


def _refuse_meta(tensor, name: str) -> None:
    """ValueError naming ``name`` for a tensor on the meta device (it has a shape but no data to read)."""
    if getattr(tensor, "is_meta", False):
        raise ValueError(f"{name} is a meta tensor: meta tensors carry no data (shape and dtype only); pass a CPU "
                         "or CUDA tensor")


def as_extra_cost(extra_cost, n: int) -> np.ndarray | None:
    """Validates a per-sample extra cost (``extra_cost=`` of :func:`plan` and the samplers): None, or a float64 array
    of ``n`` finite values >= 0 (one per length). ValueError/TypeError naming ``extra_cost`` otherwise."""
    if extra_cost is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(extra_cost, torch.Tensor):
        _refuse_meta(extra_cost, "extra_cost")
        extra_cost = extra_cost.detach().cpu().numpy()
    if not isinstance(extra_cost, (np.ndarray, list, tuple)):
        raise TypeError(f"extra_cost must be a 1-D array of floats (one per length), got {type(extra_cost).__name__}")
    try:
        array = np.asarray(extra_cost)
    except (ValueError, OverflowError) as e:  # ragged nesting
        raise ValueError(f"extra_cost must be a flat sequence of numbers: {e}") from None
    if array.size == 0:
        array = array.reshape(-1)
    check_real_dtype(array.dtype, "extra_cost")
    if array.ndim != 1:
        raise ValueError(f"extra_cost must be 1-D, got shape {array.shape}")
    if len(array) != n:
        raise ValueError(f"extra_cost has {len(array)} entries for {n} lengths; give one per length")
    array = np.ascontiguousarray(array, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"extra_cost must be finite and >= 0; {len(bad)} entries are not (first: index {i}, "
                         f"{float(array[i])!r})")
    return array


def check_plan_choices(algorithm, overlong) -> None:
    """Raise ValueError for an unknown ``algorithm`` or ``overlong`` policy. Shared by :func:`plan` and the
    loaders that take these options (PackingCollator, PackedIterableDataset), so they refuse a bad value
    at construction with the same message the planner would give."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"unknown overlong policy {overlong!r}; allowed: {', '.join(OVERLONG_POLICIES)}")


def _float_input(lengths, capacity, float_lengths: bool) -> str:
    """What made a plan's input real-valued, for the integer-requirement TypeError."""
    if not float_lengths:
        return f"capacity {capacity!r} (capacity must be an integer)"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(lengths, torch.Tensor):
        return f"a {lengths.dtype} tensor (lengths must be an integer tensor)"
    if isinstance(lengths, np.ndarray):
        return f"lengths of dtype {lengths.dtype}"
    return "float lengths in a list"


def plan(lengths: Sequence[int], capacity: int, *, algorithm: str = "obfd", dp_size: int = 1,
         cost: CostSpec = "tokens", overlong: str = "error", pad_to_multiple_of: int | None = None,
         extra_cost=None, rank_speed=None, max_sequences: int | None = None) -> Plan:
    """Bin-pack sequence ``lengths`` into rows of ``capacity`` tokens.

    Args:
        lengths: list, tuple, numpy array or 1-D integer tensor of non-negative lengths. Float sizes (or a float
            ``capacity``) are packed by ``nf`` / ``ffd`` / ``bfd`` with LightBinPack's semantics into a
            :class:`~packkit.planning.float_plan.FloatPlan` (bins only); ``obfd`` / ``ogbfd`` raise TypeError.
        capacity: tokens per row (> 0), or one per rank (a list of ``dp_size`` ints: heterogeneous ranks, with
            ``algorithm="ogbfd"``; rank ``i``'s row at every step fits ``capacity[i]``).
        algorithm: ``nf`` (next fit, input order), ``ffd``, ``bfd``, ``obfd`` (counting sort +
            bitmap best fit; default) or ``ogbfd`` (data-parallel steps balanced under ``cost``: the
            best of three step layouts, each with at most obfd's rows + ``dp_size`` non-empty rows).
        dp_size: data-parallel ranks. Bins are laid out step-major (bin ``s*dp_size + r`` goes to
            rank ``r`` at step ``s``), every step has ``dp_size`` bins, the last padded with empty
            bins. Only ``ogbfd`` balances; other algorithms deal their bins in order.
        cost: ``"tokens"`` (sum of lengths), ``"attention"`` (sum of len**2, document-masked
            attention), a pair ``(a, b)`` for ``a*len + b*len**2`` (e.g. from
            :func:`packkit.transformer_cost`), a transformers model config (its
            ``transformer_cost``), or a callable mapping an int64 array of item lengths to
            non-negative costs.
        overlong: what to do with sequences longer than ``capacity``: ``"error"`` (ValueError
            naming how many and the first), ``"drop"``, ``"truncate"`` (keep the first ``capacity``
            tokens) or ``"split"`` (consecutive pieces packed as separate items). All reported.
        pad_to_multiple_of: plan every sequence at its length rounded up to a multiple of this (context
            parallelism pads each document to a multiple of ``2 * cp_size`` for zigzag sharding): the
            padded lengths are what must fit in ``capacity`` (a multiple of it) and what the cost model
            and ``rank_costs`` see, so rows planned to capacity still fit once padded. The returned
            segments keep **real** lengths (what ``pack_sequences`` packs); ``padded_lengths`` and
            ``padded_bin_tokens`` give the padded ones. Over-long sequences are judged by their padded
            length (equivalent, as ``capacity`` is a multiple); ``"split"`` pieces are ``capacity``
            long except the last, so padding only ever lengthens a sequence's last piece.
        extra_cost: per-sample cost added to each sequence's ``cost`` (one finite value >= 0 per length, in the
            cost's units), e.g. the vision tower's FLOPs of a sample's images
            (:func:`packkit.vision_cost`); with ``"split"`` it goes with the first piece. ``rank_costs`` and
            the ogbfd balance include it. ``None`` (default) or all zeros: the plan of ``cost`` alone.
        rank_speed: one relative throughput per rank (``dp_size`` finite reals > 0; a mixed H100 / A100 pool),
            with ``algorithm="ogbfd"``: a row's time is its cost / its rank's speed and steps are balanced in
            time (``balance`` and ``rank_balance`` are in time). ``None``: every rank speed 1.
        max_sequences: no row holds more than this many sequences (``"split"`` pieces count one each): a bin
            constraint of every algorithm (``ogbfd``'s step balancing moves items only into rows with room), for
            batches with a fixed number of sequence slots per row (static shapes, docs/packing.md); not with
            per-rank capacities or ``rank_speed``. ``None``: no limit.
    """
    caps = speeds = None  # caps: per-rank capacities when the ranks differ (speeds: whenever given)
    if rank_speed is not None or is_per_rank(capacity):  # heterogeneous ranks (hetero_ranks.py)
        dp_size = _as_count(dp_size, "dp_size")
        caps = rank_capacities(capacity if is_per_rank(capacity) else _as_count(capacity, "capacity"), dp_size)
        speeds = rank_speeds(rank_speed, dp_size)
        capacity = int(caps.max())
        if (caps == capacity).all() and (speeds == speeds[0]).all():
            caps = None  # identical ranks: ogbfd's own layouts (a common speed does not move a balance)
    types = element_types(lengths)
    sizes = float_sizes(lengths, types)
    if sizes is not None or is_float_capacity(capacity):  # real-valued sizes: nf / ffd / bfd only (float_plan.py)
        check_plan_choices(algorithm, overlong)
        what = _float_input(lengths, capacity, sizes is not None)
        if algorithm not in FLOAT_ALGORITHMS:
            raise integer_requirement(algorithm, what)
        if dp_size != 1 or not (isinstance(cost, str) and cost == "tokens") or pad_to_multiple_of is not None or extra_cost is not None or max_sequences is not None:
            raise ValueError("float sizes are planned by nf / ffd / bfd alone: dp_size=1, cost='tokens', no "
                             "pad_to_multiple_of, no extra_cost, no max_sequences")
        return float_plan(sizes if sizes is not None else as_lengths(lengths).astype(np.float64), capacity, algorithm,
                          overlong)
    array = as_lengths(lengths, types)
    capacity = _as_count(capacity, "capacity")
    dp_size = _as_count(dp_size, "dp_size")
    limit = max(MAX_EMPTY_RANKS, len(array))
    if limit < dp_size <= 2**24:  # above 2**24 the core's own range error; the plan has dp_size bins per step: its size would be set by dp_size, not by the data
        raise ValueError(f"dp_size={dp_size} is more than {limit} (max(2**16, number of sequences)); a plan holds "
                         f"dp_size rows per step, so its size and time would be set by dp_size, not by the data")
    check_plan_choices(algorithm, overlong)
    a, b, cost_fn = _cost_model(cost)
    extra = as_extra_cost(extra_cost, len(array))
    m = 1 if pad_to_multiple_of is None else _as_count(pad_to_multiple_of, "pad_to_multiple_of")
    if m < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
    if capacity % m:
        raise ValueError(f"capacity={capacity} must be a multiple of pad_to_multiple_of={m} (every row's padded "
                         f"documents must fill it exactly)")
    if caps is not None:
        check_hetero(algorithm, caps, m)
    max_items = 0 if max_sequences is None else check_args(Int("max_sequences", 1, MAX_INT), values=(max_sequences,))[0]
    if m > 1 and array.size and int(array.max()) > np.iinfo(np.int64).max - m:
        raise ValueError("lengths must fit in int64 after padding")
    planned = array if m == 1 else (array + m - 1) // m * m
    raw = _planner.plan(planned, capacity, algorithm, overlong, dp_size, a, b, cost_fn, extra,
                        [] if caps is None else caps.tolist(), [] if caps is None else speeds.tolist(), max_items)
    with np.errstate(over="ignore", invalid="ignore"):  # the total bounds every sum balance / rank_balance take
        total = float(raw["rank_costs"].sum())
    if not math.isfinite(total):  # finite item or row costs can still sum past float64 (NaN or 0.0 balance)
        raise ValueError("the cost model's per-row costs overflow float64 (each item's cost is finite, their sums "
                         "are not); scale the cost down, e.g. divide (a, b) or the callable's values by a constant")
    if speeds is not None:  # a row's time is its cost / its rank's speed: an extreme speed overflows it
        check_rank_times(raw["rank_costs"].reshape(-1, dp_size), speeds)
    if m > 1:
        raw = _unpad_segments(raw, array)
    return Plan(raw, capacity=capacity, algorithm=algorithm, overlong=overlong, dp_size=dp_size,
                num_sequences=len(array), cost_ab=None if cost_fn is not None or extra is not None else (a, b),
                pad_to_multiple_of=m, rank_capacity=caps, rank_speed=speeds)


def check_rank_times(rank_costs: np.ndarray, speeds: np.ndarray) -> None:
    """ValueError naming ``rank_speed`` when some row's time (cost / speed), or the sum the balance takes, is not
    a finite float64 (a tiny speed gives inf rank_times and a NaN balance)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        times = rank_costs / speeds
        total = float(times.sum())
    if not math.isfinite(total):
        bad = np.flatnonzero(~np.isfinite(times).all(axis=0))
        r = int(bad[0]) if bad.size else int(np.argmin(speeds))
        raise ValueError(f"rank_speed gives row times (cost / rank_speed) that overflow float64: rank {r} has speed "
                         f"{float(speeds[r])!r} (speeds from {float(speeds.min())!r} to {float(speeds.max())!r}); "
                         "rank_speed must be finite, > 0 and within a range where cost / speed fits float64 "
                         "(e.g. relative speeds near 1)")


def _unpad_segments(raw: dict, lengths: np.ndarray) -> dict:
    """A plan made on padded lengths, with every segment cut back to the tokens its sequence has."""
    seq, start, length = raw["seg_seq"], raw["seg_start"], raw["seg_length"]
    real = np.minimum(start + length, lengths[seq]) - start
    if len(real) and int(real.min()) < 1:  # cannot happen: split pieces are capacity long but the last
        raise AssertionError("pad_to_multiple_of produced a segment of padding only")
    raw = dict(raw)
    raw["seg_length"] = np.ascontiguousarray(real, dtype=np.int64)
    raw["kept_tokens"] = int(real.sum())
    return raw
