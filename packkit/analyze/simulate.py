"""Packing simulations over a sweep of max lengths, and the padded baseline they are compared with."""
from __future__ import annotations

import math
import time

import numpy as np

from ..planning.planner import ALGORITHMS, plan
from .errors import AnalyzeError
from .progress import bar

_NICE = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 10)


def nice_ceil(value: float) -> int:
    """The smallest "round" number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8 x 10^k) >= value, at least 1."""
    if value <= 1:
        return 1
    exponent = 10 ** math.floor(math.log10(value))
    return int(next(m * exponent for m in _NICE if m * exponent >= value - 1e-9))


def _next_pow2(value: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(value, 1))))


def auto_max_lengths(stats: dict) -> list[int]:
    """Default sweep: powers of two from the one >= the median up to the one >= the longest sample
    (at most 16 x the power of two >= p99), plus p99 and the longest sample rounded up to round numbers."""
    lo = _next_pow2(stats["median"])
    hi = min(_next_pow2(stats["max"]), 16 * _next_pow2(stats["p99"]))
    points = {1 << k for k in range(lo.bit_length() - 1, hi.bit_length())}
    points.add(nice_ceil(stats["p99"]))
    if nice_ceil(stats["max"]) <= hi:
        points.add(nice_ceil(stats["max"]))
    return sorted(points)


def parse_max_lengths(spec, stats: dict | None) -> list[int]:
    """``spec``: ``"auto"``, an int, a comma-separated string or a list of ints and ``"auto"``
    (``"auto,20000"`` = the default sweep plus 20000). Returns sorted unique positive ints."""
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
    elif isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        items = [int(spec)]
    else:
        items = list(spec)
    if not items:
        raise AnalyzeError("max lengths: empty list; give integers and/or 'auto'")
    out = set()
    for item in items:
        if isinstance(item, str) and item.strip().lower() == "auto":
            if stats is not None:  # None: syntax check only
                out.update(auto_max_lengths(stats))
            continue
        try:
            if isinstance(item, bool) or isinstance(item, float):
                raise ValueError
            value = int(item.replace("_", "")) if isinstance(item, str) else int(item)
        except (TypeError, ValueError):
            raise AnalyzeError(f"max lengths: {item!r} is not a positive integer or 'auto'") from None
        if value <= 0:
            raise AnalyzeError(f"max lengths: {value} is not a positive integer")
        if value >= 2**63:  # the planner's capacity bound: was its ValueError, a traceback instead of exit 2
            raise AnalyzeError(f"max lengths: {value} is not below 2^63")
        out.add(value)
    return sorted(out)


def parse_algorithms(spec, dp_size: int) -> list[str]:
    """Default: nf (keeps data order) and obfd, plus ogbfd when ``dp_size > 1``; ``"all"`` for every one."""
    if spec is None or spec == "default":
        return ["nf", "obfd"] + (["ogbfd"] if dp_size > 1 else [])
    items = [s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    if items == ["all"]:
        return list(ALGORITHMS)
    for item in items:
        if item not in ALGORITHMS:
            raise AnalyzeError(f"unknown algorithm {item!r}; allowed: {', '.join(ALGORITHMS)} (or 'all')")
    if not items:
        raise AnalyzeError("algorithms: empty list")
    return list(dict.fromkeys(items))


def simulate(lengths: np.ndarray, max_lengths: list[int], algorithms: list[str], *, overlong: str = "drop",
             dp_size: int = 1, cost: str = "attention", progress: bool | None = None) -> list[dict]:
    """One row per (max length, algorithm), from ``packkit.plan`` on the whole array.

    ``packs`` counts rows including the empty rows that pad the last data-parallel step
    (``empty_packs``); ``efficiency = kept_tokens / (packs * max_length)`` as in ``Plan.efficiency``;
    ``samples_per_pack`` = samples not dropped / packs; ``lost_samples`` = dropped + truncated.
    """
    n = int(lengths.size)
    rows = []
    with bar(progress, total=len(max_lengths) * len(algorithms), desc="packing", unit="plans") as pbar:
        for capacity in max_lengths:
            for algorithm in algorithms:
                start = time.perf_counter()
                p = plan(lengths, capacity, algorithm=algorithm, overlong=overlong, dp_size=dp_size, cost=cost)
                seconds = time.perf_counter() - start
                dropped, truncated = len(p.dropped), len(p.truncated)
                kept_samples = n - dropped
                row = {
                    "max_length": int(capacity), "algorithm": algorithm,
                    "packs": p.num_bins, "lower_bound": p.lower_bound,
                    "efficiency": p.efficiency,
                    "samples_per_pack": kept_samples / p.num_bins if p.num_bins else 0.0,
                    "segments_per_pack": p.num_segments / p.num_bins if p.num_bins else 0.0,
                    "kept_samples": kept_samples, "kept_tokens": p.kept_tokens,
                    "dropped": dropped, "dropped_fraction": dropped / n,
                    "dropped_tokens": int(lengths[p.dropped].sum()),
                    "truncated": truncated, "truncated_tokens": int((lengths[p.truncated] - capacity).sum()),
                    "split": len(p.split), "zero_length": len(p.zero_length), "empty_packs": p.empty_bins,
                    "lost_samples": dropped + truncated, "lost_fraction": (dropped + truncated) / n,
                    "dp_size": dp_size,
                    "steps": p.num_steps if dp_size > 1 else None,
                    "balance": p.balance if dp_size > 1 else None,
                    "rank_balance": p.rank_balance if dp_size > 1 else None,
                    "seconds": seconds,
                }
                rows.append(row)
                del p
                pbar.update(1)
    return rows


def padding_baseline(lengths: np.ndarray, max_lengths: list[int], micro_batch_size: int, seed: int = 0,
                     sorted_lengths: np.ndarray | None = None) -> list[dict]:
    """Padding without packing, per max length: every sample kept (truncated to the max length), shuffled
    with ``seed``, micro-batches of ``micro_batch_size`` padded to their longest sample (dynamic padding,
    as ``DataCollatorWithPadding``). ``efficiency`` = real tokens / padded token slots.

    One shuffle and one pass for the micro-batch maxima serve every max length (the longest clipped
    sample of a batch is min(longest, max length)); real tokens come from the sorted lengths."""
    n = int(lengths.size)
    shuffled = np.array(lengths, dtype=np.int64, copy=True)
    np.random.default_rng(seed).shuffle(shuffled)
    full = n // micro_batch_size * micro_batch_size
    batch_max = shuffled[:full].reshape(-1, micro_batch_size).max(axis=1)
    tail_max = int(shuffled[full:].max()) if full < n else 0
    del shuffled
    if sorted_lengths is None:
        sorted_lengths = np.sort(lengths)
    prefix = np.concatenate(([0], np.cumsum(sorted_lengths)))
    rows = []
    for capacity in max_lengths:
        slots = int(np.minimum(batch_max, capacity).sum()) * micro_batch_size + min(tail_max, capacity) * (n - full)
        below = int(np.searchsorted(sorted_lengths, capacity, side="right"))  # samples <= capacity
        tokens = int(prefix[below]) + capacity * (n - below)
        rows.append({"max_length": int(capacity), "micro_batch_size": micro_batch_size,
                     "rows": n, "token_slots": slots, "tokens": tokens,
                     "efficiency": tokens / slots if slots else 1.0,
                     "truncated": n - below})
    return rows
