"""Pipeline parallelism (issue 61): packkit.plan_pipeline against baselines, every plan timed by the same simulator
(packkit.planning.pp_simulate, 1F1B, p2p 0). Step time = the slowest DP rank's pipeline. Ratios are of medians
over the steps. Baselines (each given the same number of micro-batches m per DP rank):

* pad-to-longest MFFD (NeMo-RL style): first-fit-decreasing by tokens into dp * m rows, every micro-batch padded to
  the longest row's tokens (padding costs a * pad);
* equal-count: documents in data order, the same number per micro-batch (capacity ignored: its best case);
* data-order next-fit rows dealt round-robin to ranks;
* packkit.plan(algorithm="ogbfd") rows (cost-balanced across DP), in data order per rank (its own count of rows
  per rank, one per step: the rows packkit fed a pipeline before plan_pipeline).

Not in this run (issue 61 asks for them): verl's rearrange_micro_batches and a WLB-LLM outlier delay (not written
in the time this session had).

    python benchmarks/bench_pipeline.py [--steps 200] [--quick]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

import _results
import packkit
from packkit.planning import pp_simulate

COST = (1.0, 1.0 / 4096)  # a * len + b * len**2: attention equals the linear part at 4,096 tokens
WORKLOADS = {  # name: (median, sigma, cap, documents per DP rank, capacity)
    "long-tail": (2000, 1.2, 131072, 64, 131072),
    "sft-short": (1200, 0.6, 16384, 48, 16384),
    "moe-rl": (3000, 0.8, 32768, 64, 65536),
}


def draw(rng, name, dp):
    med, sig, cap, per, capacity = WORKLOADS[name]
    return np.minimum(rng.lognormal(np.log(med), sig, per * dp).astype(np.int64) + 1, cap), capacity


def doc_cost(x):
    x = np.asarray(x, dtype=np.float64)
    return COST[0] * x + COST[1] * x * x


def step_time(rank_rows, pp, pad_to=None):
    times = []
    for rows in rank_rows:
        fwd = [doc_cost(r).sum() + (COST[0] * (pad_to - sum(r)) if pad_to else 0.0) for r in rows]
        times.append(pp_simulate(forward=fwd, pp_size=pp).makespan)
    return max(times)


def ffd(lengths, capacity, k):
    rows, load = [[] for _ in range(k)], [0] * k
    for x in sorted(lengths.tolist(), reverse=True):
        j = next((i for i in range(k) if load[i] + x <= capacity), None)
        if j is None:
            return None
        rows[j].append(x)
        load[j] += x
    return rows


def baselines(lengths, capacity, pp, dp, m):
    out = {}
    f = ffd(lengths, capacity, dp * m)
    if f is not None:
        out["pad-to-longest MFFD"] = step_time([f[i::dp] for i in range(dp)], pp, pad_to=max(map(sum, f)))
    chunks = np.array_split(lengths, dp * m)
    out["equal-count"] = step_time([[c.tolist() for c in chunks[i::dp]] for i in range(dp)], pp)
    rows, cur = [], []
    for x in lengths.tolist():
        if cur and sum(cur) + x > capacity:
            rows.append(cur)
            cur = []
        cur.append(x)
    rows.append(cur)
    if len(rows) == dp * m:
        out["data-order rows"] = step_time([rows[i::dp] for i in range(dp)], pp)
    g = packkit.plan(lengths, capacity, algorithm="ogbfd", dp_size=dp, cost=COST)
    rank_rows = [[[int(lengths[i]) for i in b] for b in g.rank_bins(r)] for r in range(dp)]
    out["ogbfd rows"] = step_time(rank_rows, pp)  # its own row count (one per step): the rows it would feed
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    steps = 5 if args.quick else args.steps
    rng = np.random.default_rng(0)
    rows_out = []
    print("| workload | pp | dp | m | packkit / bound | vs any plan | best baseline / packkit | pad-MFFD / packkit |"
          " step CV packkit | step CV pad-MFFD |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in WORKLOADS:
        for pp, dp in ((2, 8), (4, 8), (8, 4)):
            m = 4 * pp
            ours, bound, dbound, base = [], [], [], {}
            for _ in range(steps):
                lengths, capacity = draw(rng, name, dp)
                p = packkit.plan_pipeline(lengths, capacity, pp_size=pp, dp_size=dp, num_microbatches=m, cost=COST)
                ours.append(p.makespan), bound.append(p.lower_bound), dbound.append(p.data_bound)
                for k, v in baselines(lengths, capacity, pp, dp, m).items():
                    base.setdefault(k, []).append(v)
            med = statistics.median(ours)
            ratios = {k: statistics.median(v) / med for k, v in base.items()}
            cv = lambda v: statistics.pstdev(v) / statistics.mean(v)  # noqa: E731
            worst = max(o / b for o, b in zip(ours, bound))
            row = {"workload": name, "pp": pp, "dp": dp, "m": m, "steps": steps,
                   "median_over_bound": med / statistics.median(bound), "worst_step_over_bound": worst,
                   "median_over_data_bound": med / statistics.median(dbound), "baseline_over_packkit": ratios,
                   "cv_packkit": cv(ours), "cv_pad_mffd": cv(base["pad-to-longest MFFD"]) if "pad-to-longest MFFD" in base else None}
            rows_out.append(row)
            best = min(ratios.values()) if ratios else float("nan")
            pad = ratios.get("pad-to-longest MFFD", float("nan"))
            print(f"| {name} | {pp} | {dp} | {m} | {row['median_over_bound']:.3f} (worst {worst:.3f}) | "
                  f"{row['median_over_data_bound']:.3f} | {best:.3f} | {pad:.3f} | {100 * row['cv_packkit']:.1f}% | "
                  f"{100 * (row['cv_pad_mffd'] or float('nan')):.1f}% |")
    lengths = np.minimum(rng.lognormal(np.log(2000), 1.2, 4096).astype(np.int64) + 1, 131072)
    median, _, _ = _results.timed(lambda: packkit.plan_pipeline(lengths, 131072, pp_size=8, dp_size=64, cost=COST), 5)
    print(f"\nplanning 4,096 documents at pp 8 x dp 64: {1e3 * median:.1f} ms (median of 5)")
    doc = {"machine": _results.machine_info(), "steps": steps, "rows": rows_out, "plan_ms_4096_pp8_dp64": 1e3 * median}
    _results.write_results(doc, "pipeline_cpu.json", args.out, args.quick)


if __name__ == "__main__":
    main()
