"""Drives the Triton pack-kernel checks from a normal pytest process, without importing triton here.

* tests/triton_interp runs in a child pytest process with TRITON_INTERPRET=1 (the interpreter must be chosen
  before triton is imported; its numerics, bounds checker and guarded outputs need no GPU).
* tests/triton_interp/sm90_compile_check.py compiles every kernel specialisation the ops launch for sm_90
  (PTX + cubin, triton's bundled ptxas) in a child process without the interpreter: the type checks
  the interpreter never does; then the ops' fake impls and AOT autograd's decomposition into kernel
  launches (what torch.compile needs), without running a kernel.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_TRITON = importlib.util.find_spec("triton")  # finds, never imports
pytestmark = [pytest.mark.full, pytest.mark.skipif(_TRITON is None, reason="triton is not installed")]


def _has_nvidia_backend() -> bool:
    # Not find_spec("triton.backends.nvidia"): that would import triton into this process.
    return _TRITON is not None and any(
        (Path(loc) / "backends" / "nvidia" / "compiler.py").is_file() for loc in _TRITON.submodule_search_locations or ())


def _run(cmd, env, timeout):
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, (proc.stdout + proc.stderr)[-6000:]


# One child per test module, so that pytest-xdist spreads them over its workers (one child for the whole folder
# was the suite's serial tail: ~4 minutes on the 2-core CI machine).
_INTERP_MODULES = sorted(p.name for p in (ROOT / "tests" / "triton_interp").glob("test_*.py"))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="already interpreting: tests/triton_interp is collected in this process")
@pytest.mark.parametrize("module", _INTERP_MODULES)
def test_triton_kernels_interpreted(module):
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc, tail = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/triton_interp/{module}"],
                      env, 900)
    assert proc.returncode == 0, tail
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) > 0, tail
    assert not re.search(r"\d+ (failed|error)", proc.stdout), tail


@pytest.mark.skipif(not _has_nvidia_backend(), reason="triton has no NVIDIA backend")
def test_triton_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc, tail = _run([sys.executable, "tests/triton_interp/sm90_compile_check.py"], env, 600)
    if proc.returncode == 77:
        pytest.skip(f"compile harness unsupported by this triton: {tail[-300:]}")
    assert proc.returncode == 0, tail
    compiled = re.search(r"COMPILED (\d+)", proc.stdout)
    assert compiled and int(compiled.group(1)) > 0, tail
    assert re.search(r"TRACED \d+ kernel launches", proc.stdout), tail
