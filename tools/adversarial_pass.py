"""The adversarial pass over packkit's public API (docs/reliability.md): each case is an input a user gets wrong,
with what must happen — a clear ``ValueError``/``TypeError``/``OverflowError`` whose message matches, or a
correct result. Anything else is a finding: another exception type (``IndexError``, ``AttributeError``,
``RuntimeError``), a silent acceptance, or a call that runs past the memory limit.

    python tools/adversarial_pass.py            # the table; exit 1 if any case fails
    python tools/adversarial_pass.py -k rl      # cases whose API or name contains "rl"

``tests/test_adversarial_pass.py`` runs it in CI under a memory limit. Add a case for every new finding.
"""
from __future__ import annotations

import argparse
import re
import resource
import sys

CLEAR = (ValueError, TypeError, OverflowError)


def run_case(case) -> tuple:
    """(passed, what happened)."""
    try:
        result = case.call()
    except CLEAR as exc:
        text = f"{type(exc).__name__}: {exc}"
        if case.match is None:
            return False, f"refused a valid call: {text}"
        if not re.search(case.match, str(exc)):
            return False, f"message does not say /{case.match}/: {text}"
        return True, text
    except MemoryError:
        return False, "MemoryError: allocation out of proportion to the input"
    except Exception as exc:  # noqa: BLE001 - any other type is the finding
        return False, f"{type(exc).__name__} (not a clear error): {exc}"
    if case.match is not None:
        return False, f"accepted silently: {result!r}"[:300]
    if case.check is not None and not case.check(result):
        return False, f"wrong result: {result!r}"[:300]
    return True, "ok"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only cases whose api or name contains this")
    parser.add_argument("--memory-gb", type=float, default=6.0, help="address-space limit (an allocation out of "
                        "proportion to a tiny input fails as MemoryError)")
    args = parser.parse_args(argv)
    limit = int(args.memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from adversarial_cases import CASES

    failed = 0
    print("| API | input | result |\n|---|---|---|")
    for case in CASES:
        if args.k and args.k not in case.api and args.k not in case.name:
            continue
        passed, what = run_case(case)
        failed += not passed
        print(f"| {case.api} | {case.name} | {'ok' if passed else '**FAIL**'}: {what[:160]} |".replace("\n", " "))
    print(f"\n{failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    raise SystemExit(main())
