"""Length statistics: count, mean, percentiles (numpy's linear interpolation), max, histogram."""
from __future__ import annotations

import numpy as np

PERCENTILES = {"p10": 10, "p25": 25, "median": 50, "p75": 75, "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}


def percentile(sorted_lengths: np.ndarray, q: float) -> float:
    """numpy's default ("linear") percentile of an ascending array, without re-partitioning it."""
    n = sorted_lengths.size
    position = q / 100 * (n - 1)
    lo = int(np.floor(position))
    hi = min(lo + 1, n - 1)
    a, b = float(sorted_lengths[lo]), float(sorted_lengths[hi])
    return a + (b - a) * (position - lo)


def histogram(sorted_lengths: np.ndarray, bins: int = 60) -> dict:
    """Counts of positive lengths in ``bins`` bins; log-spaced integer edges when the data is skewed
    (max > 20 x median), linear otherwise. Zero lengths are counted apart (``zero_length``).
    ``sorted_lengths`` must be ascending."""
    positive = sorted_lengths[np.searchsorted(sorted_lengths, 1):]
    if positive.size == 0:
        return {"scale": "linear", "bin_edges": [0, 1], "counts": [0]}
    lo, hi = int(positive[0]), int(positive[-1])
    median = percentile(positive, 50)
    if hi > 20 * max(median, 1) and hi > lo:
        edges = np.unique(np.round(np.geomspace(lo, hi + 1, bins + 1))).astype(np.int64)
        scale = "log"
    else:
        edges = np.unique(np.round(np.linspace(lo, hi + 1, bins + 1))).astype(np.int64)
        scale = "linear"
    if edges.size < 2:
        edges = np.array([lo, hi + 1], dtype=np.int64)
    counts = np.diff(np.searchsorted(positive, edges, side="left"))
    return {"scale": scale, "bin_edges": edges.tolist(), "counts": counts.astype(np.int64).tolist()}


def dataset_stats(lengths: np.ndarray, *, sorted_lengths: np.ndarray | None = None, bins: int = 60) -> dict:
    """Statistics of an int64 length array (must be non-empty). Histogram bins are ``[edge_i, edge_{i+1})``.
    ``sorted_lengths`` (ascending) saves the one sort this needs."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if sorted_lengths is None:
        sorted_lengths = np.sort(lengths)
    out = {
        "count": int(lengths.size),
        "total_tokens": int(lengths.sum()),
        "mean": float(lengths.mean()),
        "std": float(lengths.std()),
        "min": int(sorted_lengths[0]),
        "max": int(sorted_lengths[-1]),
    }
    out.update({name: percentile(sorted_lengths, q) for name, q in PERCENTILES.items()})
    out["zero_length"] = int(np.searchsorted(sorted_lengths, 1))
    out["histogram"] = histogram(sorted_lengths, bins)
    return out
