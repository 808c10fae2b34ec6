#!/usr/bin/env python3
"""Hand-made C++ mutants of the planner and the CPU pack ops (issue 27; docs/mutation.md).

Each mutant is (name, file, exact original snippet, replacement, test selection). The script copies csrc/ and
CMakeLists.txt to a temporary folder, builds ``_planner`` and ``_ops`` there once with CMake + Ninja (its own
build folder; the source tree and its editable install are never touched), checks that every test selection
passes on the unmutated build, then applies one mutant at a time (the snippet must occur exactly once), rebuilds
incrementally (one translation unit + link) and runs its tests against that build. A mutant is killed when its
tests fail (pytest exit 1) or crash the test process (a signal, e.g. SIGSEGV from a planner writing past its
arrays); a build error or a collection error (pytest exit 2-5) is reported as an error, never as a kill.

The tests import the staged build the way tests/sanitize/run.sh does: ``python -S -P`` (no .pth, so the
editable install's import redirect is off) with PYTHONPATH = staged packkit (Python sources linked from the tree,
the mutated extensions beside them) + site-packages.

    .venv/bin/python tools/cpp_mutants.py            # all mutants
    .venv/bin/python tools/cpp_mutants.py --list
    .venv/bin/python tools/cpp_mutants.py nf-capacity obfd-capacity
Exit status 0 only if every mutant was killed and the baseline passed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]

# (name, file, original, replacement, tests): what each mutant breaks is in its name.
MUTANTS = [
    ("pad-value", "csrc/ops/pack_op.cpp",
     "static_cast<double>(pad_id), std::nullopt, out_input_ids);",
     "static_cast<double>(pad_id + 1), std::nullopt, out_input_ids);",
     ["tests/test_pack_ops.py", "-k", "pack_batch"]),
    ("first-label-always-masked", "csrc/ops/pack_op.cpp",
     "mask_first_label ? std::optional<double>(static_cast<double>(ignore_index)) : std::nullopt, out_labels);",
     "std::optional<double>(static_cast<double>(ignore_index)), out_labels);",
     ["tests/test_pack_sequences.py", "-k", "mask_first_label"]),
    ("positions-do-not-count", "csrc/ops/pack_op.cpp",
     "for (int64_t p = c[k], i = position_start; p < c[k + 1]; ++p, ++i) pos[p] = i;",
     "for (int64_t p = c[k], i = position_start; p < c[k + 1]; ++p) pos[p] = i;",
     ["tests/test_pack_ops.py", "-k", "pack_batch"]),
    ("seq-idx-off-by-one", "csrc/ops/pack_op.cpp",
     "std::fill(doc + c[k], doc + c[k + 1], static_cast<int32_t>(k));",
     "std::fill(doc + c[k], doc + c[k + 1], static_cast<int32_t>(k + 1));",
     ["tests/test_pack_sequences.py", "-k", "hf_data_collator"]),
    ("cu-seqlens-no-1-token-padding-tail", "csrc/ops/pack_op.cpp",
     "if (pos < row_end) emit(pos, -1);",
     "if (pos + 1 < row_end) emit(pos, -1);",
     ["tests/test_pack_ops.py", "-k", "layout"]),
    ("bounds-segment-end-plus-one", "csrc/ops/pack_op.cpp",
     "seg_start[j] >= 0 && seg_start[j] <= seq_len - len,",
     "seg_start[j] >= 0 && seg_start[j] <= seq_len - len + 1,",
     ["tests/test_plan_safety.py"]),
    ("obfd-capacity-plus-one", "csrc/planner/optimized_best_fit.cpp",
     "new_free = capacity - len;",
     "new_free = capacity + 1 - len;",
     ["tests/test_plan_properties.py"]),
    ("nf-capacity-plus-one", "csrc/planner/next_fit.cpp",
     "if (lengths[i] > free_space) {",
     "if (lengths[i] > free_space + 1) {",
     ["tests/test_plan_properties.py"]),
]


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def stage(build: Path, site: Path) -> None:
    """An importable packkit: the tree's Python sources linked, the built extensions copied beside them."""
    pkg = site / "packkit"
    if site.exists():
        shutil.rmtree(site)
    pkg.mkdir(parents=True)
    for entry in (ROOT / "packkit").iterdir():
        if entry.suffix != ".so":
            (pkg / entry.name).symlink_to(entry)
    (pkg / "triton_kernels").symlink_to(ROOT / "triton_kernels")
    for so in list(build.glob("_planner*.so")) + [build / "_ops.so"]:
        shutil.copy2(so, pkg / so.name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")))
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    if args.list:
        for name, path, *_ in MUTANTS:
            print(f"{name:40} {path}")
        return 0
    chosen = [m for m in MUTANTS if not args.names or m[0] in args.names]
    unknown = set(args.names) - {m[0] for m in MUTANTS}
    if unknown:
        print(f"unknown mutants: {sorted(unknown)}", file=sys.stderr)
        return 2

    py = sys.executable
    ninja = shutil.which("ninja", path=str(Path(py).parent)) or shutil.which("ninja")
    work = Path(tempfile.mkdtemp(prefix="packkit-cpp-mutants-"))
    src, build, site = work / "src", work / "build", work / "site"
    shutil.copytree(ROOT / "csrc", src / "csrc")
    shutil.copy2(ROOT / "CMakeLists.txt", src / "CMakeLists.txt")
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{sysconfig.get_paths()['purelib']}")
    env.pop("TRITON_INTERPRET", None)
    started = time.perf_counter()

    def build_and_stage() -> subprocess.CompletedProcess:
        done = run(["cmake", "--build", str(build), "--target", "_planner", "_ops", "-j", str(args.jobs)])
        if done.returncode == 0:
            stage(build, site)
        return done

    def tests(selection) -> subprocess.CompletedProcess:
        return run([py, "-S", "-P", *PYTEST, *selection], cwd=ROOT, env=env)

    try:
        conf = run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    f"-DPython_EXECUTABLE={py}", f"-DCMAKE_MAKE_PROGRAM={ninja}"])
        if conf.returncode or build_and_stage().returncode:
            print(conf.stdout[-3000:], conf.stderr[-3000:])
            print("the unmutated build failed", file=sys.stderr)
            return 2
        check = run([py, "-S", "-P", "-c", "import packkit.packing.ops, packkit._planner as p; print(p.__file__)"], env=env, cwd=ROOT)
        if str(site) not in check.stdout:
            print("the staged build is not the one imported:", check.stdout, check.stderr, file=sys.stderr)
            return 2
        print(f"baseline build: {time.perf_counter() - started:.0f} s", flush=True)
        for name, _, _, _, selection in chosen:  # every selection passes unmutated: a kill means something
            t0 = time.perf_counter()
            base = tests(selection)
            if base.returncode != 0:
                print(base.stdout[-3000:], base.stderr[-2000:])
                print(f"baseline: tests of {name} fail without the mutant", file=sys.stderr)
                return 2
            print(f"baseline {name}: passed ({time.perf_counter() - t0:.0f} s)", flush=True)
        results = []
        for name, path, original, replacement, selection in chosen:
            t0 = time.perf_counter()
            target = src / path
            text = target.read_text()
            if text.count(original) != 1:
                results.append((name, "error: snippet found %d times" % text.count(original), ""))
                print(f"{name}: snippet occurs {text.count(original)} times in {path}", flush=True)
                continue
            target.write_text(text.replace(original, replacement))
            try:
                built = build_and_stage()
                if built.returncode != 0:
                    status, detail = "error: build failed", built.stdout[-500:]
                else:
                    out = tests(selection)
                    failed = [line.split(" - ")[0] for line in out.stdout.splitlines() if line.startswith("FAILED")]
                    status = {0: "SURVIVED", 1: "killed"}.get(out.returncode, f"error: pytest exit {out.returncode}")
                    if out.returncode < 0:  # the test process died of a signal (a crash fails CI too)
                        status, failed = "killed", failed + [f"pytest killed by signal {-out.returncode}"]
                    detail = ", ".join(failed) or (out.stdout.strip().splitlines() or [""])[-1]
            finally:
                target.write_text(text)
            results.append((name, status, detail))
            print(f"{name}: {status} ({time.perf_counter() - t0:.0f} s) {detail}", flush=True)
        build_and_stage()  # leave the folder's build unmutated
        killed = sum(s == "killed" for _, s, _ in results)
        print(f"\n{killed}/{len(results)} C++ mutants killed in {time.perf_counter() - started:.0f} s")
        return 0 if killed == len(results) else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
