"""CPU benchmark of ``packkit.plan`` against lightbinpack and binpacking.

Run from the repository root::

    python benchmarks/bench_plan.py            # full run, 5 repeats
    python benchmarks/bench_plan.py --quick    # smoke run: 2 repeats, input (a) shrunk to 200k
    python benchmarks/bench_plan.py --repeats 9 --out /tmp/plan_cpu.json

Inputs (fixed seeds): (a) 1M uniform [1, 4096], capacity 16384; (b) ~100k lognormal
(median 864, sigma 0.932, lengths > 20000 dropped), capacity 20000; (c) 10k uniform [1, 4096],
capacity 4096. Times are the median of the repeats (``gc.collect()`` before each); inputs in
list/tensor form are built before timing. ``bins`` counts non-empty bins and ``efficiency`` is
``sum(lengths) / (bins * capacity)``. ``dup/missing`` counts extra occurrences / absent input
indices in a system's output (binpacking returns values, not indices: its output is checked as a
multiset instead). On (b) the grouped (``ogbfd``, dp=8) rows report, with one helper for every
system, per-step balance (sum over steps of max rank cost / sum over steps of mean rank cost) and
epoch rank balance (max / mean of each rank's total cost) under attention (sum len^2) and token cost.
Results go to ``benchmarks/results/plan_cpu.json`` (``--out`` overrides).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import packkit

try:
    import lightbinpack
except ImportError:
    lightbinpack = None
    print("lightbinpack not importable: skipping its rows and the targets that need it")
try:
    import binpacking
except ImportError:
    binpacking = None
    print("binpacking not importable: skipping its rows")

DP = 8
LBP_OBFD = "lightbinpack obfd (list)"
PK_OBFD = "packkit obfd (numpy)"
PK_OBFD_TENSOR = "packkit obfd (tensor)"
PK_OGBFD_ATTN = "packkit ogbfd dp8 attention"
LBP_OGBFD = "lightbinpack ogbfd dp8 (list)"


def tokens_cost(lens: np.ndarray) -> float:
    return float(lens.sum())


def attention_cost(lens: np.ndarray) -> float:
    return float((lens * lens).sum())


COSTS = {"tokens": tokens_cost, "attention": attention_cost}


def make_inputs(quick: bool) -> list[dict]:
    n_a = 200_000 if quick else 1_000_000
    a = np.random.default_rng(0).integers(1, 4097, n_a).astype(np.int64)
    rng = np.random.default_rng(1)
    b = np.round(np.exp(rng.normal(np.log(864), 0.932, 100_000))).astype(np.int64)
    b = np.maximum(b, 1)
    b = b[b <= 20000]
    c = np.random.default_rng(2).integers(1, 4097, 10_000).astype(np.int64)
    return [
        {"name": "a", "desc": f"{n_a:,} uniform [1,4096], cap 16384", "lengths": a, "capacity": 16384},
        {"name": "b", "desc": f"{len(b):,} lognormal (<=20000), cap 20000", "lengths": b, "capacity": 20000},
        {"name": "c", "desc": "10,000 uniform [1,4096], cap 4096", "lengths": c, "capacity": 4096},
    ]


def median_ms(fn, repeats: int):
    """Median wall time of ``fn()`` in ms, and the last call's result."""
    times, out = [], None
    for _ in range(repeats):
        out = None
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, out


def _materialise(p):
    p.bins
    return p


def systems(inp: dict) -> list[tuple[str, object, int]]:
    """(name, zero-argument callable, repeats override or 0) for every system run on ``inp``."""
    arr, cap = inp["lengths"], inp["capacity"]
    lst, ten = arr.tolist(), torch.from_numpy(arr.copy())
    rows = [
        (PK_OBFD, lambda: packkit.plan(arr, cap), 0),
        ("packkit obfd (list)", lambda: packkit.plan(lst, cap), 0),
        (PK_OBFD_TENSOR, lambda: packkit.plan(ten, cap), 0),
        ("packkit obfd+bins (numpy)", lambda: _materialise(packkit.plan(arr, cap)), 0),
    ]
    rows += [(f"packkit {alg} (numpy)", lambda alg=alg: packkit.plan(arr, cap, algorithm=alg), 0)
             for alg in ("nf", "ffd", "bfd")]
    if lightbinpack is not None:
        rows.append((LBP_OBFD, lambda: lightbinpack.obfd(lst, cap), 0))
    if binpacking is not None and inp["name"] == "c":  # pure Python, O(n * bins): minutes on (a) and (b)
        rows.append(("binpacking ffd (list)", lambda: binpacking.to_constant_volume(lst, cap), 1))
    if inp["name"] == "b":
        rows += [(f"packkit ogbfd dp8 {c}", lambda c=c: packkit.plan(arr, cap, algorithm="ogbfd", dp_size=DP, cost=c), 0)
                 for c in ("tokens", "attention")]
        if lightbinpack is not None:
            rows.append((LBP_OGBFD, lambda: lightbinpack.ogbfd(lst, cap, bins_per_group=DP), 0))
    return rows


def to_bins(out, dp: int) -> list[np.ndarray]:
    """Any system's output as a flat list of index arrays; bin k is rank k % dp at step k // dp."""
    if isinstance(out, packkit.Plan):
        return list(out.bins)
    if out and out[0] and isinstance(out[0][0], list):  # grouped output: one list of bins per step
        flat = []
        for group in out:
            flat += list(group) + [[]] * (-len(group) % dp)
        out = flat
    bins = [np.asarray(b, dtype=np.int64) for b in out]
    return bins + [np.zeros(0, np.int64)] * (-len(bins) % dp)


def balance_stats(bins: list[np.ndarray], dp: int, lengths: np.ndarray, cost) -> tuple[float, float]:
    """(per-step balance, epoch rank balance) of ``bins`` laid out step-major over ``dp`` ranks."""
    costs = np.array([cost(lengths[b]) for b in bins], dtype=np.float64)
    costs = np.concatenate([costs, np.zeros(-len(costs) % dp)]).reshape(-1, dp)
    totals = costs.sum(axis=0)
    return float(costs.max(axis=1).sum() / costs.mean(axis=1).sum()), float(totals.max() / totals.mean())


def check_indices(bins: list[np.ndarray], lengths: np.ndarray, cap: int) -> dict:
    idx = np.concatenate(bins) if bins else np.zeros(0, np.int64)
    counts = np.bincount(idx, minlength=len(lengths))
    loads = np.array([lengths[b].sum() for b in bins])
    return {"duplicates": int((counts[counts > 1] - 1).sum()), "missing": int((counts == 0).sum()),
            "overfull_bins": int((loads > cap).sum())}


def evaluate(name: str, out, inp: dict) -> dict:
    lengths, cap = inp["lengths"], inp["capacity"]
    total = int(lengths.sum())
    if name.startswith("binpacking"):  # bins of values, not indices
        values = np.sort(np.concatenate([np.asarray(b, dtype=np.int64) for b in out]))
        ok = np.array_equal(values, np.sort(lengths)) and all(sum(b) <= cap for b in out)
        row = {"bins": len(out), "duplicates": None, "missing": None, "overfull_bins": None, "multiset_ok": bool(ok)}
    else:
        dp = DP if "ogbfd" in name else 1
        bins = to_bins(out, dp)
        row = {"bins": sum(len(b) > 0 for b in bins), **check_indices(bins, lengths, cap)}
        if dp > 1:
            row["steps"] = len(bins) // dp
            for cname, fn in COSTS.items():
                row[f"{cname}_step_balance"], row[f"{cname}_rank_balance"] = balance_stats(bins, dp, lengths, fn)
            if isinstance(out, packkit.Plan):
                c = name.rsplit(" ", 1)[1]
                for mine, theirs in ((row[f"{c}_step_balance"], out.balance), (row[f"{c}_rank_balance"], out.rank_balance)):
                    assert abs(mine - theirs) <= 1e-9 * abs(theirs), (name, mine, theirs)
    row["lower_bound"] = -(-total // cap)
    row["efficiency"] = total / (row["bins"] * cap)
    return row


def run_input(inp: dict, repeats: int) -> list[dict]:
    rows = []
    for name, fn, reps in systems(inp):
        ms, out = median_ms(fn, reps or repeats)
        rows.append({"system": name, "time_ms": ms, "repeats": reps or repeats, **evaluate(name, out, inp)})
        del out
    lbp = next((r["time_ms"] for r in rows if r["system"] == LBP_OBFD), None)
    for r in rows:
        r["vs_lightbinpack"] = lbp / r["time_ms"] if lbp else None
    return rows


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if v < 10 else f"{v:.1f}"
    return str(v)


def print_table(inp: dict, rows: list[dict]) -> None:
    cols = ["system", "time_ms", "vs_lightbinpack", "bins", "lower_bound", "efficiency", "dup/missing"]
    if any("steps" in r for r in rows):
        cols += ["steps", "attention_step_balance", "attention_rank_balance", "tokens_step_balance", "tokens_rank_balance"]
    print(f"\n### ({inp['name']}) {inp['desc']}\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    for r in rows:
        cells = []
        for c in cols:
            if c == "dup/missing":
                cells.append("-" if r["duplicates"] is None else f"{r['duplicates']}/{r['missing']}")
            elif c == "time_ms":
                cells.append(f"{r['time_ms']:.2f}")
            elif c == "vs_lightbinpack":
                cells.append("-" if r[c] is None else f"{r[c]:.3g}x")
            else:
                cells.append(fmt(r.get(c)))
        print("| " + " | ".join(cells) + " |")
    if inp["name"] in ("a", "b") and binpacking is not None:
        print("| binpacking ffd (list) | skipped (too slow) | | | | | |")
    for r in rows:
        if r.get("overfull_bins") or r.get("multiset_ok") is False:
            print(f"WARNING: {r['system']} output is invalid: {r}")


def targets(results: dict[str, list[dict]]) -> list[dict]:
    def row(inp, system):
        return next((r for r in results[inp] if r["system"] == system), None)

    out = []

    def add(name, ok, detail):
        status = "SKIP" if ok is None else ("PASS" if ok else "MISS")
        out.append({"target": name, "status": status, "detail": detail})

    lbp = row("a", LBP_OBFD)
    for system in (PK_OBFD, PK_OBFD_TENSOR):
        pk = row("a", system)
        if lbp is None:
            add(f"(1) (a) {system} >= 5x lightbinpack obfd, bins <=", None, "lightbinpack missing")
            continue
        speed = lbp["time_ms"] / pk["time_ms"]
        add(f"(1) (a) {system} >= 5x lightbinpack obfd, bins <=", speed >= 5 and pk["bins"] <= lbp["bins"],
            f"{pk['time_ms']:.2f} ms vs {lbp['time_ms']:.2f} ms = {speed:.2f}x; bins {pk['bins']} vs {lbp['bins']}")
    for name in results:
        pk, lbp = row(name, PK_OBFD), row(name, LBP_OBFD)
        add(f"(2) ({name}) packkit obfd bins <= lightbinpack obfd bins", None if lbp is None else pk["bins"] <= lbp["bins"],
            f"{pk['bins']} vs {'-' if lbp is None else lbp['bins']} (lower bound {pk['lower_bound']})")
    pk, lbp = row("b", PK_OGBFD_ATTN), row("b", LBP_OGBFD)
    rb, sb = pk["attention_rank_balance"], pk["attention_step_balance"]
    lrb, lsb = ("-", "-") if lbp is None else (f"{lbp['attention_rank_balance']:.6f}", f"{lbp['attention_step_balance']:.6f}")
    ok = None if lbp is None else rb <= 1.003 and rb <= lbp["attention_rank_balance"]
    add("(3) (b) packkit ogbfd dp8 attention: epoch rank balance (attention) <= 1.003 and <= lightbinpack ogbfd", ok,
        f"rank balance {rb:.6f} vs lightbinpack {lrb}; per-step balance (info) {sb:.6f} vs {lsb}")
    return out


def machine_info() -> dict:
    return {"processor": platform.processor(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0], "numpy": np.__version__, "torch": torch.__version__,
            "packkit": getattr(packkit, "__version__", None),
            "lightbinpack": getattr(lightbinpack, "__version__", None) if lightbinpack else None,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per system (default 5, 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 repeats, input (a) shrunk to 200k")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "plan_cpu.json")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)

    info = machine_info()
    print(f"packkit {info['packkit']} | python {info['python']} | numpy {info['numpy']} | torch {info['torch']} | "
          f"{info['processor'] or info['machine']}, {info['cpu_count']} CPUs | repeats {repeats}{' | quick' if args.quick else ''}")
    results, inputs = {}, make_inputs(args.quick)
    for inp in inputs:
        results[inp["name"]] = run_input(inp, repeats)
        print_table(inp, results[inp["name"]])

    tgt = targets(results)
    print("\n### Targets\n")
    for t in tgt:
        print(f"{t['status']}  {t['target']}: {t['detail']}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"machine": info, "repeats": repeats, "quick": args.quick,
           "inputs": [{"name": i["name"], "desc": i["desc"], "n": len(i["lengths"]), "capacity": i["capacity"],
                       "tokens": int(i["lengths"].sum())} for i in inputs],
           "rows": results, "targets": tgt}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
