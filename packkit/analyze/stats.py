"""Length statistics: count, mean, percentiles (numpy's linear interpolation), max, histogram."""
from __future__ import annotations

import numpy as np

PERCENTILES = {"p10": 10, "p25": 25, "median": 50, "p75": 75, "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}


def histogram(lengths: np.ndarray, bins: int = 60) -> dict:
    """Counts of positive lengths in ``bins`` bins; log-spaced integer edges when the data is skewed
    (max > 20 x median), linear otherwise. Zero lengths are counted apart (``zero_length``)."""
    positive = lengths[lengths > 0]
    if positive.size == 0:
        return {"scale": "linear", "bin_edges": [0, 1], "counts": [0]}
    lo, hi = int(positive.min()), int(positive.max())
    median = float(np.median(positive))
    if hi > 20 * max(median, 1) and hi > lo:
        edges = np.unique(np.round(np.geomspace(lo, hi + 1, bins + 1))).astype(np.int64)
        scale = "log"
    else:
        edges = np.unique(np.round(np.linspace(lo, hi + 1, bins + 1))).astype(np.int64)
        scale = "linear"
    if edges.size < 2:
        edges = np.array([lo, hi + 1], dtype=np.int64)
    counts, _ = np.histogram(positive, bins=edges)
    return {"scale": scale, "bin_edges": edges.tolist(), "counts": counts.astype(np.int64).tolist()}


def dataset_stats(lengths: np.ndarray, *, bins: int = 60) -> dict:
    """Statistics of an int64 length array (must be non-empty). Bins are ``[edge_i, edge_{i+1})``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    values = np.percentile(lengths, list(PERCENTILES.values()))
    out = {
        "count": int(lengths.size),
        "total_tokens": int(lengths.sum()),
        "mean": float(lengths.mean()),
        "std": float(lengths.std()),
        "min": int(lengths.min()),
        "max": int(lengths.max()),
    }
    out.update({name: float(v) for name, v in zip(PERCENTILES, values)})
    out["zero_length"] = int(np.count_nonzero(lengths == 0))
    out["histogram"] = histogram(lengths, bins)
    return out
