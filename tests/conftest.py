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

# The suite's longest tests, each a child process (seconds of one core on the 2-core CI machine, 2026-11-27), run
# first: pytest-xdist hands tests out in collection order, and one of these collected last was the suite's serial
# tail (the Triton interpreter child: ~4 minutes alone at the end). Longest first, the rest fill in beside them.
LONGEST_FIRST = (
    "test_triton_interpreted.py::test_triton_kernels_interpreted[test_pack_triton.py]",  # ~210 s
    "test_api_fuzz.py::test_a_fixed_seed_run_passes_within_its_budget",  # 120 s budget + imports
    "test_torchtitan_entry.py::",  # two torchtitan.train runs, ~100 s
    "test_torchtitan_pp_entry.py::",  # five torchtitan.train runs (seed, 1F1B, Interleaved, pp=1, PR 4098), ~150 s
    "test_triton_interpreted.py::test_triton_kernels_compile_for_sm90",
    "test_triton_interpreted.py::",
    "test_api_fuzz.py::test_the_corpus_replays_clean",
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        nodeid = item.nodeid.rsplit("/", 1)[-1]
        return next((i for i, key in enumerate(LONGEST_FIRST) if nodeid.startswith(key)), len(LONGEST_FIRST))
    items.sort(key=rank)  # stable: everything else keeps its order


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
