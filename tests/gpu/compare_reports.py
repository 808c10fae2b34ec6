"""Two `packkit info --save` reports side by side: the carried wheel (built on the CPU machine) and a build
on this machine. Each self-check's result under both, then how each was built. A check that passes with
one and fails or crashes with the other points at the build (toolchain, flags), not at torch.

    python tests/gpu/compare_reports.py build/gpu-run/diagnose-wheel.json build/gpu-run/diagnose-build.json
Exit status 1 if a report is missing or any check did not pass under either.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

BUILD_KEYS = ("torch_version", "torch_target_version", "cxx_compiler", "cxx_flags", "cuda_compiler",
              "cuda_architectures", "host", "env_CXX", "env_CXXFLAGS", "env_LDFLAGS", "env_LD_PRELOAD")


def results(doc: dict) -> dict:
    return {(r["backend"], c["check"]): c for r in doc["selfcheck"] for c in r["checks"]}


def main(paths: list[str]) -> int:
    docs = []
    for p in paths:
        if not Path(p).exists():
            print(f"missing report {p}: run `tests/gpu/run.sh diagnose` after `wheel` and after `build`")
            return 1
        docs.append(json.loads(Path(p).read_text()))
    names = [Path(p).stem.replace("diagnose-", "") for p in paths]
    rows = [results(d) for d in docs]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    width = max((len(f"{b} {c}") for b, c in keys), default=20)
    print(f"{'check':<{width}}  " + "  ".join(f"{n:<7}" for n in names))
    bad = 0
    for key in keys:
        cells = [r.get(key, {}).get("result", "-") for r in rows]
        bad += any(c != "PASS" for c in cells)
        print(f"{key[0] + ' ' + key[1]:<{width}}  " + "  ".join(f"{c:<7}" for c in cells))
    print()
    for key in BUILD_KEYS:
        values = [str(d["build"].get(key, "-")) or "-" for d in docs]
        mark = "" if len(set(values)) == 1 else "   <- differs"
        print(f"{key}:{mark}")
        for n, v in zip(names, values):
            print(f"  {n:<7} {v}")
    for n, d in zip(names, docs):
        rt = "; ".join(f"{k}: {', '.join(v) or 'none'}" for k, v in d["loaded_runtime"].items())
        print(f"loaded C++ runtime ({n}): {rt}")
    print(f"\n{bad} check(s) did not pass under both" if bad else "\nevery check passes under both")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:3]) if len(sys.argv) == 3 else __doc__)
