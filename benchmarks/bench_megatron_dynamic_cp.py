"""The Megatron drop-in (issue 54): packkit's ``PackkitCPScheduler`` vs megatron-core 0.16.1's
``BalancedCPScheduler``, both as Megatron's hybrid-CP schedule runs them: every sample its own forward/backward
(no packing in 0.16.1), ranks listing an id in one group its CP set, a barrier at each group's end.

Run from the repository root::

    python benchmarks/bench_megatron_dynamic_cp.py           # the grid, JSON
    python benchmarks/bench_megatron_dynamic_cp.py --quick   # two configurations, writes nothing

Workloads, cost model and flags: ``bench_long_context.py``'s (7B dense on H100, 10 ms per forward/backward).
Columns: makespan over packkit's certified lower bound (for packed plans, so also a bound here) for packkit's
drop-in, Megatron as it runs (group barriers) and Megatron at its best (no barrier); groups; planning ms.
Results: ``benchmarks/results/megatron_dynamic_cp_cpu.json``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402
from bench_long_context import WORKLOADS, _Group, lengths_of, needed_cp  # noqa: E402

from packkit.integrations.megatron_cp import PackkitCPScheduler, schedule_passes  # noqa: E402
from packkit.planning.context_parallel import plan_context_parallel  # noqa: E402
from packkit.planning.cp_simulate import megatron_passes, simulate_passes  # noqa: E402

GRID = [(256, 8), (256, 32), (1024, 32), (1024, 128), (4096, 128)]
CAPS = (8192, 16384)


def grouped(lengths, sample_id_groups, ranks, sim) -> float:
    return sum(simulate_passes(lengths, schedule_passes(g), ranks, **sim)["makespan"] for g in sample_id_groups)


def run_config(workload, n, ranks, cap, sim, repeats) -> dict | None:
    from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler

    lengths = lengths_of(workload, n)
    if needed_cp(int(lengths.max()), cap) > ranks:
        return None
    samples = [(i, int(x)) for i, x in enumerate(lengths)]
    bound = plan_context_parallel(lengths, ranks, cap, **sim).lower_bound
    secs_p, (_, ours) = _results.timed(
        lambda: PackkitCPScheduler(cap, _Group(ranks), **sim).get_groups_and_subsamples(samples), repeats)[::2]
    secs_m, (_, theirs) = _results.timed(
        lambda: BalancedCPScheduler(cap, _Group(ranks)).get_groups_and_subsamples(samples, None), repeats)[::2]
    mine = grouped(lengths, ours, ranks, sim)
    runs = grouped(lengths, theirs, ranks, sim)
    best = simulate_passes(lengths, megatron_passes(theirs), ranks, **sim)["makespan"]
    return {"workload": workload, "sequences": n, "ranks": ranks, "cap": cap, "lower_bound_s": bound,
            "packkit": {"ratio": mine / bound, "groups": len(ours), "plan_s": secs_p},
            "megatron": {"ratio": runs / bound, "best_ratio": best / bound, "groups": len(theirs), "plan_s": secs_m}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sim = {"cost": (1.05e-4, 1.97e-9), "cp_comm": 3.15e-5, "pass_overhead": 0.01}
    rows = []
    for workload in WORKLOADS:
        for n, ranks in ([(256, 32)] if args.quick else GRID):
            for cap in CAPS[:1] if args.quick else CAPS:
                row = run_config(workload, n, ranks, cap, sim, 1 if args.quick else 3)
                if row is None:
                    continue
                rows.append(row)
                p, m = row["packkit"], row["megatron"]
                print(f"{workload:15s} {n:5d} {ranks:4d} {cap:6d} | packkit {p['ratio']:.3f} | megatron "
                      f"{m['ratio']:.3f} (best {m['best_ratio']:.3f}, {m['groups']} groups) | plan ms "
                      f"{p['plan_s'] * 1e3:.1f} / {m['plan_s'] * 1e3:.1f}", flush=True)
    _results.write_results({"machine": _results.machine_info(), "model": sim, "rows": rows},
                           "megatron_dynamic_cp_cpu.json", args.out, args.quick)


if __name__ == "__main__":
    main()
