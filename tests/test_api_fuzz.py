"""The API-wide fuzzer (tools/api_fuzz.py, issue 46): every public callable registered, the committed corpus of
every failure it found replays clean, a fixed-seed run within its CI budget passes, and planted bugs are caught."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TOOLS = os.path.join(os.path.dirname(__file__), "..", "tools")
sys.path.insert(0, TOOLS)

from api_fuzz_lib import planted, registry  # noqa: E402
from api_fuzz_lib.runner import all_cases, run_cases  # noqa: E402

pytestmark = pytest.mark.full

# CI budget of the fixed-seed run (seconds of fuzzing; the whole test adds the imports, ~20-60 s on 2 cores).
CI_BUDGET = float(os.environ.get("PACKKIT_API_FUZZ_SECONDS", "60"))


def _fuzz(*args, timeout=600):
    return subprocess.run([sys.executable, os.path.join(TOOLS, "api_fuzz.py"), *args], capture_output=True,
                          text=True, timeout=timeout)


def test_every_public_callable_is_registered():
    assert registry.uncovered(registry.build()) == []


def test_the_corpus_replays_clean():
    with open(os.path.join(os.path.dirname(__file__), "fuzz_corpus", "api_fuzz.json")) as f:
        entries = json.load(f)
    assert entries, "the corpus holds every failure ever found"
    run = _fuzz("--replay", "--budget", "600")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


def test_a_fixed_seed_run_passes_within_its_budget():
    run = _fuzz("--seed", "0", "--budget", str(CI_BUDGET), timeout=CI_BUDGET + 300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert " 0 failed" in run.stdout


@pytest.fixture(scope="module")
def planted_results():
    reg: dict = {}
    planted.register(reg)
    return run_cases(reg, all_cases(reg), jobs=2, timeout=8.0)


@pytest.mark.parametrize("api, says", [
    ("planted.plan_alloc_by_dp", ("MemoryError", "crash", "hang")),  # sized by dp_size: over the 4 GiB limit
    ("planted.plan_touch_by_dp", ("out of proportion to the data",)),  # 256 MB for dp_size: the sizes oracle
    ("planted.rows_until_nonempty", ("hang",)),  # an empty pass read again forever
    ("planted.plan_int_cast", ("accepted silently",)),  # capacity=2.5 ran as 2
    # seconds of CPU for dp_size: the sizes oracle, or on a loaded machine (CI: 2**26 loop steps past the 8 s
    # per-case limit) the hang oracle; either is the argument-sized work caught
    ("planted.plan_spin_by_dp", ("out of proportion to the data", "hang: no result")),
    ("planted.plan_unnamed_message", ("message does not name 'capacity'",)),
    ("planted.plan_index_error", ("IndexError (not a clear error)",)),
    ("planted.plan_drops_last", ("wrong result",)),  # the checker: a sequence lost
    ("planted.plan_refuses_valid", ("refused a valid call",)),
    ("planted.plan_cost_cast", ("accepted silently",)),  # the callback oracle: a complex cost cast to real
])
def test_planted_bugs_are_caught(planted_results, api, says):
    mine = [r for r in planted_results if r["api"] == api]
    if api != "planted.plan_refuses_valid":
        assert [r for r in mine if r["cls"] == "baseline"][0]["outcome"] == "checked", "the valid call passes"
    caught = [r for r in mine if r["outcome"] == "fail" and any(s in r["detail"] for s in says)]
    assert caught, f"{api}: no failure saying {says}: {[(r['label'], r['detail']) for r in mine][:8]}"
