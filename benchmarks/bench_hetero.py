"""Heterogeneous data-parallel ranks (issue 54 part 2): ``packkit.plan(..., "ogbfd", capacity=[...],
rank_speed=[...])`` vs LightBinPack's ``ohgbfd`` in the same run.

Run from the repository root::

    python benchmarks/bench_hetero.py            # LightBinPack's bench_balance.py workload + two more, JSON
    python benchmarks/bench_hetero.py --quick    # 20k sequences, writes nothing

Workloads (seeded): LightBinPack's bench_balance.py lengths (``np.random.seed(0); randint(1000, 20000)``, the first
100k) over capacities 50k/50k/25k/25k at speeds 2/2/1/1 (its ohgbfd takes no speeds: its capacities stand for
them); the same over 8 ranks 40k x 4 + 20k x 4 (speeds 2/1); and a lognormal SFT-like profile (median 1k, to 8k)
over 16k/16k/8k/8k. Figures: steps and the fewest any plan needs (``ceil(tokens / sum(capacity))``); time balance
(``sum over steps of the slowest rank's time / sum over steps of the mean``, a row's time being its sum of
``len**2`` / its rank's speed: LightBinPack's own ohgbfd weight); planning ms, median of 7 after a warm-up, the
two interleaved, ``gc.collect()`` before each (ohgbfd from a Python list, as its API takes; packkit from the int64
array); time ratio: the median of packkit / ohgbfd per pair.
Results: ``benchmarks/results/hetero_cpu.json``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402

import packkit  # noqa: E402

try:
    import lightbinpack
except ImportError:  # pragma: no cover - LightBinPack is optional (pip install lightbinpack)
    lightbinpack = None


def workloads(n: int):
    np.random.seed(0)
    bench_balance = np.random.randint(1000, 20000, 1_000_000)[:n]
    lognormal = np.clip(np.random.default_rng(0).lognormal(np.log(1000), 1.0, n).astype(np.int64), 16, 8000)
    yield "bench_balance 4 ranks", bench_balance, [50000, 50000, 25000, 25000], [2, 2, 1, 1]
    yield "bench_balance 8 ranks", bench_balance, [40000] * 4 + [20000] * 4, [2] * 4 + [1] * 4
    yield "lognormal 4 ranks", lognormal, [16000, 16000, 8000, 8000], [2, 2, 1, 1]


def time_balance(steps, lengths, speeds) -> float:
    """sum over steps of max rank time / sum over steps of mean rank time (time = sum len**2 / speed)."""
    cost = lengths.astype(np.float64) ** 2
    times = np.array([[cost[np.asarray(b, dtype=np.int64)].sum() / v for b, v in zip(step, speeds)]
                      for step in steps])
    return float(times.max(axis=1).sum() / times.mean(axis=1).sum())


def check(steps, lengths, caps) -> None:
    seen = np.concatenate([np.asarray(b, dtype=np.int64) for step in steps for b in step])
    assert np.array_equal(np.sort(seen), np.arange(len(lengths))), "a sequence lost or duplicated"
    for step in steps:
        for b, c in zip(step, caps):
            assert lengths[np.asarray(b, dtype=np.int64)].sum() <= c, "a row over its rank's capacity"


def run(name, lengths, caps, speeds, repeats) -> dict:
    row = {"workload": name, "sequences": len(lengths), "capacity": caps, "rank_speed": speeds,
           "steps_bound": int(-(-int(lengths.sum()) // sum(caps)))}
    ours = lambda: packkit.plan(lengths, caps, algorithm="ogbfd", dp_size=len(caps), cost="attention",
                                rank_speed=speeds)
    data = lengths.tolist()
    theirs = (lambda: lightbinpack.ohgbfd(data, caps)) if lightbinpack is not None else None
    # Interleaved (ours, theirs, ours, ...) so a drift in the machine's speed hits both alike; the ratio is the
    # median of the per-pair ratios.
    ours(), theirs and theirs()
    mine, other, ratios = [], [], []
    for _ in range(repeats):
        seconds, _, plan = _results.timed(ours, 1)
        mine.append(seconds)
        if theirs:
            seconds, _, out = _results.timed(theirs, 1)
            other.append(seconds)
            ratios.append(mine[-1] / seconds)
    steps = [plan.bins[s * len(caps):(s + 1) * len(caps)] for s in range(plan.num_steps)]
    check(steps, lengths, caps)
    row.update(packkit_steps=plan.num_steps, packkit_balance=time_balance(steps, lengths, speeds),
               packkit_ms=float(np.median(mine)) * 1e3)
    if theirs:
        check(out, lengths, caps)
        row.update(ohgbfd_steps=len(out), ohgbfd_balance=time_balance(out, lengths, speeds),
                   ohgbfd_ms=float(np.median(other)) * 1e3, time_ratio=float(np.median(ratios)))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sequences", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    n = 20_000 if args.quick else args.sequences
    rows = [run(*w, args.repeats) for w in workloads(n)]
    print(f"{'workload':24}{'steps':>8}{'bound':>8}{'balance':>9}{'ms':>8}   {'ohgbfd steps':>12}{'balance':>9}{'ms':>8}"
          f"{'time ratio':>11}")
    for r in rows:
        theirs = (f"{r['ohgbfd_steps']:>12,}{r['ohgbfd_balance']:>9.4f}{r['ohgbfd_ms']:>8.1f}{r['time_ratio']:>11.2f}"
                  if "ohgbfd_steps" in r
                  else "   (lightbinpack not installed)")
        print(f"{r['workload']:24}{r['packkit_steps']:>8,}{r['steps_bound']:>8,}{r['packkit_balance']:>9.4f}"
              f"{r['packkit_ms']:>8.1f}   {theirs}")
    doc = {"machine": _results.machine_info(), "rows": rows,
           "lightbinpack": getattr(lightbinpack, "__version__", None)}
    _results.write_results(doc, "hetero_cpu.json", args.out, args.quick)


if __name__ == "__main__":
    main()
