"""Which upstream releases break packkit, by name: the scheduled-style job behind constraints.txt.

For each package asked for (default: transformers, trl, datasets, torch), a fresh venv gets README's core install
pinned to constraints.txt **except that one package**, which goes to its newest release (or the version given as
``pkg==ver``); it is a fresh clone of HEAD (commit first), packkit is built into it and the core tier runs (``--full``: the full tier's installs and tests too).
One package moves at a time, so each failure is that package's. Prints a table and writes
``build/newest-releases.json``; exit status 1 when any package breaks a test or cannot be installed.

    python tools/newest_releases.py                      # the four packages, newest releases, core tier
    python tools/newest_releases.py transformers==5.24.0 # one package at a chosen version
    python tools/newest_releases.py trl --full -k pack_dataset

A package whose newest release is the pinned one is reported "pinned = newest" and not run. When the newest
release cannot be installed beside the other pins, the pins of the packages pip names in its conflict are lifted
and the attempt says so. What it costs: one venv per package (~1.7 GB core, +1.3 GB full; torch from PyPI is a
CUDA build of several GB) and a core-tier run each (~3-10 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("transformers", "trl", "datasets", "torch")


def readme_commands() -> tuple[str, str]:
    """README's core and full-tier commands (the ones .ci/run checks are there verbatim)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    core = next(l for l in lines if l.startswith("python3 -m venv") and "pytest -m core" in l)
    full = next(l for l in lines if l.startswith(".venv/bin/pip install") and "pytest -m full" in l)
    return core, full


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)$", line.strip())
        if m:
            out[canon(m.group(1))] = line.strip()
    return out


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def newest(package: str) -> str | None:
    run = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package], capture_output=True, text=True)
    m = re.search(rf"^{re.escape(package)} \(([^)]+)\)", run.stdout, re.M | re.I)
    return m.group(1) if m else None


def install_parts(command: str) -> list[str]:
    """The pip-install steps of a README command (everything before its pytest)."""
    steps = [s.strip() for s in command.split("&&")]
    return [s for s in steps if "pip install" in s or s.startswith("python3 -m venv")]


def sh(cmd: str, cwd: Path, log) -> subprocess.CompletedProcess:  # noqa: D103
    log.write(f"$ {cmd}\n")
    log.flush()
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True)


def conflicting(log_path: Path, known: dict[str, str]) -> set[str]:
    """Packages pip's resolver names in a conflict (so their pins can be lifted)."""
    text = log_path.read_text(errors="replace")
    return {name for name in known if re.search(rf"\b{re.escape(name)}\b", text.split("ResolutionImpossible")[0]
                                                 [-4000:], re.I)} if "ResolutionImpossible" in text else set()


def try_package(package: str, version: str, full: bool, pytest_args: list[str], work: Path) -> dict:
    """A fresh clone of HEAD (a newcomer's checkout: no build or venv of this tree is touched), its constraints.txt
    with ``package`` moved to ``version``, README's installs verbatim, then the tiers."""
    known = pins()
    result = {"package": package, "pinned": known.get(canon(package)), "tried": f"{package}=={version}",
              "lifted": []}
    clone = work / canon(package)
    log_path = work / f"{canon(package)}.log"
    core, full_cmd = readme_commands()
    steps = install_parts(core) + (install_parts(full_cmd) if full else [])
    lifted: set[str] = set()
    for attempt in range(2):
        keep = [line for name, line in known.items() if name != canon(package) and name not in lifted]
        with open(log_path, "w") as log:
            ok = not sh(f"rm -rf {clone} && git clone -q {ROOT} {clone}", ROOT, log).returncode
            (clone / "constraints.txt").write_text("\n".join(keep + [f"{package}=={version}"]) + "\n")
            for step in steps if ok else ():
                if sh(step, clone, log).returncode:
                    ok = False
                    break
        if ok:
            break
        more = conflicting(log_path, known) - lifted - {canon(package)}
        if attempt or not more:
            result.update(install="failed", log=str(log_path))
            return result
        lifted |= more
    result["lifted"] = sorted(lifted)
    result["install"] = "ok"
    result["failed"], result["counts"] = [], {}
    for tier in ["core"] + (["full"] if full else []):
        marker = f"== tier {tier} =="
        with open(log_path, "a") as log:
            log.write(marker + "\n")
            log.flush()
            run = sh(f".venv/bin/python -m pytest -m {tier} -n 2 -q -p no:cacheprovider {' '.join(pytest_args)}",
                     clone, log)
        tail = log_path.read_text(errors="replace").split(marker)[-1]
        result["failed"] += sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", tail, re.M)))
        summary = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?)\s*=*$", tail, re.M)
        result["counts"][tier] = summary[-1] if summary else f"pytest exit {run.returncode}"
    result["log"] = str(log_path)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", help="package or package==version (default: the newest of "
                                                     + ", ".join(DEFAULT) + ")")
    parser.add_argument("--full", action="store_true", help="the full tier's installs and tests too")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a quick look at one area)")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "newest-releases")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    pytest_args = ["-k", repr(args.keyword)] if args.keyword else []
    rows = []
    for spec in args.packages or DEFAULT:
        package, _, version = spec.partition("==")
        version = version or newest(package)
        pinned = pins().get(canon(package), "")
        if version is None:
            rows.append({"package": package, "pinned": pinned, "install": "no release found"})
        elif pinned == f"{package}=={version}":
            rows.append({"package": package, "pinned": pinned, "tried": pinned, "install": "pinned = newest"})
        else:
            print(f"-- {package}=={version} (pinned: {pinned or 'none'})", flush=True)
            rows.append(try_package(package, version, args.full, pytest_args, args.work))
    print("\n| package | pinned | tried | install | tests | broken tests |\n|---|---|---|---|---|---|")
    for r in rows:
        counts = "; ".join(f"{t}: {c}" for t, c in r.get("counts", {}).items()) or "-"
        broken = ", ".join(r.get("failed", [])) or "-"
        lifted = f" (pins lifted: {', '.join(r['lifted'])})" if r.get("lifted") else ""
        print(f"| {r['package']} | {r['pinned'] or '-'} | {r.get('tried', '-')} | {r['install']}{lifted} | {counts} "
              f"| {broken} |")
    out = ROOT / "build" / "newest-releases.json"
    out.write_text(json.dumps(rows, indent=1))
    print(f"\nwrote {out.relative_to(ROOT)}")
    return int(any(r.get("failed") or r["install"] == "failed" for r in rows))


if __name__ == "__main__":
    os.environ.setdefault("PIP_COMPILE", "0")  # no byte-compiling: ~2/3 of an install's CPU here
    sys.exit(main())
