"""Draws the benchmark figures of docs/benchmarks.md from benchmarks/results/*.json.

    python benchmarks/plots.py [--results benchmarks/results] [--out docs/img]

One PNG per benchmark: the planner against lightbinpack (plan_cpu.json), plan + pack against other
packers (pack_cpu.json), whole-dataset packing against TRL (dataset_cpu.json). Times are log-scaled:
the systems differ by up to two orders of magnitude.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PACKKIT, OTHER = "#1f77b4", "#9a9a9a"


def _load(results: Path, name: str) -> dict:
    return json.loads((results / name).read_text())


def _bars(ax, labels, values, unit, colors):
    bars = ax.barh(range(len(labels)), values, color=colors)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"time ({unit}, log scale; lower is better)")
    for bar, value in zip(bars, values):
        ax.text(bar.get_width() * 1.05, bar.get_y() + bar.get_height() / 2, f"{value:,.1f} {unit}", va="center",
                fontsize=8)
    ax.set_xlim(right=max(values) * 6)


def plot_planner(results: Path, out: Path) -> Path:
    data = _load(results, "plan_cpu.json")
    inputs = {i["name"]: i for i in data["inputs"]}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    names = sorted(data["rows"])
    ours, theirs = [], []
    for name in names:
        rows = {r["system"]: r["time_ms"] for r in data["rows"][name]}
        ours.append(rows["packkit obfd (numpy)"])
        theirs.append(rows["lightbinpack obfd (list)"])
    x = range(len(names))
    axes[0].bar([i - 0.2 for i in x], ours, 0.4, color=PACKKIT, label="packkit obfd")
    axes[0].bar([i + 0.2 for i in x], theirs, 0.4, color=OTHER, label="lightbinpack obfd")
    axes[0].set_xticks(list(x), [f"({n}) {inputs[n]['n']:,}" for n in names], fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("plan time (ms, log scale)")
    axes[0].set_title("obfd on inputs (a)-(e)")
    axes[0].legend(fontsize=8)
    lin = data["speed"]["linearity"]
    axes[1].plot([p["n"] / 1e6 for p in lin], [p["time_ms"] for p in lin], "o-", color=PACKKIT)
    axes[1].set_xlabel("items (millions), uniform [1, 4096], capacity 16384")
    axes[1].set_ylabel("obfd plan time (ms)")
    axes[1].set_title("packkit obfd scales linearly")
    axes[1].set_ylim(bottom=0)
    fig.suptitle(f"Planner, {data['machine'].get('date', '')} ({data['machine'].get('cpu_count')}-core CPU)")
    return _save(fig, out / "bench_plan.png")


def plot_pack(results: Path, out: Path) -> Path:
    data = _load(results, "pack_cpu.json")
    rows = data["cpu"]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    _bars(ax, [r["system"] for r in rows], [r["median_s"] * 1e3 for r in rows], "ms",
          [PACKKIT if r["system"].startswith("packkit") else OTHER for r in rows])
    ax.set_title(f"Plan + pack of {data['workload']['sequences']:,} sequences (capacity "
                 f"{data['workload']['capacity']}), {data['machine'].get('date', '')}")
    return _save(fig, out / "bench_pack.png")


def plot_dataset(results: Path, out: Path) -> Path:
    data = _load(results, "dataset_cpu.json")
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    for ax, n in zip(axes, sorted({r["sequences"] for r in data["results"]})):
        rows = [r for r in data["results"] if r["sequences"] == n]
        _bars(ax, [r["system"] for r in rows], [r["median_s"] * 1e3 for r in rows], "ms",
              [PACKKIT if r["system"].startswith("packkit") else OTHER for r in rows])
        ax.set_title(f"{n:,} sequences")
    fig.suptitle(f"Whole-dataset packing, seq_length {data['seq_length']}, {data['machine'].get('date', '')}")
    return _save(fig, out / "bench_dataset.png")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # No timestamp in the PNG, so the committed figures change only when the data does.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    paths = [plot(args.results, args.out) for plot in (plot_planner, plot_pack, plot_dataset)]
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
