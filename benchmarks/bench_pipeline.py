"""Pipeline parallelism (issue 61): packkit.plan_pipeline against baselines, every plan timed by the same simulator
(packkit.planning.pp_simulate, 1F1B, p2p 0). Step time = the slowest DP rank's pipeline. Ratios are of medians
over the steps. Baselines (each given the same number of micro-batches m per DP rank):

* pad-to-longest MFFD (NeMo-RL style): first-fit-decreasing by tokens into dp * m rows, every micro-batch padded to
  the longest row's tokens (padding costs a * pad);
* equal-count: documents in data order, the same number per micro-batch (capacity ignored: its best case);
* data-order next-fit rows dealt round-robin to ranks;
* packkit.plan(algorithm="ogbfd") rows (cost-balanced across DP), in data order per rank (its own count of rows
  per rank, one per step: the rows packkit fed a pipeline before plan_pipeline).

* verl's micro-batching (0.9.1, its own functions): DP ranks by ``get_seqlen_balanced_partitions`` (equal size) on
  ``calculate_workload``, then per rank ``rearrange_micro_batches``' split (Karmarkar-Karp on the workloads into m
  micro-batches, heaviest first); it does not check ``capacity`` per micro-batch (over-capacity rows are counted);
* WLB-LLM-style (written from the OSDI'25 paper, no code published): documents over capacity / 4 wait in a queue (at
  most one step) and leave it one per micro-batch; each step's rows balanced by cost (heaviest into the lightest row
  with room), dealt to ranks the same way, in that order (no order search).

The spread section runs 1,000 consecutive steps of the MoE-RL-like workload (pp 2 x dp 8) for the step-time
coefficient of variation: packkit without and with ``PipelineStepPlanner(max_delay=1)``, pad-to-longest MFFD, verl,
WLB-LLM-style.

    python benchmarks/bench_pipeline.py [--steps 100] [--spread-steps 1000] [--quick]
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


def lpt(items, cost, k, capacity=None, tokens=None):
    """Heaviest first into the lightest of k bins (with room in tokens when capacity is given); None if stranded."""
    bins, load, toks = [[] for _ in range(k)], [0.0] * k, [0] * k
    for i in sorted(range(len(items)), key=lambda i: -cost[i]):
        for j in sorted(range(k), key=lambda j: load[j]):
            if capacity is None or toks[j] + tokens[i] <= capacity:
                break
        else:
            return None
        bins[j].append(items[i])
        load[j] += cost[i]
        toks[j] += tokens[i] if tokens is not None else 0
    return bins


def verl_step(lengths, pp, dp, m, capacity):
    """verl 0.9.1's balancing, its own functions: DP partitions, then rearrange_micro_batches' split and order."""
    import torch
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions

    work = calculate_workload(torch.as_tensor(lengths)).tolist()
    ranks = get_seqlen_balanced_partitions(work, dp, equal_size=True)
    rank_rows, over = [], 0
    for part in ranks:
        w = [work[i] for i in part]
        mbs = get_seqlen_balanced_partitions(w, m, equal_size=False)
        mbs.sort(key=lambda p: sum(w[i] for i in p), reverse=True)  # use_dynamic_bsz_balance's order
        rows = [[int(lengths[part[i]]) for i in p] for p in mbs]
        over += sum(sum(r) > capacity for r in rows)
        rank_rows.append(rows)
    return step_time(rank_rows, pp), over


class WLBStyle:
    """Outlier delay and workload-balanced rows, as WLB-LLM describes them (see the module docstring)."""

    def __init__(self, capacity, dp, m):
        self.capacity, self.dp, self.m, self.queue = capacity, dp, m, []

    def step(self, lengths, pp):
        limit = self.capacity // 4
        out = [x for x in self.queue]  # waited one step: released
        self.queue = []
        outliers = [int(x) for x in lengths if x > limit]
        normal = [int(x) for x in lengths if x <= limit]
        release = max(0, self.dp * self.m - len(out))  # one per micro-batch
        out += outliers[:release]
        self.queue = outliers[release:]
        docs = normal + out
        cost = doc_cost(docs).tolist()
        rows = lpt(docs, cost, self.dp * self.m, self.capacity, docs)
        if rows is None:  # stranded: the queue joins nothing this step (every document in)
            rows = ffd(np.asarray(docs), self.capacity, self.dp * self.m)
        rc = [doc_cost(r).sum() for r in rows]
        ranks = lpt(rows, rc, self.dp)
        return step_time(ranks, pp)


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
    try:
        out["verl rearrange"], over = verl_step(lengths, pp, dp, m, capacity)
        out["verl over-capacity rows"] = over
    except ImportError:
        pass
    return out


def spread(rng, steps, pp=2, dp=8):
    """1,000 consecutive steps of the MoE-RL-like workload: step-time CV per feeding (a window of a longer run: the
    delayed feedings' last held documents are counted, not flushed into a last outsized step)."""
    m = 4 * pp
    draws = [draw(rng, "moe-rl", dp) for _ in range(steps)]
    capacity = draws[0][1]
    delayed = {"packkit max_delay=1": (1, 4.0), "packkit max_delay=2, outlier_factor=2": (2, 2.0),
               "packkit max_delay=3, outlier_factor=2": (3, 2.0)}
    times = {"packkit": [], **{k: [] for k in delayed}, "pad-to-longest MFFD": [], "verl rearrange": [],
             "WLB-LLM-style": []}
    held = {k: packkit.PipelineStepPlanner(capacity, max_delay=d, outlier_factor=f, pp_size=pp, dp_size=dp,
                                           num_microbatches=m, cost=COST) for k, (d, f) in delayed.items()}
    waits = {k: [] for k in delayed}  # steps each document waited
    wlb = WLBStyle(capacity, dp, m)
    for t, (lengths, _) in enumerate(draws):
        times["packkit"].append(packkit.plan_pipeline(lengths, capacity, pp_size=pp, dp_size=dp, num_microbatches=m,
                                                      cost=COST).makespan)
        for k, planner in held.items():
            got = planner.step(lengths)  # the stream goes on: what waits at the end is reported, not flushed
            times[k].append(got.plan.makespan)
            waits[k].extend((t - got.documents[:, 0]).tolist())
        f = ffd(lengths, capacity, dp * m)
        if f is not None:
            times["pad-to-longest MFFD"].append(step_time([f[i::dp] for i in range(dp)], pp, pad_to=max(map(sum, f))))
        try:
            times["verl rearrange"].append(verl_step(lengths, pp, dp, m, capacity)[0])
        except ImportError:
            pass
        times["WLB-LLM-style"].append(wlb.step(lengths, pp))
    out = {}
    for k, v in times.items():
        if v:
            out[k] = {"steps": len(v), "mean": statistics.mean(v), "cv": statistics.pstdev(v) / statistics.mean(v),
                      "min": min(v), "max": max(v)}
            if k in waits:  # how the delay treats the data: share of documents that waited, and the longest wait
                w = np.asarray(waits[k])
                out[k].update(documents=int(w.size), delayed_fraction=float((w > 0).mean()), max_wait=int(w.max()),
                              waiting_at_the_end=len(held[k].pending))
    return out


def planned_steps(rng, name, pp, dp, m, steps):
    """``steps`` draws of a workload, each planned by packkit and fed by every baseline: (packkit's makespans, its
    bounds, its any-plan bounds, {baseline: makespans}); a draw whose tokens m rows per rank cannot hold is left out
    (no plan can)."""
    ours, bound, dbound, base = [], [], [], {}
    for _ in range(steps):
        lengths, capacity = draw(rng, name, dp)
        try:
            p = packkit.plan_pipeline(lengths, capacity, pp_size=pp, dp_size=dp, num_microbatches=m, cost=COST)
        except ValueError:
            continue
        ours.append(p.makespan), bound.append(p.lower_bound), dbound.append(p.data_bound)
        for k, v in baselines(lengths, capacity, pp, dp, m).items():
            base.setdefault(k, []).append(v)
    return ours, bound, dbound, base


SWEEP = ((2, 1, 4), (4, 1, 16), (8, 1, 64), (4, 64, 4), (4, 64, 16), (8, 64, 32), (2, 16, 64))  # (pp, dp, m)


def sweep(rng, steps):
    """The issue's range beyond the main table: dp 1-64, 4-64 micro-batches per step (fewer steps per row: a step at
    dp 64 is 3,072-4,096 documents, and the Python baselines take seconds on it)."""
    out = []
    for name, (_, _, _, per, _) in WORKLOADS.items():
        for pp, dp, m in SWEEP:
            if m > per:  # every micro-batch holds a document: this workload has too few per rank
                continue
            ours, bound, dbound, base = planned_steps(rng, name, pp, dp, m, steps)
            if not ours:
                out.append({"workload": name, "pp": pp, "dp": dp, "m": m, "steps": 0,
                            "skipped": "m rows of capacity per DP rank cannot hold the step's tokens"})
                continue
            med = statistics.median(ours)
            base.pop("verl over-capacity rows", None)
            ratios = {k: statistics.median(v) / med for k, v in base.items()}
            out.append({"workload": name, "pp": pp, "dp": dp, "m": m, "steps": len(ours),
                        "median_over_bound": med / statistics.median(bound),
                        "median_over_data_bound": med / statistics.median(dbound), "baseline_over_packkit": ratios})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--spread-steps", type=int, default=1000)
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
            ours, bound, dbound, base = planned_steps(rng, name, pp, dp, m, steps)
            med = statistics.median(ours)
            over = base.pop("verl over-capacity rows", [])
            ratios = {k: statistics.median(v) / med for k, v in base.items()}
            cv = lambda v: statistics.pstdev(v) / statistics.mean(v)  # noqa: E731
            worst = max(o / b for o, b in zip(ours, bound))
            row = {"workload": name, "pp": pp, "dp": dp, "m": m, "steps": steps,
                   "median_over_bound": med / statistics.median(bound), "worst_step_over_bound": worst,
                   "median_over_data_bound": med / statistics.median(dbound), "baseline_over_packkit": ratios,
                   "verl_over_capacity_rows": int(sum(over)), "cv_packkit": cv(ours), "cv_pad_mffd": cv(base["pad-to-longest MFFD"]) if "pad-to-longest MFFD" in base else None}
            rows_out.append(row)
            best = min(ratios.values()) if ratios else float("nan")
            pad = ratios.get("pad-to-longest MFFD", float("nan"))
            print(f"| {name} | {pp} | {dp} | {m} | {row['median_over_bound']:.3f} (worst {worst:.3f}) | "
                  f"{row['median_over_data_bound']:.3f} | {best:.3f} | {pad:.3f} | {100 * row['cv_packkit']:.1f}% | "
                  f"{100 * (row['cv_pad_mffd'] or float('nan')):.1f}% |")
    spread_steps = 20 if args.quick else args.spread_steps
    sp = spread(rng, spread_steps)
    print(f"\nstep-time spread, moe-rl pp 2 x dp 8, m 8, {spread_steps} consecutive steps:")
    print("| feeding | mean step / packkit's | CV | min-max / mean |")
    print("|---|---|---|---|")
    for k, v in sp.items():
        wait = f" ({100 * v['delayed_fraction']:.1f}% of documents waited, <= {v['max_wait']} steps)" if "max_wait" in v else ""
        print(f"| {k}{wait} | {v['mean'] / sp['packkit']['mean']:.3f} | {100 * v['cv']:.1f}% | "
              f"{v['min'] / v['mean']:.2f}-{v['max'] / v['mean']:.2f} |")
    sw = sweep(rng, 2 if args.quick else 10)
    print("\nthe range: dp 1-64, 4-64 micro-batches (10 steps a row)")
    print("| workload | pp | dp | m | packkit / own bound | packkit / any-plan bound | best baseline / packkit | best baseline |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sw:
        if not r["steps"]:
            print(f"| {r['workload']} | {r['pp']} | {r['dp']} | {r['m']} | {r['skipped']} | | | |")
            continue
        best = min(r["baseline_over_packkit"], key=r["baseline_over_packkit"].get)
        print(f"| {r['workload']} | {r['pp']} | {r['dp']} | {r['m']} | {r['median_over_bound']:.3f} | "
              f"{r['median_over_data_bound']:.3f} | {r['baseline_over_packkit'][best]:.3f} | {best} |")
    lengths = np.minimum(rng.lognormal(np.log(2000), 1.2, 4096).astype(np.int64) + 1, 131072)
    median, _, _ = _results.timed(lambda: packkit.plan_pipeline(lengths, 131072, pp_size=8, dp_size=64, cost=COST), 5)
    print(f"\nplanning 4,096 documents at pp 8 x dp 64: {1e3 * median:.1f} ms (median of 5)")
    doc = {"machine": _results.machine_info(), "steps": steps, "rows": rows_out, "spread": sp, "sweep": sw,
           "plan_ms_4096_pp8_dp64": 1e3 * median}
    _results.write_results(doc, "pipeline_cpu.json", args.out, args.quick)


if __name__ == "__main__":
    main()
