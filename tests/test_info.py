"""`packkit info` (issue 22): run as users run it, in a subprocess, and read what it says. Its self-check must
report an op error as `raises RuntimeError`, and a probe that kills its process as a crash (the control)
while the report itself survives."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import packkit
from cp_reference import reference_shard
from pack_reference import (reference_layout, reference_pack, reference_pack_batch, reference_unpack,
                            reference_unpack_padded)
from packkit.tools import selfcheck
from packkit.tools.elf import read_elf

pytestmark = pytest.mark.full

ERROR_PROBES = ("plan of a sequence longer than capacity", "layout with num_cu_seqlens = 0",
                "pack with a pad value int64 cannot hold")


def run_info(*args, entry=("-m", "packkit")):
    cmd = [sys.executable, *entry, "info", *args] if entry else [*args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def report():
    proc = run_info("--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_versions_and_backends(report):
    env = report["environment"]
    assert env["torch"] == torch.__version__ and env["packkit"] == packkit.__version__
    assert env["torch_cuda"] == torch.version.cuda
    cpu = report["backends"]["cpu"]
    assert cpu["built"] and cpu["loaded"] and cpu["error"] is None
    assert set(cpu["registered"]) == {"plan", *selfcheck_ops()}
    cuda = report["backends"]["cuda"]
    assert cuda["loaded"] == packkit.ops.HAS_CUDA_KERNELS
    if cuda["loaded"]:
        assert set(cuda["registered"]) == set(selfcheck_ops())
    assert report["problems"] == []


def selfcheck_ops():
    return [name for name, _ in selfcheck.op_checks("cpu") if name != "plan"]


def test_build_record_and_runtime(report):
    build = report["build"]
    assert build["torch_target_version"] == "0x020a000000000000"  # the torch 2.10 floor
    assert build["cxx_compiler"] and build["torch_version"]
    ops = next(t for t in build["targets"].values() if t["file"] == "_ops.so")
    assert "-DTORCH_TARGET_VERSION=0x020a000000000000" in ops["compile_command"]
    module = build["modules"]["_ops.so"]
    assert module["cxx_runtime"] == "shared" and "libstdc++.so.6" in module["needed"]
    assert any(c.startswith(("GCC:", "clang")) for c in module["comment"])
    assert len(report["loaded_runtime"]["libstdc++"]) == 1  # exactly one C++ runtime in the process


def test_selfcheck_runs_every_cpu_op_and_error_probe(report):
    cpu = next(r for r in report["selfcheck"] if r["backend"] == "cpu")
    assert cpu["returncode"] == 0
    results = {c["check"]: c for c in cpu["checks"]}
    for name in ["plan", *selfcheck_ops()]:
        assert results[name]["result"] == "PASS", results[name]
    for probe in ERROR_PROBES:
        check = results[f"error probe: {probe}"]
        assert check["result"] == "PASS" and check["detail"].startswith("raises RuntimeError: packkit"), check


def test_crash_is_reported_not_suffered():
    """The control: a probe that segfaults its process. The report names it, with the signal, and still
    shows every check before it; the exit status says something is wrong."""
    proc = run_info("--crash-control")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "cpu    CRASH control probe: SIGSEGV: process killed by SIGSEGV" in out
    for probe in ERROR_PROBES:
        assert f"cpu    PASS  error probe: {probe}: raises RuntimeError: packkit" in out
    assert "cpu    PASS  pack_batch: matches the reference" in out
    assert "Fatal Python error: Segmentation fault" in out  # the crashed child's stack, kept for the report
    assert "PROBLEMS (1):" in out


def test_console_script_and_python_m():
    script = Path(sys.executable).with_name("packkit")
    if not script.exists():
        script = shutil.which("packkit")
    if script is None:
        pytest.skip("no packkit console script next to this interpreter")
    proc = run_info(str(script), "info", "--no-selfcheck", entry=None)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"torch {torch.__version__}" in proc.stdout and "build record (packkit/_build_info.json)" in proc.stdout


def test_known_answers_match_the_reference():
    s = selfcheck
    seq, start, length, bins = (torch.tensor(v) for v in s.PLAN)
    assert [x.tolist() for x in torch.ops.packkit.plan(torch.tensor(s.LENGTHS), s.CAPACITY)] == list(s.PLAN)
    ids, offsets = torch.tensor(s.IDS), torch.tensor(s.OFFSETS)
    cu, cu_seg = reference_layout(length, bins, s.NUM_ROWS, s.ROW_LEN, False)
    assert (cu.tolist(), cu_seg.tolist()) == s.LAYOUT
    args = (seq, start, cu, cu_seg)
    assert reference_pack(ids, offsets, *args, s.NUM_ROWS, s.ROW_LEN, False, -1, 7).tolist() == s.PACK
    assert reference_pack(ids, offsets, *args, s.NUM_ROWS, s.ROW_LEN, False, -1).tolist() == s.PACKED
    batch = reference_pack_batch(ids, None, offsets, seq, start, length, bins, s.NUM_ROWS, s.ROW_LEN, False, 0, -100,
                                 True, 0)
    assert tuple(t.tolist() for t in batch) == s.PACK_BATCH
    packed = torch.tensor(s.PACKED)
    assert reference_unpack(packed, offsets, *args, False, 0).tolist() == s.UNPACK
    assert reference_unpack_padded(packed, *args, False, 3, 4, -1).tolist() == s.UNPACK_PADDED
    ids, positions, cu_cp, _ = (torch.tensor(v) for v in s.CP_ROW)
    shard, _, padded_cu = reference_shard(ids, ids, positions, cu_cp.tolist(), 2, 1, "zigzag")
    assert padded_cu == s.CP_ROW[3]
    assert tuple(shard[k].tolist() for k in ("input_ids", "labels", "shift_labels", "position_ids", "src_index",
                                             "seq_idx")) == s.CP_SHARD
    assert s.PACK_BATCH[0][1] == s.CP_ROW[0] and s.PACK_BATCH[2][1] == s.CP_ROW[1]  # the row is pack_batch's row 1


def test_elf_reader_agrees_with_readelf():
    ops_so = Path(packkit.ops.__file__).resolve().parents[1] / "_ops.so"
    ops_so = ops_so if ops_so.exists() else Path(packkit._planner.__file__).with_name("_ops.so")
    if shutil.which("readelf") is None:
        pytest.skip("readelf not installed")
    out = subprocess.run(["readelf", "-d", str(ops_so)], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    assert read_elf(ops_so).needed == needed
