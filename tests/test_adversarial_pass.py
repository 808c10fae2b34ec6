"""The adversarial pass (tools/adversarial_pass.py) passes, and its harness flags what it must."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

TOOLS = os.path.join(os.path.dirname(__file__), "..", "tools")
sys.path.insert(0, TOOLS)

import adversarial_pass  # noqa: E402
from adversarial_cases import Case  # noqa: E402

pytestmark = pytest.mark.full


def test_every_case_passes_under_a_memory_limit():
    run = subprocess.run([sys.executable, os.path.join(TOOLS, "adversarial_pass.py"), "--memory-gb", "6"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("call, match, passed, says", [
    (lambda: [][1], "x", False, "IndexError (not a clear error)"),
    (lambda: 3, "must be", False, "accepted silently"),
    (lambda: int("x"), "must be", False, "message does not say"),
    (lambda: int("x"), None, False, "refused a valid call"),
    (lambda: int("x"), "invalid literal", True, "ValueError"),
    (lambda: 3, None, True, "ok"),
])
def test_the_harness_flags_what_it_must(call, match, passed, says):
    got, what = adversarial_pass.run_case(Case("api", "case", call, match))
    assert got == passed and says in what
