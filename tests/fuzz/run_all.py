"""CI fuzz run: every target for a bounded time, on a scratch copy of its committed corpus.

    python tests/fuzz/run_all.py --seconds 30 [--json results.json] [--targets plan,ops] [--keep DIR]

Prints one line per target (executions, new corpus entries, crashes) and exits 1 if any target found
a crash (its input is kept in the scratch folder and named in the output: add it to the corpus and
a test). ``--keep DIR`` copies every grown corpus to DIR/TARGET, for tests/fuzz/replay.py.

Run it on the normal build: atheris' Python coverage breaks when gcc's libasan is preloaded (libasan
then provides the coverage callbacks), so tests/sanitize/run.sh fuzzes here with coverage and replays
every input the fuzzer kept under ASan + UBSan afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--targets", default="")
    parser.add_argument("--json")
    parser.add_argument("--keep")
    args = parser.parse_args()
    from targets import TARGETS

    names = [t for t in args.targets.split(",") if t] or list(TARGETS)
    scratch = Path(tempfile.mkdtemp(prefix="packkit-fuzz-"))
    results, failed = {}, False
    for name in names:
        corpus = scratch / name
        shutil.copytree(HERE / "corpus" / name, corpus)
        before = len(list(corpus.iterdir()))
        cmd = [sys.executable, *(["-S"] if sys.flags.no_site else []), *(["-P"] if sys.flags.safe_path else []),
               str(HERE / "fuzz_one.py"), name, f"-max_total_time={args.seconds}", "-timeout=20",
               "-rss_limit_mb=4096", "-max_len=512", f"-artifact_prefix={scratch}/{name}-", str(corpus)]
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        runs = re.findall(r"Done (\d+) runs", log) or re.findall(r"#(\d+)\s", log)
        crashes = sorted(str(p) for p in scratch.glob(f"{name}-*"))
        results[name] = {"seconds": round(time.time() - start, 1), "executions": int(runs[-1]) if runs else 0,
                         "corpus_before": before, "corpus_after": len(list(corpus.iterdir())),
                         "exit_code": proc.returncode, "crashes": len(crashes), "crash_files": crashes}
        r = results[name]
        print(f"{name:16s} {r['executions']:>9,} executions in {r['seconds']:>5.1f} s, corpus {before} -> "
              f"{r['corpus_after']}, crashes: {r['crashes']}", flush=True)
        if proc.returncode != 0 or crashes:
            failed = True
            print(log[-6000:], file=sys.stderr)
        if args.keep:
            shutil.rmtree(Path(args.keep) / name, ignore_errors=True)
            shutil.copytree(corpus, Path(args.keep) / name)
            for crash in crashes:
                shutil.copy(crash, Path(args.keep) / name)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if not failed:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
