"""Replays fuzz inputs through their targets: ``python tests/fuzz/replay.py DIR`` runs every DIR/TARGET/*
file (e.g. the corpora run_all.py --keep grew) once; under tests/sanitize/run.sh this is how the inputs
found with coverage on the normal build reach the ASan + UBSan build. Exits 1 on a property violation;
a sanitizer report aborts the process."""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import TARGETS  # noqa: E402


def main(folder: str) -> int:
    failed = 0
    for target_dir in sorted(p for p in Path(folder).iterdir() if p.is_dir()):
        files = sorted(target_dir.iterdir())
        for path in files:
            try:
                TARGETS[target_dir.name](path.read_bytes())
            except Exception:
                failed += 1
                print(f"{path}: property violated", file=sys.stderr)
                traceback.print_exc()
        print(f"{target_dir.name:16s} {len(files):>6,} inputs replayed under this build", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
