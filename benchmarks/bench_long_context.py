"""Long-context scheduling (issue 54): packkit.plan_context_parallel vs Megatron's BalancedCPScheduler vs static CP.

Run from the repository root::

    python benchmarks/bench_long_context.py            # the grid below, JSON + figure
    python benchmarks/bench_long_context.py --quick    # smoke run: two configurations, writes nothing
    python benchmarks/bench_long_context.py --scale    # also packkit alone on up to 1M sequences, 8,192 ranks

Workloads (seeded): long-tail lognormal (median 2k, sigma 1.2, 64..128k), LongAlign-like uniform 8k-64k, short
lognormal (median 1.2k, sigma 0.8, 16..32k); 256 / 1,024 / 4,096 sequences on 8-512 ranks, caps of 8k / 16k local
tokens per rank. One cost model for every scheduler (REFERENCE.md section 19, a 7B-dense H100 estimate):
``t(s, c) = (a*s^2 + b*s) / c + [c > 1] * k * (c - 1) / c * s`` with a = 1.97e-9, b = 1.05e-4, k = 3.15e-5 s/token
and 10 ms per pass (flags below), under one execution model (``packkit.planning.cp_simulate``): each rank runs its
passes in order, a pass starts when all its ranks are free.

* packkit: ``plan_context_parallel(lengths, ranks, cap, cost=(b, a), cp_comm=k, pass_overhead=o)`` (and
  ``barrier="pass"``, every pass a global barrier, as FSDP / ZeRO-3 needs).
* megatron: megatron-core's ``BalancedCPScheduler(cap, G).get_groups_and_subsamples`` unmodified (G: any object
  with ``.size()``); in each of its groups the ranks listing the same ids are one CP set running each id as its
  own pass, in order, with no barrier between groups (its best case; its own schedule adds one per group).
* static: every sequence at the workload's largest needed CP size (one fixed CP size, DP over the rest), packed
  and balanced by packkit's planner with ``min_cp_size = max_cp_size``.

Columns: makespan / lower bound (packkit's certified bound, valid for every plan under the model), passes, peak
local tokens per rank, communication share of busy rank-seconds, planning seconds (median of 3).
Results: ``benchmarks/results/long_context_cpu.json`` and ``docs/img/bench_long_context.png``.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402

from packkit.planning.context_parallel import plan_context_parallel  # noqa: E402
from packkit.planning.cp_simulate import megatron_passes, simulate_passes  # noqa: E402

WORKLOADS = ("long-tail", "uniform-8k-64k", "short")
GRID = [(256, 8), (256, 32), (256, 128), (1024, 8), (1024, 32), (1024, 128), (1024, 512), (4096, 32), (4096, 128),
        (4096, 512)]
CAPS = (8192, 16384)


def lengths_of(workload: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, n, WORKLOADS.index(workload)])
    if workload == "long-tail":
        return np.clip(rng.lognormal(math.log(2048), 1.2, n), 64, 131072).astype(np.int64)
    if workload == "uniform-8k-64k":
        return rng.integers(8192, 65537, n)
    return np.clip(rng.lognormal(math.log(1200), 0.8, n), 16, 32768).astype(np.int64)


class _Group:  # BalancedCPScheduler.__init__ reads only dp_cp_group.size()
    def __init__(self, size: int):
        self._size = size

    def size(self) -> int:
        return self._size


def timed(fn, repeats: int):
    seconds, _, out = _results.timed(fn, repeats)
    return seconds, out


def needed_cp(length: int, cap: int) -> int:
    c = 1
    while (length if c == 1 else 2 * -(-length // (2 * c))) > cap:
        c *= 2
    return c


def run_config(workload, n, ranks, cap, model, repeats, with_megatron=True) -> dict | None:
    lengths = lengths_of(workload, n)
    cost, k, o = (model["b"], model["a"]), model["k"], model["overhead"]
    c_static = needed_cp(int(lengths.max()), cap)
    if c_static > ranks:
        return None  # the longest sequence fits no group of this world: every scheduler refuses it
    row = {"workload": workload, "sequences": n, "ranks": ranks, "cap": cap, "seqs_per_rank": n / ranks}
    sim = dict(cost=cost, cp_comm=k, pass_overhead=o)
    secs, plan = timed(lambda: plan_context_parallel(lengths, ranks, cap, **sim), repeats)
    bound = plan.lower_bound
    row["lower_bound_s"] = bound
    s = plan.summary()
    row["packkit"] = {"makespan_s": plan.makespan, "ratio": plan.makespan / bound, "passes": plan.num_passes,
                      "peak_local_tokens": s["peak_local_tokens"], "communication_share": s["communication_share"],
                      "plan_s": secs, "cp_sizes": s["cp_sizes"]}
    secs, bar = timed(lambda: plan_context_parallel(lengths, ranks, cap, barrier="pass", **sim), repeats)
    s = bar.summary()
    # Against the barrier plan's own bound (it adds the barrier's term: docs/planner.md, fact 4); ratio_blind: against
    # the barrier-free bound, as before that term.
    row["packkit_pass_barrier"] = {"makespan_s": bar.makespan, "ratio": bar.makespan / bar.lower_bound,
                                   "lower_bound_s": bar.lower_bound, "ratio_blind": bar.makespan / bound,
                                   "passes": bar.num_passes,
                                   "steps": bar.num_steps, "peak_local_tokens": s["peak_local_tokens"],
                                   "communication_share": s["communication_share"], "plan_s": secs}
    secs, static = timed(lambda: plan_context_parallel(lengths, ranks, cap, min_cp_size=c_static,
                                                       max_cp_size=c_static, **sim), repeats)
    s = static.summary()
    row["static"] = {"cp_size": c_static, "makespan_s": static.makespan, "ratio": static.makespan / bound,
                     "passes": static.num_passes, "peak_local_tokens": s["peak_local_tokens"],
                     "communication_share": s["communication_share"], "plan_s": secs}
    if with_megatron:
        from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler

        samples = [(i, int(x)) for i, x in enumerate(lengths)]
        secs, (groups, ids) = timed(
            lambda: BalancedCPScheduler(cap, _Group(ranks)).get_groups_and_subsamples(samples, None), repeats)
        passes = megatron_passes(ids)
        seen = sorted(i for _, seqs in passes for i in seqs)
        assert seen == list(range(n)), "Megatron's plan must run every sample exactly once"
        out = simulate_passes(lengths, passes, ranks, **sim)
        row["megatron"] = {"makespan_s": out["makespan"], "ratio": out["makespan"] / bound, "passes": out["passes"],
                           "groups": len(ids), "peak_local_tokens": out["peak_local_tokens"],
                           "communication_share": out["communication_share"], "plan_s": secs}
    # packkit's own makespan re-simulated by the same simulator as Megatron's
    check = simulate_passes(lengths, plan.passes, ranks, **sim)["makespan"]
    assert abs(check - plan.makespan) <= 1e-9 * plan.makespan, (check, plan.makespan)
    return row


def print_table(rows: list[dict]) -> None:
    head = (f"{'workload':15s} {'n':>5s} {'ranks':>5s} {'cap':>6s} {'seq/r':>6s} | {'packkit':>8s} {'pass-bar':>8s} "
            f"{'megatron':>8s} {'static':>7s} | {'passes p/m':>11s} | {'peak p/m':>13s} | {'comm p/m/s':>14s} | "
            f"{'plan ms p/m':>13s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        p, b, s, m = r["packkit"], r["packkit_pass_barrier"], r["static"], r.get("megatron")
        mr = f"{m['ratio']:8.3f}" if m else f"{'-':>8s}"
        print(f"{r['workload']:15s} {r['sequences']:5d} {r['ranks']:5d} {r['cap']:6d} {r['seqs_per_rank']:6.1f} | "
              f"{p['ratio']:8.3f} {b['ratio']:8.3f} {mr} {s['ratio']:7.3f} | "
              f"{p['passes']:5d}/{m['passes'] if m else 0:5d} | {p['peak_local_tokens']:6d}/"
              f"{m['peak_local_tokens'] if m else 0:6d} | {p['communication_share']:.2f}/"
              f"{m['communication_share'] if m else 0:.2f}/{s['communication_share']:.2f} | "
              f"{p['plan_s'] * 1e3:5.1f}/{m['plan_s'] * 1e3 if m else 0:7.1f}")


def run_scale(model, sizes=(125_000, 250_000, 500_000, 1_000_000), ranks=8192, cap=16384) -> list[dict]:
    out = []
    for n in sizes:
        lengths = lengths_of("long-tail", n, seed=1)
        secs, plan = timed(lambda: plan_context_parallel(lengths, ranks, cap, cost=(model["b"], model["a"]),
                                                         cp_comm=model["k"], pass_overhead=model["overhead"]), 1)
        out.append({"sequences": n, "ranks": ranks, "cap": cap, "plan_s": secs, "us_per_sequence": secs / n * 1e6,
                    "ratio": plan.makespan / plan.lower_bound, "passes": plan.num_passes})
        print(f"scale: {n:9,d} sequences on {ranks} ranks: {secs:.2f} s ({secs / n * 1e6:.2f} us/sequence), "
              f"makespan / bound {plan.makespan / plan.lower_bound:.4f}, {plan.num_passes:,d} passes")
    return out


def draw(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(14, 4.8))
    x = np.arange(len(rows))
    for key, label, marker, color in (("packkit", "packkit", "o", "#1f77b4"),
                                      ("packkit_pass_barrier", "packkit, pass barrier", "^", "#2ca02c"),
                                      ("megatron", "Megatron BalancedCPScheduler", "s", "#d62728"),
                                      ("static", "static CP", "x", "#9a9a9a")):
        ax.scatter(x, [r[key]["ratio"] if key in r else np.nan for r in rows], marker=marker, color=color,
                   label=label, s=22)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(x, [f"{r['workload'][:5]} {r['sequences']}/{r['ranks']} {r['cap'] // 1024}k" for r in rows],
                  rotation=90, fontsize=6)
    ax.set_ylabel("makespan / lower bound")
    ax.set_title("Dynamic CP: makespan over the certified lower bound (7B H100 cost model, 10 ms per pass)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small configurations, write nothing")
    parser.add_argument("--scale", action="store_true", help="also packkit alone, 125k-1M sequences on 8,192 ranks")
    parser.add_argument("--a", type=float, default=1.97e-9, help="seconds per token^2 (attention)")
    parser.add_argument("--b", type=float, default=1.05e-4, help="seconds per token (linear layers)")
    parser.add_argument("--k", type=float, default=3.15e-5, help="CP communication seconds per token")
    parser.add_argument("--overhead", type=float, default=0.01, help="seconds per pass")
    parser.add_argument("--no-megatron", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model = {"a": args.a, "b": args.b, "k": args.k, "overhead": args.overhead}
    grid = [(256, 32), (1024, 128)] if args.quick else GRID
    rows = []
    for workload in WORKLOADS:
        for n, ranks in grid:
            for cap in CAPS[:1] if args.quick else CAPS:
                row = run_config(workload, n, ranks, cap, model, 1 if args.quick else 3, not args.no_megatron)
                if row is not None:
                    rows.append(row)
                    print(f"  {workload} {n}/{ranks} cap {cap}: packkit {row['packkit']['ratio']:.3f}, megatron "
                          f"{row.get('megatron', {}).get('ratio', float('nan')):.3f}", flush=True)
    print_table(rows)
    doc = {"machine": _results.machine_info(), "model": model, "rows": rows}
    if args.scale:
        doc["scale"] = run_scale(model, (100_000, 200_000) if args.quick else (125_000, 250_000, 500_000, 1_000_000))
    _results.write_results(doc, "long_context_cpu.json", args.out, args.quick)
    if not args.quick:
        draw(rows, Path(__file__).resolve().parents[1] / "docs" / "img" / "bench_long_context.png")


if __name__ == "__main__":
    main()
