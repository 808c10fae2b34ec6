"""Issue 40's one benchmark: axolotl's sampler, ms-swift's and LLaMA-Factory's packing vs packkit on the same
lengths. Run from the repository root::

    python benchmarks/bench_trainers.py                  # every workload, dp 8 and 32, h 4096 and 2048
    python benchmarks/bench_trainers.py --quick          # smoke run: 5,000 lengths, nothing written
    python benchmarks/bench_trainers.py --trainers axolotl

Each trainer's side runs in its own venv: ``benchmarks/trainers/<name>.py`` (the contract is in
``benchmarks/trainers/common.py``) is started with ``$PACKKIT_<NAME>_PYTHON`` (``AXOLOTL``, ``SWIFT``,
``LLAMAFACTORY``; default: this python) on one ``.npy`` of lengths per workload. A trainer whose script or venv is
missing is reported and skipped. Workloads (``common.WORKLOADS``, fixed seeds): issue 40's table (50,000 lognormal
lengths, sigma 0.932: SFT median 800 in rows of 8,192; long context median 3,000 in rows of 32,768) and seed 001's
profile (99,388 lengths, median 864, rows of 20,000); dp 8 and 32; h 4096 (Llama-3-8B) and 2048 (Llama-3.2-1B);
rank cost ``6*h*tokens + sum(l**2)``. Prints one table (packkit's row marked with the three targets: balance <=
1.002, steps <= theirs, plan_seconds <= theirs) and writes ``benchmarks/results/trainers_cpu.json``. ``samples``:
the samples in the steps as dealt (a trainer that truncates ranks to whole steps trains fewer than it packed).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import machine_info, write_results  # noqa: E402
from trainers.common import DP_SIZES, HIDDEN_SIZES, WORKLOADS, meets_targets  # noqa: E402

TRAINERS = ("axolotl", "swift", "llamafactory")


def python_for(trainer: str) -> str:
    return os.environ.get(f"PACKKIT_{trainer.upper()}_PYTHON", sys.executable)


def run_one(trainer: str, lengths_path: Path, capacity: int, dp: int, hidden: int, repeats: int,
            out_dir: Path) -> tuple[list[dict], str | None]:
    """(rows, error): the trainer script's JSON rows, or why there are none."""
    script = HERE / "trainers" / f"{trainer}.py"
    if not script.exists():
        return [], f"{script.relative_to(HERE.parent)} does not exist"
    out = out_dir / f"{trainer}_{lengths_path.stem}_{dp}_{hidden}.json"
    cmd = [python_for(trainer), str(script), "--lengths", str(lengths_path), "--capacity", str(capacity),
           "--dp-size", str(dp), "--hidden", str(hidden), "--out", str(out), "--repeats", str(repeats)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE.parent)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return [], f"exit {proc.returncode}: {tail[0][:200]}"
    return json.loads(out.read_text()), None


def table(rows: list[dict]) -> str:
    head = (f"{'trainer':<13}{'workload':<9}{'dp':>4}{'h':>6}  {'method':<18}{'rows':>7}{'steps':>7}{'eff':>8}"
            f"{'balance':>9}{'plan s':>9}{'samples':>9}  targets")
    lines = [head, "-" * len(head)]
    for row in rows:
        marks = ""
        if "targets" in row:
            marks = " ".join(f"{k}:{'ok' if v else 'MISS'}" for k, v in row["targets"].items())
        lines.append(f"{row['trainer']:<13}{row['workload']:<9}{row['dp_size']:>4}{row['hidden']:>6}  "
                     f"{row['method']:<18}{row['rows']:>7}{row['steps']:>7}{row['efficiency']:>8.4f}"
                     f"{row['balance']:>9.4f}{row['plan_seconds']:>9.3f}"
                     f"{row.get('trained_samples', row['n_samples']):>9}  {marks}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    names = [w.name for w in WORKLOADS]
    parser.add_argument("--workloads", nargs="+", choices=names, default=names)
    parser.add_argument("--dp", nargs="+", type=int, default=list(DP_SIZES))
    parser.add_argument("--hidden", nargs="+", type=int, default=list(HIDDEN_SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="5,000 lengths per workload, 1 repeat, nothing written")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    results, errors = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for workload in (w for w in WORKLOADS if w.name in args.workloads):
            if args.quick:
                workload = dataclasses.replace(workload, n=5_000)
            path = tmp / f"{workload.name}.npy"
            np.save(path, workload.lengths())
            for hidden in args.hidden:
                for dp in args.dp:
                    for trainer in args.trainers:
                        rows, error = run_one(trainer, path, workload.capacity, dp, hidden,
                                              1 if args.quick else args.repeats, tmp)
                        if error:
                            errors.append({"trainer": trainer, "workload": workload.name, "dp_size": dp,
                                           "hidden": hidden, "error": error})
                            print(f"skipped {trainer} {workload.name} dp={dp} h={hidden}: {error}", file=sys.stderr)
                            continue
                        theirs = next((r for r in rows if r["method"] != "packkit"), None)
                        for row in rows:
                            row["workload"] = workload.name
                            if row["method"] == "packkit" and theirs is not None:
                                row["targets"] = meets_targets(row, theirs)
                        results.extend(rows)
    print(table(results))
    if errors:
        print(f"\n{len(errors)} runs skipped (see 'skipped' in the JSON)")
    python = {t: python_for(t) for t in args.trainers}
    doc = {"machine": machine_info(trainer_pythons=python), "workloads": [dataclasses.asdict(w) for w in WORKLOADS],
           "cost": "rank cost 6*h*tokens + sum(l**2)", "results": results, "skipped": errors}
    write_results(doc, "trainers_cpu.json", args.out, args.quick)


if __name__ == "__main__":
    main()
