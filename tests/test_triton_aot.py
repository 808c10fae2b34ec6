"""tools/triton_aot.py (issue 48): its rules (tools/triton_aot_rules.py, pure: no triton in this process): limits,
cubin parsing and the loop-counter check, the source scan that every @triton.jit function is covered (a planted uncovered one fails), and the
launch enumeration in a child process: complete as is, and failing when a launcher combination is left out. The
compiles themselves run in CI's triton-AOT stage (.ci/run), a few minutes being too long for the suite."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.full

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("triton_aot_rules", ROOT / "tools" / "triton_aot_rules.py")
aot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(aot)

_TRITON = importlib.util.find_spec("triton")  # finds, never imports


def test_register_and_shared_memory_limits():
    # The CUDA layout_kernel the issue found: 88 registers x 1,024 threads on sm_90.
    assert aot.violations(88, 32, 0, 90) == ["88 registers x 1024 threads = 90112 > 65536"]
    assert aot.violations(64, 32, 0, 90) == []  # exactly a block's 65,536
    assert aot.violations(129, 16, 0, 100) and not aot.violations(128, 16, 0, 100)
    assert aot.violations(40, 4, 163 * 1024 + 1, 80) and not aot.violations(40, 4, 163 * 1024 + 1, 90)
    assert not aot.violations(40, 4, 227 * 1024, 100) and aot.violations(40, 4, 227 * 1024 + 1, 100)
    assert aot.violations(40, 4, 0, 75) == ["no shared memory limit known for cc 75"]


def test_cubin_resource_usage_parsing():
    text = """
Resource usage:
 Common:
  GLOBAL:0
 Function _pack_kernel:
  REG:72 STACK:8 SHARED:16 LOCAL:24 CONSTANT[0]:464 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function other:
  REG:12 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:1 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    got = aot.parse_resource_usage(text)
    assert got == {"_pack_kernel": dict(REG=72, STACK=8, SHARED=16, LOCAL=24),
                   "other": dict(REG=0 + 12, STACK=0, SHARED=0, LOCAL=0)}


def test_i32_loop_counters_are_found():
    ok = "    scf.for %k0 = %c0_i64 to %num_out step %c1024_i64  : i64 {"
    old = ("    %r:4 = scf.for %i0 = %c0_i32 to %num_items step %c1024_i32 iter_args(%a = %c0_i64) -> (i64)  : i32 {")
    assert aot.i32_loops(ok) == []
    assert len(aot.i32_loops(ok + "\n" + old)) == 1


def test_every_jit_function_is_covered(tmp_path):
    launched, helpers, errors = aot.jit_coverage()
    assert errors == []
    assert {"_layout_kernel", "_pack_kernel", "_fill_kernel", "_unpack_kernel", "_pack_batch_kernel",
            "_cp_shard_kernel", "_tree_pack_kernel"} <= launched
    assert "_locate" in helpers and "_max_combine" in helpers
    planted = tmp_path / "triton_kernels"
    shutil.copytree(ROOT / "triton_kernels", planted)
    with open(planted / "pack.py", "a") as f:
        f.write("\n\n@triton.jit\ndef _planted_kernel(x_ptr):\n    tl.store(x_ptr, 1)\n")
    _, _, errors = aot.jit_coverage(planted)
    assert errors == ["@triton.jit _planted_kernel is neither launched nor called by a kernel: not covered"]


def _run_tool(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-W", "ignore", "tools/triton_aot.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.skipif(_TRITON is None, reason="triton is not installed")
def test_launch_enumeration_is_complete_and_a_missing_drive_fails():
    rc, out = _run_tool("--list")
    assert rc == 0, out[-3000:]
    assert "combinations" in out and "of 7 kernels" in out, out[-3000:]
    rc, out = _run_tool("--list", "--skip-drive", "pack_first")  # pack(first_value=...) never called
    assert rc != 0
    assert "_pack_kernel: combination" in out and "no launcher call produced it" in out, out[-3000:]
