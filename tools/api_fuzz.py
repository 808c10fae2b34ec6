"""The API-wide fuzzer (issue 46, docs/reliability.md): walks packkit's public callables and classes by
``inspect.signature``, draws values for every parameter from six classes (sizes far beyond the data, numeric
extremes, devices/dtypes the build cannot serve, degenerate input, stale metadata, determinism), and runs each
case in a forked child under a 4 GiB address-space limit and a 20 s timeout. A case passes with a
``ValueError`` / ``TypeError`` naming the parameter, or a result that passes the API's invariant checker.

    python tools/api_fuzz.py --seed 0 --budget 60         # what CI runs (tests/test_api_fuzz.py)
    python tools/api_fuzz.py --budget 3600 --repeat        # an hour: every case, then again in new orders
    python tools/api_fuzz.py -k pack_rollout_groups        # one API
    python tools/api_fuzz.py --replay                      # the committed corpus of every failure found
    python tools/api_fuzz.py --coverage                    # public callables without a registration

Exit 1 if any case fails; ``--record`` appends new failures to the corpus (tests/fuzz_corpus/api_fuzz.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from api_fuzz_lib import registry  # noqa: E402
from api_fuzz_lib.runner import all_cases, run_cases, say, schedule, table  # noqa: E402

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fuzz_corpus", "api_fuzz.json")


def load_corpus(path: str = CORPUS) -> list:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def corpus_cases(entries: list, reg: dict) -> list:
    return [(e["api"], e["param"], e["cls"], e["label"], e["expect"]) for e in entries if e["api"] in reg]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=240.0, help="seconds; cases not started by then are skipped")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--memory-gb", type=float, default=4.0)
    parser.add_argument("-k", default="", help="only APIs whose name contains this")
    parser.add_argument("--cls", default="", help="only this class")
    parser.add_argument("--replay", action="store_true", help="run the corpus instead")
    parser.add_argument("--repeat", action="store_true", help="after every case ran, run them again in another "
                        "order (with --budget: fuzz for that long)")
    parser.add_argument("--record", action="store_true", help="append failures to the corpus")
    parser.add_argument("--coverage", action="store_true")
    parser.add_argument("--json", help="write every result here")
    parser.add_argument("--verbose", action="store_true", help="children keep their stdout/stderr")
    args = parser.parse_args(argv)

    registry.preload()
    reg = registry.build()
    if args.coverage:
        missing = registry.uncovered(reg)
        print("\n".join(f"{name}: no registration" for name in missing) or "every public callable is registered")
        return 1 if missing else 0
    names = [n for n in reg if args.k in n]
    if args.replay:
        cases = corpus_cases(load_corpus(), reg)
    else:
        cases = [c for c in all_cases(reg, names) if not args.cls or c[2] in (args.cls, "baseline")]
    say(f"{len(cases)} cases over {len(names)} APIs, seed {args.seed}, budget {args.budget:g} s")
    start, results, seed = time.monotonic(), [], args.seed
    while True:
        left = args.budget - (time.monotonic() - start)
        order = cases if args.replay else schedule(cases, seed)
        results += run_cases(reg, order, jobs=args.jobs, timeout=args.timeout,
                             memory=int(args.memory_gb * 2**30), budget=left, quiet=not args.verbose,
                             progress=lambda r: r["outcome"] == "fail" and say(
                                 f"FAIL {r['api']} {r['param']}={r['label']} [{r['cls']}]: {r['detail']}"))
        seed += 1
        if not args.repeat or args.replay or time.monotonic() - start >= args.budget:
            break
    failures = [r for r in results if r["outcome"] == "fail"]
    print(table(results))
    print(f"\n{len(results)} of {len(cases)} cases run in {time.monotonic() - start:.0f} s; {len(failures)} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=0)
    if args.record and failures:
        known = {(e["api"], e["param"], e["cls"], e["label"]) for e in load_corpus()}
        entries = load_corpus() + [{k: r[k] for k in ("api", "param", "cls", "label", "expect", "detail")}
                                   for r in failures if (r["api"], r["param"], r["cls"], r["label"]) not in known]
        os.makedirs(os.path.dirname(CORPUS), exist_ok=True)
        with open(CORPUS, "w") as f:
            json.dump(sorted(entries, key=lambda e: (e["api"], e["param"], e["label"])), f, indent=1)
            f.write("\n")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
