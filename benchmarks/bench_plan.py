"""CPU benchmark of ``packkit.plan`` against lightbinpack and binpacking.

Run from the repository root::

    python benchmarks/bench_plan.py            # full run, 5 repeats
    python benchmarks/bench_plan.py --quick    # smoke run: 2 repeats, input (a) shrunk to 200k
    python benchmarks/bench_plan.py --repeats 9 --out /tmp/plan_cpu.json

Inputs (fixed seeds): (a) 1M uniform [1, 4096], capacity 16384; (b) ~100k lognormal
(median 864, sigma 0.932, lengths > 20000 dropped), capacity 20000; (c) 10k uniform [1, 4096],
capacity 4096; (d) 100k uniform [1, 8192], capacity 16384; (e) 100k bimodal (80% uniform [50, 600),
20% uniform [6000, 16000)), capacity 16384; (f) 10M uniform [1, 4096], capacity 16384 (speed only:
obfd and ogbfd against lightbinpack, and obfd at 1M..10M for linearity). Times are the median of the repeats (``gc.collect()`` before each); inputs in
list/tensor form are built before timing. ``bins`` counts non-empty bins and ``efficiency`` is
``sum(lengths) / (bins * capacity)``. ``dup/missing`` counts extra occurrences / absent input
indices in a system's output (binpacking returns values, not indices: its output is checked as a
multiset instead). On every input but (f) the grouped (``ogbfd``, dp=8) rows report, with one helper for every
system, per-step balance (sum over steps of max rank cost / sum over steps of mean rank cost) and
epoch rank balance (max / mean of each rank's total cost) under attention (sum len^2), token cost and
a model cost (``packkit.transformer_cost`` of Llama-3-8B: a*len + b*len^2), and packkit's certified
lower bound on per-step balance for attention and model cost. The machine is shared: the 1-minute
load average is recorded before and after each input; compare ratios from the same run.
Results go to ``benchmarks/results/plan_cpu.json`` (``--out`` overrides).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import torch

import packkit

import _results  # benchmarks/_results.py: machine info and where results go

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
LLAMA3_8B = packkit.transformer_cost(hidden_size=4096, num_layers=32, intermediate_size=14336, num_heads=32,
                                     num_kv_heads=8, vocab_size=128256)
LBP_OBFD = "lightbinpack obfd (list)"
PK_OBFD = "packkit obfd (numpy)"
PK_OBFD_LIST = "packkit obfd (list)"
PK_OBFD_TENSOR = "packkit obfd (tensor)"
PK_OGBFD_ATTN = "packkit ogbfd dp8 attention"
LBP_OGBFD = "lightbinpack ogbfd dp8 (list)"


def tokens_cost(lens: np.ndarray) -> float:
    return float(lens.sum())


def attention_cost(lens: np.ndarray) -> float:
    return float((lens * lens).sum())


def model_cost(lens: np.ndarray) -> float:
    lens = lens.astype(np.float64)
    return float((LLAMA3_8B[0] * lens + LLAMA3_8B[1] * lens * lens).sum())


COSTS = {"tokens": tokens_cost, "attention": attention_cost, "model": model_cost}
PLAN_COSTS = {"tokens": "tokens", "attention": "attention", "model": LLAMA3_8B}


def make_inputs(quick: bool) -> list[dict]:
    n_a = 200_000 if quick else 1_000_000
    a = np.random.default_rng(0).integers(1, 4097, n_a).astype(np.int64)
    rng = np.random.default_rng(1)
    b = np.round(np.exp(rng.normal(np.log(864), 0.932, 100_000))).astype(np.int64)
    b = np.maximum(b, 1)
    b = b[b <= 20000]
    c = np.random.default_rng(2).integers(1, 4097, 10_000).astype(np.int64)
    d = np.random.default_rng(3).integers(1, 8193, 100_000).astype(np.int64)
    rng = np.random.default_rng(4)
    e = np.where(rng.random(100_000) < 0.8, rng.integers(50, 600, 100_000),
                 rng.integers(6000, 16000, 100_000)).astype(np.int64)
    return [
        {"name": "a", "desc": f"{n_a:,} uniform [1,4096], cap 16384", "lengths": a, "capacity": 16384},
        {"name": "b", "desc": f"{len(b):,} lognormal (<=20000), cap 20000", "lengths": b, "capacity": 20000},
        {"name": "c", "desc": "10,000 uniform [1,4096], cap 4096", "lengths": c, "capacity": 4096},
        {"name": "d", "desc": "100,000 uniform [1,8192], cap 16384", "lengths": d, "capacity": 16384},
        {"name": "e", "desc": "100,000 bimodal (80% [50,600), 20% [6000,16000)), cap 16384", "lengths": e,
         "capacity": 16384},
    ]


def median_ms(fn, repeats: int):
    """Median wall time of ``fn()`` in ms, and the last call's result."""
    median, _, out = _results.timed(fn, repeats)
    return median * 1e3, out


def _materialise(p):
    p.bins
    return p


def systems(inp: dict) -> list[tuple[str, object, int]]:
    """(name, zero-argument callable, repeats override or 0) for every system run on ``inp``."""
    arr, cap = inp["lengths"], inp["capacity"]
    lst, ten = arr.tolist(), torch.from_numpy(arr.copy())
    rows = [
        (PK_OBFD, lambda: packkit.plan(arr, cap), 0),
        (PK_OBFD_LIST, lambda: packkit.plan(lst, cap), 0),
        (PK_OBFD_TENSOR, lambda: packkit.plan(ten, cap), 0),
        ("packkit obfd+bins (numpy)", lambda: _materialise(packkit.plan(arr, cap)), 0),
    ]
    rows += [(f"packkit {alg} (numpy)", lambda alg=alg: packkit.plan(arr, cap, algorithm=alg), 0)
             for alg in ("nf", "ffd", "bfd")]
    if lightbinpack is not None:
        rows.append((LBP_OBFD, lambda: lightbinpack.obfd(lst, cap), 0))
    if binpacking is not None and inp["name"] == "c":  # pure Python, O(n * bins): minutes on (a) and (b)
        rows.append(("binpacking ffd (list)", lambda: binpacking.to_constant_volume(lst, cap), 1))
    big = len(arr) > 200_000  # (a): fewer repeats for the slow grouped rows
    rows += [(f"packkit ogbfd dp8 {c}", lambda c=c: packkit.plan(arr, cap, algorithm="ogbfd", dp_size=DP,
                                                                   cost=PLAN_COSTS[c]), 2 if big else 0)
             for c in ("tokens", "attention", "model")]
    if lightbinpack is not None:
        rows.append((LBP_OGBFD, lambda: lightbinpack.ogbfd(lst, cap, bins_per_group=DP), 2 if big else 0))
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
                row["balance_lower_bound"] = out.balance_lower_bound
                row["obfd_rows"] = packkit.plan(lengths, cap).num_bins
    row["lower_bound"] = -(-total // cap)
    row["efficiency"] = total / (row["bins"] * cap)
    return row


def run_input(inp: dict, repeats: int) -> list[dict]:
    rows = []
    load_before = os.getloadavg()[0]
    for name, fn, reps in systems(inp):
        ms, out = median_ms(fn, reps or repeats)
        rows.append({"system": name, "time_ms": ms, "repeats": reps or repeats, **evaluate(name, out, inp)})
        del out
    lbp = next((r["time_ms"] for r in rows if r["system"] == LBP_OBFD), None)
    lbp_og = next((r["time_ms"] for r in rows if r["system"] == LBP_OGBFD), None)
    for r in rows:
        ref = lbp_og if "ogbfd" in r["system"] else lbp
        r["vs_lightbinpack"] = ref / r["time_ms"] if ref else None
        r["load_1min"] = [load_before, os.getloadavg()[0]]
    return rows


def run_speed(quick: bool, repeats: int) -> dict:
    """(f): obfd and ogbfd on 10M uniform [1,4096] (cap 16384) against lightbinpack, and obfd's
    time per item at 1M..10M (linearity)."""
    n = 1_000_000 if quick else 10_000_000
    cap = 16384
    lengths = np.random.default_rng(5).integers(1, 4097, n).astype(np.int64)
    out = {"n": n, "capacity": cap, "load_1min_before": os.getloadavg()[0], "rows": []}
    plan_ms, plan = median_ms(lambda: packkit.plan(lengths, cap), repeats)
    out["rows"].append({"system": PK_OBFD, "time_ms": plan_ms, "bins": plan.num_bins})
    del plan
    og_ms, og = median_ms(lambda: packkit.plan(lengths, cap, algorithm="ogbfd", dp_size=DP, cost="attention"), 1)
    out["rows"].append({"system": PK_OGBFD_ATTN, "time_ms": og_ms, "bins": og.num_bins,
                        "attention_step_balance": og.balance})
    del og
    lst = lengths.tolist()  # the list form users hand both (issue 63: the list path lost 3x to argument checks)
    ms, plan = median_ms(lambda: packkit.plan(lst, cap), repeats)
    out["rows"].append({"system": PK_OBFD_LIST, "time_ms": ms, "bins": plan.num_bins})
    del plan
    if lightbinpack is not None:
        ms, res = median_ms(lambda: lightbinpack.obfd(lst, cap), repeats)
        out["rows"].append({"system": LBP_OBFD, "time_ms": ms, "bins": len(res)})
        del res
        ms, res = median_ms(lambda: lightbinpack.ogbfd(lst, cap, bins_per_group=DP), 1)
        bins = to_bins(res, DP)
        out["rows"].append({"system": LBP_OGBFD, "time_ms": ms, "bins": sum(len(b) > 0 for b in bins),
                            "attention_step_balance": balance_stats(bins, DP, lengths, attention_cost)[0]})
        del res, bins
    del lst
    out["linearity"] = []
    for m in ([n // 10, n // 4, n // 2, n] if not quick else [n // 4, n]):
        ms, p = median_ms(lambda m=m: packkit.plan(lengths[:m], cap), repeats)
        out["linearity"].append({"n": m, "time_ms": ms, "ns_per_item": ms * 1e6 / m})
        del p
    out["load_1min_after"] = os.getloadavg()[0]
    return out


def print_speed(speed: dict) -> None:
    print(f"\n### (f) {speed['n']:,} uniform [1,4096], cap {speed['capacity']} (load {speed['load_1min_before']:.1f} -> "
          f"{speed['load_1min_after']:.1f} on {os.cpu_count()} CPUs)\n")
    print("| system | time_ms | bins | attention_step_balance |")
    print("|---|---|---|---|")
    for r in speed["rows"]:
        b = r.get("attention_step_balance")
        print(f"| {r['system']} | {r['time_ms']:.1f} | {r['bins']} | {'-' if b is None else format(b, '.6f')} |")
    print("\nobfd linearity: " + ", ".join(f"{r['n']:,}: {r['time_ms']:.1f} ms ({r['ns_per_item']:.1f} ns/item)"
                                         for r in speed["linearity"]))


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if v < 10 else f"{v:.1f}"
    return str(v)


def print_table(inp: dict, rows: list[dict]) -> None:
    cols = ["system", "time_ms", "vs_lightbinpack", "bins", "lower_bound", "efficiency", "dup/missing"]
    if any("steps" in r for r in rows):
        cols += ["steps", "attention_step_balance", "model_step_balance", "tokens_step_balance",
                 "attention_rank_balance", "balance_lower_bound"]
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
            elif "balance" in c:
                cells.append("-" if r.get(c) is None else f"{r[c]:.6f}")
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


def targets(results: dict[str, list[dict]], speed_run: dict | None = None) -> list[dict]:
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
    lrb = "-" if lbp is None else f"{lbp['attention_rank_balance']:.6f}"
    ok = None if lbp is None else rb <= 1.003 and rb <= lbp["attention_rank_balance"]
    add("(3) (b) packkit ogbfd dp8 attention: epoch rank balance (attention) <= 1.003 and <= lightbinpack ogbfd", ok,
        f"rank balance {rb:.6f} vs lightbinpack {lrb}")
    add("(4) (b) packkit ogbfd dp8 attention: per-step balance <= 1.0015", sb <= 1.0015,
        f"{sb:.6f} (certified lower bound {pk['balance_lower_bound']:.6f}; lightbinpack "
        f"{'-' if lbp is None else format(lbp['attention_step_balance'], '.6f')})")
    for name in results:
        for c in ("attention", "model", "tokens"):
            pk, lbp = row(name, f"packkit ogbfd dp8 {c}"), row(name, LBP_OGBFD)
            mine = pk[f"{c}_step_balance"]
            theirs = None if lbp is None else lbp[f"{c}_step_balance"]
            add(f"(5) ({name}) packkit ogbfd dp8 {c}: per-step balance ({c}) <= lightbinpack ogbfd's",
                None if lbp is None else mine <= theirs,
                f"{mine:.6f} vs {'-' if theirs is None else format(theirs, '.6f')}")
        pk = row(name, PK_OGBFD_ATTN)
        add(f"(6) ({name}) ogbfd rows <= obfd rows + dp", pk["bins"] <= pk["obfd_rows"] + DP,
            f"{pk['bins']} vs obfd {pk['obfd_rows']}; duplicates/missing {pk['duplicates']}/{pk['missing']}")
    if speed_run:
        r = {x["system"]: x for x in speed_run["rows"]}
        ob = r[PK_OBFD]["time_ms"]
        add(f"(7) (f) packkit obfd (numpy) on {speed_run['n']:,} <= 250 ms", ob <= 250, f"{ob:.1f} ms")
        if LBP_OBFD in r:
            pl, lo = r[PK_OBFD_LIST]["time_ms"], r[LBP_OBFD]["time_ms"]
            add(f"(7b) (f) packkit obfd from a list on {speed_run['n']:,} >= 3x lightbinpack obfd", lo / pl >= 3,
                f"{pl:.1f} ms vs {lo:.1f} ms = {lo / pl:.2f}x")
        if LBP_OGBFD in r:
            og, lo = r[PK_OGBFD_ATTN]["time_ms"], r[LBP_OGBFD]["time_ms"]
            add("(8) (f) packkit ogbfd dp8 no slower than lightbinpack ogbfd", og <= lo, f"{og:.0f} ms vs {lo:.0f} ms")
        lin = speed_run["linearity"]
        spread = max(x["ns_per_item"] for x in lin) / min(x["ns_per_item"] for x in lin)
        add("(9) (f) obfd linear in n: ns/item within 1.5x from n/10 to n", spread <= 1.5,
            ", ".join(f"{x['ns_per_item']:.1f}" for x in lin) + " ns/item")
    return out


def machine_info() -> dict:
    return _results.machine_info(numpy=np.__version__, packkit=getattr(packkit, "__version__", None),
                                 lightbinpack=getattr(lightbinpack, "__version__", None) if lightbinpack else None,
                                 load_1min=os.getloadavg()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per system (default 5, 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 repeats, input (a) shrunk to 200k")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/plan_cpu.json; "
                        "--quick runs write only with --out)")
    parser.add_argument("--no-speed", action="store_true", help="skip input (f), the 10M speed runs")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)

    info = machine_info()
    print(f"packkit {info['packkit']} | python {info['python']} | numpy {info['numpy']} | torch {info['torch']} | "
          f"{info['processor'] or info['machine']}, {info['cpu_count']} CPUs | repeats {repeats}{' | quick' if args.quick else ''}")
    results, inputs = {}, make_inputs(args.quick)
    for inp in inputs:
        results[inp["name"]] = run_input(inp, repeats)
        print_table(inp, results[inp["name"]])

    speed = None if args.no_speed else run_speed(args.quick, repeats)
    if speed:
        print_speed(speed)
    tgt = targets(results, speed)
    print("\n### Targets\n")
    for t in tgt:
        print(f"{t['status']}  {t['target']}: {t['detail']}")

    doc = {"machine": info, "repeats": repeats, "quick": args.quick,
           "inputs": [{"name": i["name"], "desc": i["desc"], "n": len(i["lengths"]), "capacity": i["capacity"],
                       "tokens": int(i["lengths"].sum())} for i in inputs],
           "rows": results, "speed": speed, "targets": tgt}
    _results.write_results(doc, "plan_cpu.json", args.out, args.quick)


if __name__ == "__main__":
    main()
