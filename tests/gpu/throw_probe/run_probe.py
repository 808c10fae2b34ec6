"""Builds tests/gpu/throw_probe/throw_op.cpp with this machine's C++ compiler against this torch, twice:
as packkit builds (shared C++ runtime), and as the control with -static-libstdc++ -static-libgcc (which
crashed on every throw when tried on the CPU machine). Each build is loaded and called in a child process:
echo (valid call) then throw_now (must raise RuntimeError). Prints one line per build; exit 1 if the normal
build does not raise.

    python tests/gpu/throw_probe/run_probe.py OUT_DIR
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CHILD = """
import sys, torch
torch.ops.load_library(sys.argv[1])
t = torch.ones(3)
assert torch.ops.packkit_probe.echo(t).sum().item() == 3.0
print("echo ok", flush=True)
try:
    torch.ops.packkit_probe.throw_now(t)
except RuntimeError as e:
    print("raises RuntimeError:", str(e).splitlines()[0][-60:])
else:
    print("returned normally")
"""


def build(out: Path, name: str, extra: list[str]) -> Path:
    torch_dir = Path(torch.__file__).parent
    cxx = os.environ.get("CXX", "c++")
    lib = out / f"{name}.so"
    cmd = [cxx, "-shared", "-fPIC", "-O2", "-std=c++17", "-DTORCH_TARGET_VERSION=0x020a000000000000",
           f"-I{torch_dir / 'include'}", str(HERE / "throw_op.cpp"), "-o", str(lib),
           f"-L{torch_dir / 'lib'}", "-ltorch_cpu", "-lc10", *extra]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return lib


def call(lib: Path) -> str:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(lib)], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode < 0:
        return f"crashed ({signal.Signals(-proc.returncode).name}) after: {lines[-1] if lines else 'nothing'}"
    if proc.returncode:
        return f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
    return lines[-1]


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/throw_probe")
    out.mkdir(parents=True, exist_ok=True)
    normal = call(build(out, "throw_op", []))
    print(f"throw probe, shared C++ runtime (as packkit builds): {normal}")
    control = call(build(out, "throw_op_static", ["-static-libstdc++", "-static-libgcc"]))
    print(f"throw probe, -static-libstdc++ -static-libgcc (control): {control}")
    return 0 if normal.startswith("raises RuntimeError") else 1


if __name__ == "__main__":
    sys.exit(main())
