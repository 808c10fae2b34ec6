"""The stable-ABI bisect (tests/gpu/abi_bisect) through the session's diagnose wiring, on the CPU: the extension
builds against this torch, every CPU-reachable step gives its expected verdict (ok, or raised for the throwing
ones), and a crash planted in one step (PACKKIT_BISECT_PLANT, a null dereference) is reported as
"crashed (SIGSEGV)", a hang planted in a later one as "timeout", and every other step still runs. Forced to the CPU build (CUDA_VISIBLE_DEVICES=""), so it
runs the same on a GPU machine; the GPU verdicts come from the session itself."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
HEADER = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "stable" / "library.h"
pytestmark = [
    pytest.mark.full,
    pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler (c++) to build the bisect extension"),
    pytest.mark.skipif(not HEADER.exists(), reason="this torch ships no stable-ABI headers"),
]

PLANTED, HUNG = "new_empty", "fill"


def _session(monkeypatch, out: Path):
    monkeypatch.setenv("PACKKIT_GPU_OUT", str(out))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("PACKKIT_BISECT_PLANT", f"{PLANTED},{HUNG}:hang")
    monkeypatch.setenv("PACKKIT_BISECT_TIMEOUT", "8")
    monkeypatch.setenv("PACKKIT_DEADLINE", "400")
    spec = importlib.util.spec_from_file_location("packkit_gpu_session", HERE / "session.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module.Session()


def test_bisect_reports_a_planted_crash_and_hang_and_runs_the_later_steps(monkeypatch, tmp_path):
    session = _session(monkeypatch, tmp_path)
    doc = session.bisect()
    assert doc.get("mode") == "cpu" and "steps" in doc, doc
    verdicts = {r["step"]: r["verdict"] for r in doc["steps"]}
    order = [r["step"] for r in doc["steps"]]
    assert order.index(PLANTED) < len(order) - 3  # steps after the planted crash exist and ran
    assert verdicts[PLANTED] == "crashed (SIGSEGV)", doc["steps"]
    assert verdicts[HUNG] == "timeout", doc["steps"]
    for row in doc["steps"]:
        if row["step"] in (PLANTED, HUNG):
            continue
        expected = "n/a" if row["step"] in ("device_guard", "stream", "stream_stable", "kernel", "launch_fail") \
            else row["expected"]
        assert row["verdict"] == expected, row
    assert verdicts["throw_plain"] == verdicts["throw_after_alloc"] == "raised"
    assert verdicts["return_tuple"] == verdicts["return_tensor"] == "ok"
    assert doc["summary"].startswith(f"first crash: {PLANTED} ("), doc["summary"]
    assert doc["exit"] == 1  # a step not as expected
    # What comes back from the device: the table in session.json's diagnose row and in diagnose.log.
    row = next(r for r in json.loads((tmp_path / "session.json").read_text())["steps"] if r["step"] == "diagnose")
    assert row["result"] == "RUNNING" and row["bisect"]["steps"] == doc["steps"], row
    assert f"{PLANTED}: crashed (SIGSEGV)" in (tmp_path / "diagnose.log").read_text()
