"""Runs one fuzz target under atheris (coverage-guided libFuzzer over packkit's Python code):

    python tests/fuzz/fuzz_one.py TARGET [libFuzzer flags] [CORPUS_DIR ...]

e.g. ``python tests/fuzz/fuzz_one.py plan -max_total_time=3600 /tmp/plan-corpus tests/fuzz/corpus/plan``.
Targets: see targets.TARGETS. A property violation raises (atheris writes ./crash-<sha1>); a native
crash or sanitizer report kills the process the same way. See tests/fuzz/README.md.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import atheris  # noqa: E402

with atheris.instrument_imports(include=["packkit", "targets"]):
    import packkit  # noqa: F401
    import targets

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in targets.TARGETS:
        sys.exit(f"usage: fuzz_one.py TARGET [libFuzzer flags] [CORPUS ...]; targets: {', '.join(targets.TARGETS)}")
    target = targets.TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
