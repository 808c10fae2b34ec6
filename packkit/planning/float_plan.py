"""Bin packing of real-valued (float) sizes: ``packkit.plan(sizes, capacity, algorithm="nf" | "ffd" | "bfd")`` with
float sizes or a float capacity, with LightBinPack 0.1.1's semantics (its ``nf`` / ``ffd`` / ``bfd`` take doubles).

Token lengths are integers and packkit's default planners index a bitmap by the remaining capacity in tokens
(``obfd``, ``ogbfd``): they need integers. Next fit, first fit decreasing and best fit decreasing compare sizes
only, so they run on doubles here, in the same arithmetic as LightBinPack (a new bin's room is ``capacity - size``,
then ``room -= size`` per item, compared exactly), giving the same bins in the same order:

* ``nf``: input order; a new bin whenever the next size exceeds the open bin's room.
* ``ffd``: sizes in decreasing order, equal sizes by *decreasing* index (LightBinPack sorts ``(size, index)``
  pairs descending); each into the first bin (in opening order) with room >= size, else a new bin.
* ``bfd``: the same order; each into the bin with the least room >= size, equal rooms first come first served
  (the bin that reached that room earliest), else a new bin.

Bins list the indices in placement order, bins in opening order. Zero sizes are placed like any other (they fit
anywhere). A float plan describes bins only: there are no tokens to pack, so it is a :class:`FloatPlan`, not a
:class:`packkit.Plan` (no segments). Differences from LightBinPack, both deliberate: sizes must be finite and >= 0
and the capacity finite and > 0 (LightBinPack accepts negative sizes and returns no bins for a capacity <= 0), and
a size over the capacity is a ValueError naming it (LightBinPack: RuntimeError), or dropped with ``overlong="drop"``.
The loops are Python (``O(n log n)``), about 1-3 us per item: for integer lengths use the C++ planners.
"""
from __future__ import annotations

import bisect
import math
import numbers
import sys
from collections import deque

import numpy as np

FLOAT_ALGORITHMS = ("nf", "ffd", "bfd")


class FloatPlan:
    """Result of :func:`packkit.plan` on float sizes (``nf`` / ``ffd`` / ``bfd``).

    Attributes:
        bins: list of int64 index arrays, each bin's items in placement order, bins in opening order.
        num_bins, capacity (float), algorithm, sizes (float64, read-only).
        bin_sizes: float64 ``[num_bins]``: the sizes in each bin, summed.
        lower_bound: ``ceil(total / capacity)`` of the kept sizes (in float64 arithmetic).
        efficiency: ``total / (num_bins * capacity)`` (1.0 with no bins).
        dropped: int64 indices over the capacity that ``overlong="drop"`` left out.
    """

    def __init__(self, bins, sizes, capacity, algorithm, dropped):
        self.bins = [np.asarray(b, np.int64) for b in bins]
        self.sizes = sizes
        self.sizes.flags.writeable = False
        self.capacity = capacity
        self.algorithm = algorithm
        self.dropped = np.asarray(dropped, np.int64)
        self.num_bins = len(self.bins)
        self.bin_sizes = np.array([float(sizes[b].sum()) for b in self.bins], np.float64)
        total = float(self.bin_sizes.sum())
        self.lower_bound = math.ceil(total / capacity) if total > 0 else 0
        self.efficiency = total / (self.num_bins * capacity) if self.num_bins else 1.0

    def __repr__(self) -> str:
        return (f"FloatPlan({self.algorithm}, capacity={self.capacity}, bins={self.num_bins} (lower bound "
                f"{self.lower_bound}), efficiency={self.efficiency:.4f}, dropped={len(self.dropped)})")


def float_sizes(lengths, types=None):
    """``lengths`` as a float64 array if they are real-valued (a float dtype, or a list holding a float), else
    None (integer or invalid input: the integer path judges it). ``types``: the list's element types, when the
    caller has them (planner.element_types)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(lengths, torch.Tensor):
        if not lengths.is_floating_point():
            return None
        if lengths.dim() != 1:
            raise ValueError(f"lengths must be 1-D, got a tensor of shape {tuple(lengths.shape)}")
        return lengths.detach().to(device="cpu", dtype=torch.float64).contiguous().numpy().copy()
    if isinstance(lengths, (list, tuple)):
        types = frozenset(map(type, lengths)) if types is None else types
        if not any(issubclass(t, (float, np.floating)) for t in types):
            return None
        if any(issubclass(t, (bool, np.bool_)) or not issubclass(t, numbers.Real) for t in types):
            return None
        array = np.asarray(lengths, dtype=np.float64)
    elif isinstance(lengths, np.ndarray) and lengths.dtype.kind == "f":
        array = np.asarray(lengths, dtype=np.float64)
    else:
        return None
    if array.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {array.shape}")
    return np.array(array, np.float64)  # a copy: the plan keeps it read-only


def is_float_capacity(capacity) -> bool:
    return isinstance(capacity, (float, np.floating))


def integer_requirement(algorithm: str, what: str) -> TypeError:
    """The TypeError for float sizes (or a float capacity) with a planner that needs integers."""
    return TypeError(f"algorithm={algorithm!r} needs integers: integer lengths and an integer capacity (its bitmap "
                     f"is indexed by the remaining capacity in tokens), got {what}; float sizes are packed by algorithm='nf', "
                     "'ffd' or 'bfd' (LightBinPack's semantics), or round the sizes to integers")


def float_plan(sizes: np.ndarray, capacity, algorithm: str, overlong: str) -> FloatPlan:
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, numbers.Real):
        raise TypeError(f"capacity must be a positive number, got {type(capacity).__name__} {capacity!r}")
    capacity = float(capacity)
    if not math.isfinite(capacity) or capacity <= 0:
        raise ValueError(f"capacity must be finite and > 0, got {capacity!r}")
    bad = np.flatnonzero(~np.isfinite(sizes) | (sizes < 0))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{len(bad)} sizes are negative or not finite (first at index {i}: {float(sizes[i])!r}); "
                         "sizes must be finite and >= 0")
    over = np.flatnonzero(sizes > capacity)
    if len(over) and overlong != "drop":
        if overlong != "error":
            raise ValueError(f"overlong={overlong!r} needs integer lengths (it cuts sequences into tokens); float "
                             "sizes take overlong='error' or 'drop'")
        i = int(over[0])
        raise ValueError(f"{len(over)} sequences are longer than capacity {capacity} (first at index {i}, length "
                         f"{float(sizes[i])})")
    keep = np.flatnonzero(sizes <= capacity)
    values = sizes[keep].tolist()
    if algorithm == "nf":
        local = _next_fit(values, capacity)
    else:  # (size, index) descending, as LightBinPack's std::sort with std::greater
        order = np.lexsort((keep, sizes[keep]))[::-1].tolist()
        local = (_first_fit if algorithm == "ffd" else _best_fit)(order, values, capacity)
    bins = [keep[np.asarray(b, np.int64)] for b in local]
    return FloatPlan(bins, sizes, capacity, algorithm, over)


def _next_fit(values, capacity):
    bins, current, room = [], [], capacity
    for i, size in enumerate(values):
        if size > room:
            bins.append(current)
            current, room = [], capacity
        current.append(i)
        room -= size
    if values:
        bins.append(current)
    return bins


def _first_fit(order, values, capacity):
    """First fit over bins in opening order: a max segment tree of the rooms, the leftmost leaf >= size."""
    n = len(order)
    width = 1
    while width < max(n, 1):
        width *= 2
    tree = [-1.0] * (2 * width)  # unopened bins: no room (a size is >= 0)
    rooms, bins = [], []
    for i in order:
        size = values[i]
        if tree[1] >= size:
            node = 1
            while node < width:
                node = 2 * node if tree[2 * node] >= size else 2 * node + 1
            b = node - width
            rooms[b] -= size
            bins[b].append(i)
        else:
            b = len(rooms)
            rooms.append(capacity - size)
            bins.append([i])
            node = b + width
        tree[node] = rooms[b]
        node //= 2
        while node:
            left, right = tree[2 * node], tree[2 * node + 1]
            tree[node] = left if left >= right else right
            node //= 2
    return bins


def _best_fit(order, values, capacity):
    """Best fit: the least room >= size; bins of equal room first come first served (a sorted list of the
    distinct rooms, a queue of bins per room)."""
    keys, queues, rooms, bins = [], {}, [], []

    def push(room, b):
        queue = queues.get(room)
        if queue is None:
            queues[room] = queue = deque()
            bisect.insort(keys, room)
        queue.append(b)

    for i in order:
        size = values[i]
        j = bisect.bisect_left(keys, size)
        if j < len(keys):
            room = keys[j]
            queue = queues[room]
            b = queue.popleft()
            if not queue:
                del queues[room]
                del keys[j]
            rooms[b] -= size
            bins[b].append(i)
        else:
            b = len(rooms)
            rooms.append(capacity - size)
            bins.append([i])
        push(rooms[b], b)
    return bins
