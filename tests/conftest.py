"""Suite-wide hooks. With PACKKIT_REQUIRE_GPU=1 (tests/gpu/run.sh on a CUDA machine) a GPU test that
skips fails instead: see tests/gpu_gate.py."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Shared helpers (pack_reference, pack_samples, gpu_gate, ...) live here; test folders below import them.
sys.path.insert(0, str(Path(__file__).resolve().parent))

REQUIRED_TAG = "[gpu-required]"  # gpu_gate.REQUIRED_TAG (not imported: that would import torch early)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("PACKKIT_REQUIRE_GPU") != "1" or not report.skipped:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if REQUIRED_TAG in reason:
        report.outcome = "failed"
        report.longrepr = f"skipped on a GPU machine, which must run it: {reason}"
