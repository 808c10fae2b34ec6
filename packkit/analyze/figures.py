"""PNG figures (matplotlib's Agg canvas directly: no pyplot, no change to the global backend)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import require

FIGURES = {
    "length_distribution": "figures/length_distribution.png",
    "efficiency": "figures/efficiency_vs_max_length.png",
    "dropped": "figures/dropped_vs_max_length.png",
}
_COLORS = {"nf": "#d62728", "ffd": "#9467bd", "bfd": "#8c564b", "obfd": "#1f77b4", "ogbfd": "#2ca02c"}
_STYLES = {"nf": ("o", "-"), "ffd": ("v", "-"), "bfd": ("^", "-"), "obfd": ("o", "-"), "ogbfd": ("x", "--")}


def _tokens(x: float, _pos=None) -> str:
    """Tick label for a token count: 512, 2k, 16k (16384 = 16 x 1024), 1.5M."""
    if x >= 1024 and float(x).is_integer() and (int(x) & (int(x) - 1)) == 0:
        return f"{int(x) // 1024:,}k"
    if x >= 1e6:
        return f"{x / 1e6:g}M"
    if x >= 1000:
        return f"{x / 1000:g}k" if x % 1000 == 0 or x >= 10_000 else f"{x / 1000:.1f}k"
    return f"{x:g}"


def _formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, pos: _tokens(x))


def _log2_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, pos: _tokens(round(x))))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _new_figure(width: float, height: float, ncols: int = 1):
    require("matplotlib", "matplotlib", "figures (or pass --no-figures)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols)
    return fig, axes


def _mark(ax, x: float, label: str, color: str, style: str = "--") -> None:
    ax.axvline(x, color=color, linestyle=style, linewidth=1, label=label)


def length_distribution(sorted_lengths: np.ndarray, stats: dict, recommended: int | None, path: Path) -> None:
    fig, (hist_ax, cdf_ax) = _new_figure(11, 4.2, 2)
    h = stats["histogram"]
    edges = np.asarray(h["bin_edges"], dtype=float)
    hist_ax.stairs(h["counts"], edges, fill=True, color="#1f77b4", alpha=0.75)
    if h["scale"] == "log":
        hist_ax.set_xscale("log")
        hist_ax.xaxis.set_major_formatter(_formatter())
    hist_ax.set_xlabel("sample length (tokens)")
    hist_ax.set_ylabel("samples per bin")
    hist_ax.set_title(f"{stats['count']:,} samples, {stats['total_tokens']:,} tokens")
    q = np.linspace(0, 1, 2001)
    idx = np.minimum((q * (len(sorted_lengths) - 1)).round().astype(np.int64), len(sorted_lengths) - 1)
    cdf_ax.plot(np.maximum(sorted_lengths[idx], 1), q, color="#1f77b4")
    cdf_ax.set_xscale("log")
    cdf_ax.xaxis.set_major_formatter(_formatter())
    cdf_ax.set_ylim(0, 1.0)
    cdf_ax.set_xlabel("sample length (tokens)")
    cdf_ax.set_ylabel("fraction of samples <= length")
    cdf_ax.set_title("CDF")
    cdf_ax.grid(alpha=0.3)
    for ax in (hist_ax, cdf_ax):
        _mark(ax, max(stats["median"], 1), f"median {stats['median']:,.0f}", "#555555", ":")
        _mark(ax, max(stats["p99"], 1), f"p99 {stats['p99']:,.0f}", "#ff7f0e", ":")
        if recommended:
            _mark(ax, recommended, f"recommended max length {recommended:,}", "#2ca02c")
    cdf_ax.legend(loc="lower right", fontsize=8)
    fig.savefig(path)


def efficiency_vs_max_length(rows: list[dict], padding: list[dict], target: float, recommended: dict | None,
                             path: Path) -> None:
    fig, ax = _new_figure(7.5, 4.5)
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        pts = sorted((r["max_length"], r["efficiency"]) for r in rows if r["algorithm"] == algorithm)
        marker, style = _STYLES.get(algorithm, ("o", "-"))
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker=marker, linestyle=style, label=algorithm,
                color=_COLORS.get(algorithm), markersize=7 if marker == "x" else 5)
    if padding:
        ax.plot([p["max_length"] for p in padding], [100 * p["efficiency"] for p in padding], marker="s",
                linestyle="--", color="#7f7f7f", label=f"padding (micro-batch {padding[0]['micro_batch_size']})")
    ax.axhline(100 * target, color="#555555", linestyle=":", linewidth=1, label=f"target {target:.1%}")
    if recommended:
        ax.plot([recommended["max_length"]], [100 * recommended["efficiency"]], marker="*", markersize=16,
                color="#ffbf00", markeredgecolor="black", linestyle="none",
                label=f"recommended {recommended['max_length']:,} ({recommended['algorithm']})")
    _log2_axis(ax)
    ax.set_xlabel("max length (tokens per row)")
    ax.set_ylabel("efficiency (% of row tokens used)")
    ax.set_title("Packing efficiency vs max length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path)


def dropped_vs_max_length(rows: list[dict], num_samples: int, budget: float, overlong: str,
                          recommended: dict | None, path: Path) -> None:
    fig, ax = _new_figure(7.5, 4.5)
    first = rows[0]["algorithm"]
    pts = sorted((r["max_length"], r["dropped"], r["truncated"], r["split"]) for r in rows if r["algorithm"] == first)
    xs = [p[0] for p in pts]
    label = {"drop": "samples dropped", "truncate": "samples truncated", "split": "samples split"}[overlong]
    ys = [p[1] + p[2] if overlong != "split" else p[3] for p in pts]
    ax.plot(xs, ys, marker="o", color="#d62728", label=label)
    if overlong != "split":
        ax.axhline(budget * num_samples, color="#555555", linestyle=":", linewidth=1,
                   label=f"budget {budget:.2%} = {budget * num_samples:,.0f} samples")
    if recommended:
        _mark(ax, recommended["max_length"], f"recommended {recommended['max_length']:,}", "#2ca02c")
    _log2_axis(ax)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(bottom=0, top=max(max(ys), budget * num_samples, 1) * 2)
    ax.set_xlabel("max length (tokens per row)")
    ax.set_ylabel(f"{label} (of {num_samples:,})")
    ax.set_title(f"Samples longer than the max length (policy: {overlong})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path)


def write_figures(out: Path, sorted_lengths: np.ndarray, stats: dict, rows: list[dict], padding: list[dict],
                  recommendations: dict, *, target: float, budget: float, overlong: str) -> list[str]:
    """Writes the three figures under ``out`` and returns their paths relative to ``out``.
    ``sorted_lengths``: the lengths in ascending order (for the CDF)."""
    (out / "figures").mkdir(parents=True, exist_ok=True)
    rec = recommendations.get("recommended")
    length_distribution(sorted_lengths, stats, rec["max_length"] if rec else None, out / FIGURES["length_distribution"])
    efficiency_vs_max_length(rows, padding, target, rec, out / FIGURES["efficiency"])
    dropped_vs_max_length(rows, stats["count"], budget, overlong, rec, out / FIGURES["dropped"])
    return list(FIGURES.values())
