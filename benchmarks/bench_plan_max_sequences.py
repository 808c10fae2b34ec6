"""CPU benchmark of the planner's ``max_sequences`` bin constraint (issue 62: obfd within 1.2x of obfd without it).

Run from the repository root::

    python benchmarks/bench_plan_max_sequences.py             # 9 repeats, 1M lengths
    python benchmarks/bench_plan_max_sequences.py --quick     # smoke: 3 repeats, 200k lengths, writes nothing

Input: seed 001's profile (lognormal, median 864, sigma 0.932, clipped to [1, 16384]; numpy seed 1), capacity 16384
(about 19 documents a row on average: N=8 and 16 bind on most rows, N=64 on the rows of short documents). The
cases run interleaved, one repeat of each in turn, so the shared machine's load falls on every case alike; times
are medians, ``ratio`` is a case's median / the unconstrained median. ogbfd (dp 8, attention cost) with and
without N=16 for its step balancing under the constraint (3 repeats). Results: benchmarks/results/
plan_max_sequences_cpu.json (``--out`` overrides).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

import numpy as np

import packkit

import _results

CAPACITY = 16384
LIMITS = (None, 8, 16, 64)


def seed001_lengths(n: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    return np.clip(np.round(np.exp(rng.normal(np.log(864), 0.932, n))), 1, CAPACITY).astype(np.int64)


def once(fn):
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    n = 200_000 if args.quick else 1_000_000
    repeats = args.repeats or (3 if args.quick else 9)
    lengths = seed001_lengths(n)
    load_before = os.getloadavg()[0]
    packkit.plan(lengths, CAPACITY)  # warm-up (first-call allocations)
    times = {m: [] for m in LIMITS}
    rows = {}
    for _ in range(repeats):
        for m in LIMITS:
            dt, p = once(lambda m=m: packkit.plan(lengths, CAPACITY, max_sequences=m))
            times[m].append(dt)
            rows[m] = (p.num_bins, int(np.diff(p.segments.bin_offsets).max()))
            del p
    base = statistics.median(times[None])
    obfd = [{"max_sequences": m, "median_ms": 1e3 * statistics.median(times[m]), "rows": rows[m][0],
             "most_per_row": rows[m][1], "ratio": statistics.median(times[m]) / base,
             "times_ms": [round(1e3 * t, 2) for t in times[m]]} for m in LIMITS]
    ogbfd = []
    for m in (None, 16):
        ts, p = [], None
        for _ in range(3):
            dt, p = once(lambda m=m: packkit.plan(lengths, CAPACITY, algorithm="ogbfd", dp_size=8, cost="attention",
                                                  max_sequences=m))
            ts.append(dt)
        ogbfd.append({"max_sequences": m, "median_ms": 1e3 * statistics.median(ts), "rows": p.num_bins,
                      "most_per_row": int(np.diff(p.segments.bin_offsets).max()), "attention_balance": p.balance})
        del p
    print(f"### obfd, {n:,} seed-001 lengths, cap {CAPACITY} ({repeats} repeats, load {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")
    print("| max_sequences | median ms | ratio | rows | most per row |\n|---|---|---|---|---|")
    for r in obfd:
        print(f"| {r['max_sequences']} | {r['median_ms']:.1f} | {r['ratio']:.3f} | {r['rows']} | {r['most_per_row']} |")
    print("\n| ogbfd dp8 attention, max_sequences | median ms | rows | most per row | balance |\n|---|---|---|---|---|")
    for r in ogbfd:
        print(f"| {r['max_sequences']} | {r['median_ms']:.1f} | {r['rows']} | {r['most_per_row']} | "
              f"{r['attention_balance']:.6f} |")
    worst = max(r["ratio"] for r in obfd)
    print(f"\ntarget: obfd with max_sequences within 1.2x of obfd without: worst ratio {worst:.3f} -> "
          f"{'met' if worst <= 1.2 else 'MISSED'}")
    doc = {"machine": _results.machine_info(load_1min=[load_before, os.getloadavg()[0]]), "n": n,
           "capacity": CAPACITY, "repeats": repeats, "obfd": obfd, "ogbfd_dp8_attention": ogbfd,
           "target_within_1_2x": worst <= 1.2}
    _results.write_results(doc, "plan_max_sequences_cpu.json", args.out, args.quick)


if __name__ == "__main__":
    main()
