"""End-to-end CPU benchmark of ``packkit analyze``: 10M lengths, a 10-point max-length sweep with obfd.

Run from the repository root::

    python benchmarks/bench_analyze.py                      # 10M lengths, Parquet, text, JSONL; 3 repeats
    python benchmarks/bench_analyze.py --quick              # smoke run: 1M lengths, 1 repeat
    python benchmarks/bench_analyze.py --formats parquet --repeats 5 --out /tmp/analyze_cpu.json

Input: 10M lengths from the seed-001 lognormal (median 864, sigma 0.932, seed 1; lengths >= 1),
written once before timing as a Parquet file (one int64 column ``num_tokens``), a text file (one length
per line) and JSON Lines (``{"id": i, "num_tokens": n}``), as ``--formats`` selects.
Each repeat runs the real command in a fresh process::

    python -m packkit analyze FILE -o OUT --max-lengths 2048,4096,8192,12000,16384,20000,24000,32768,65536,131072
        --algorithms obfd --no-progress --json

and times it from process start to exit (interpreter and torch import included) through every output:
the three JSON files, report.md and the three PNG figures. The phases (read, stats, simulate = the 10
plans plus the padded baseline, figures, write) come from the command's own ``--json`` timings.
Times are medians of the repeats. Target: <= 30 s end to end on the project's 2-core CPU machine.
Results go to ``benchmarks/results/analyze_cpu.json`` (``--out`` overrides).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SWEEP = [2048, 4096, 8192, 12000, 16384, 20000, 24000, 32768, 65536, 131072]
TARGET_S = 30.0
PHASES = ("read", "stats", "simulate", "figures", "write", "total")


def make_lengths(n: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    return np.maximum(np.round(np.exp(rng.normal(np.log(864), 0.932, n))), 1).astype(np.int64)


def write_inputs(lengths: np.ndarray, folder: Path, formats: list[str]) -> dict[str, tuple[Path, list[str]]]:
    """{format: (path, extra CLI args)} with each file written once."""
    out = {}
    if "parquet" in formats:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "lengths.parquet"
        pq.write_table(pa.table({"num_tokens": lengths}), path, row_group_size=1 << 20)
        out["parquet"] = (path, ["--length-field", "num_tokens"])
    if "text" in formats:
        path = folder / "lengths.txt"
        with open(path, "w") as f:
            for start in range(0, len(lengths), 1 << 20):
                f.write("\n".join(map(str, lengths[start:start + (1 << 20)].tolist())) + "\n")
        out["text"] = (path, [])
    if "jsonl" in formats:
        path = folder / "lengths.jsonl"
        with open(path, "w") as f:
            for start in range(0, len(lengths), 1 << 20):
                chunk = lengths[start:start + (1 << 20)].tolist()
                f.write("".join(f'{{"id": {start + i}, "num_tokens": {n}}}\n' for i, n in enumerate(chunk)))
        out["jsonl"] = (path, ["--length-field", "num_tokens"])
    return out


def run_once(path: Path, extra: list[str], out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "packkit", "analyze", str(path), "-o", str(out), "--max-lengths",
           ",".join(map(str, SWEEP)), "--algorithms", "obfd", "--no-progress", "--json", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"packkit analyze failed ({proc.returncode}):\n{proc.stderr}")
    summary = json.loads(proc.stdout)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert len(files) == 7 and all((out / f).stat().st_size > 0 for f in files), files
    at = {r["max_length"]: r for r in summary["simulations"]}
    return {"wall_s": wall, **{f"{k}_s": summary["timings"].get(k, 0.0) for k in PHASES},
            "files": files, "samples": summary["stats"]["count"],
            "efficiency_at_20000": at[20000]["efficiency"], "packs_at_20000": at[20000]["packs"],
            "recommended": {k: summary["recommended"][k] for k in ("max_length", "algorithm", "efficiency",
                                                                  "meets_target")}}


def machine_info() -> dict:
    import torch

    import packkit

    return {"processor": platform.processor(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0], "numpy": np.__version__, "torch": torch.__version__,
            "packkit": getattr(packkit, "__version__", None),
            "pyarrow": __import__("pyarrow").__version__, "matplotlib": __import__("matplotlib").__version__,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=None, help="lengths (default 10M, 1M with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per format (default 3, 1 with --quick)")
    parser.add_argument("--formats", default="parquet,text,jsonl", help="comma-separated: parquet, text, jsonl")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1M lengths, 1 repeat")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "analyze_cpu.json")
    args = parser.parse_args()
    n = args.samples or (1_000_000 if args.quick else 10_000_000)
    repeats = args.repeats or (1 if args.quick else 3)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]

    info = machine_info()
    print(f"packkit {info['packkit']} | python {info['python']} | numpy {info['numpy']} | torch {info['torch']} | "
          f"pyarrow {info['pyarrow']} | {info['processor'] or info['machine']}, {info['cpu_count']} CPUs | "
          f"{n:,} lengths | {len(SWEEP)}-point sweep, obfd | repeats {repeats}{' | quick' if args.quick else ''}")
    load_start = os.getloadavg()
    lengths = make_lengths(n)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_analyze_") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        inputs = write_inputs(lengths, tmp, formats)
        print(f"inputs written in {time.perf_counter() - t0:.1f} s: "
              + ", ".join(f"{f} {p.stat().st_size / 1e6:.0f} MB" for f, (p, _) in inputs.items()))
        for fmt, (path, extra) in inputs.items():
            runs = [run_once(path, extra, tmp / f"out_{fmt}") for _ in range(repeats)]
            row = {"format": fmt, "file_mb": path.stat().st_size / 1e6, "repeats": repeats,
                   **{k: statistics.median(r[k] for r in runs) for k in ["wall_s"] + [f"{p}_s" for p in PHASES]},
                   "wall_s_all": [r["wall_s"] for r in runs], "samples": runs[0]["samples"],
                   "efficiency_at_20000": runs[0]["efficiency_at_20000"], "packs_at_20000": runs[0]["packs_at_20000"],
                   "recommended": runs[0]["recommended"], "files": runs[0]["files"]}
            rows.append(row)

    cols = ["format", "file MB", "end to end s", "read", "stats", "simulate", "figures", "write",
            "in-process total", "obfd eff @20000"]
    print("\n| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    for r in rows:
        print(f"| {r['format']} | {r['file_mb']:.0f} | {r['wall_s']:.2f} | {r['read_s']:.2f} | {r['stats_s']:.2f} | "
              f"{r['simulate_s']:.2f} | {r['figures_s']:.2f} | {r['write_s']:.2f} | {r['total_s']:.2f} | "
              f"{r['efficiency_at_20000']:.4%} |")
    print(f"\nload average (1 min) {load_start[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end (2 cores: > 1 means "
          "other work shared the machine)")
    print("end to end = fresh `python -m packkit analyze` process, start to exit (median); phases from its --json timings")
    targets = []
    for r in rows:
        ok = r["wall_s"] <= TARGET_S if n >= 10_000_000 else None
        status = "SKIP" if ok is None else ("PASS" if ok else "MISS")
        targets.append({"target": f"{n:,} lengths ({r['format']}), {len(SWEEP)}-point sweep with obfd, end to end "
                                  f"<= {TARGET_S:.0f} s", "status": status, "detail": f"{r['wall_s']:.2f} s"})
        print(f"{status}  {targets[-1]['target']}: {r['wall_s']:.2f} s")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"machine": info, "samples": n, "repeats": repeats, "quick": args.quick, "sweep": SWEEP,
           "algorithms": ["obfd"], "profile": "lognormal median 864 sigma 0.932 seed 1, lengths >= 1",
           "load_average_1m": {"start": load_start[0], "end": os.getloadavg()[0]},
           "rows": rows, "targets": targets}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
