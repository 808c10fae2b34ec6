"""The stable-ABI bisect (issue 48): builds tests/gpu/abi_bisect/bisect_op.cu against this torch with this machine's
compilers (nvcc for a CUDA torch with nvcc found: the CUDA steps; else the C++ compiler, -x c++: the CPU steps),
then calls each step's op in its own forked child process, in the order packkit's CUDA op host code uses the
facilities, and writes a table: step, verdict (ok / raised / crashed (SIGNAL) / timeout / exit N), detail. The first
crashed step names the facility (and the line of csrc/ops/pack_op.cu) that kills the process.

    python tests/gpu/abi_bisect/run_bisect.py OUT_DIR [--json FILE] [--cpu] [--build-only] [--timeout S]

The parent imports torch but never initialises CUDA, so each forked child starts CUDA itself. A child prints a
faulthandler traceback to stderr when it crashes. Exit status 0 when every step gave its expected verdict.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "bisect_op.cu"
TARGET_VERSION = "0x020a000000000000"  # packkit's TORCH_TARGET_VERSION (CMakeLists.txt)

# (step, what it exercises, the line of packkit it stands for, device-only, expected verdict)
STEPS = (
    ("load", "torch.ops.load_library of the extension", "import of packkit/_ops_cuda.so", False, "ok"),
    ("unbox_tensor", "a Tensor argument in and out (echo)", "TORCH_BOX(&pack_cuda): const Tensor& src", False, "ok"),
    ("unbox_scalars", "int, float, bool arguments", "pack_cuda(num_rows, row_len, flat, pad_value)", False, "ok"),
    ("unbox_optionals", "Tensor?, float?, int? arguments", "pack_batch_cuda(labels), pack(first_value), cp_shard",
     False, "ok"),
    ("unbox_string", "a str argument", "plan(algorithm, overlong)", False, "ok"),
    ("tensor_queries", "is_cuda, get_device_index, dim, numel, dtype, strides, data_ptr",
     "check_cuda / check_index_tensor / check_aligned", False, "ok"),
    ("device_guard", "torch::stable::accelerator::DeviceGuard", "pack_op.cu: DeviceGuard guard(src.get_device_index())",
     True, "ok"),
    ("contiguous", "torch::stable::contiguous under the guard", "pack_cuda_impl: torch::stable::contiguous(src)",
     False, "ok"),
    ("new_empty", "torch::stable::new_empty (same dtype, Int)", "pack_cuda: new_empty(src, packed_shape(...))",
     False, "ok"),
    ("empty", "torch::stable::empty on the tensor's device", "(allocation through aten::empty)", False, "ok"),
    ("fill", "torch::stable::zero_ / fill_ of a new tensor", "(aten calls from inside an op)", False, "ok"),
    ("stream", "aoti_torch_get_current_cuda_stream", "cuda_launch.cuh current_stream(t)", True, "ok"),
    ("stream_stable", "torch::stable::accelerator::getCurrentStream", "(the accelerator-generic stream lookup)",
     True, "ok"),
    ("kernel", "an iota kernel on that stream + cudaGetLastError", "launch_pack<<<..., stream>>>; check_launch",
     True, "ok"),
    ("return_tensor", "a new Int tensor returned", "return out (pack, unpack, layout)", False, "ok"),
    ("return_tuple", "a tuple of 5 new tensors returned", "pack_batch_cuda: return {ids, lab, ...}", False, "ok"),
    ("throw_plain", "STD_TORCH_CHECK(false) in an op", "every argument check (check_*)", False, "raised"),
    ("throw_after_alloc", "a throw with a DeviceGuard and a new tensor alive", "check_launch / checks after new_empty",
     False, "raised"),
    ("launch_fail", "a launch the device refuses (4,096 threads), then the check throws",
     "check_launch after a refused launch (layout_kernel's registers)", True, "raised"),
)


def _call(step: str, lib: str, device: str):
    """Runs one step in this (child) process; returns a detail string or raises."""
    torch.ops.load_library(lib)
    if step == "load":
        return f"loaded {Path(lib).name}"
    op = getattr(torch.ops.packkit_bisect, step if step != "unbox_tensor" else "echo_arg")
    t = torch.arange(8, dtype=torch.int64, device=device)
    if step == "unbox_tensor":
        out = op(t)
        assert out.data_ptr() == t.data_ptr(), "echo returned another tensor"
        torch.ops.packkit_bisect.unbox_tensor(t)
        return "echo returned its input"
    args = {"unbox_scalars": (t, 7, 0.5, True), "unbox_optionals": (t, t, None, 3), "unbox_string": (t, "obfd")}
    out = op(*args.get(step, (t,)))
    if device == "cuda":
        torch.cuda.synchronize()
    expect = {"contiguous": lambda o: torch.equal(o.cpu(), t.cpu()),
              "fill": lambda o: o.tolist() == [5] * 4,
              "return_tensor": lambda o: o.dtype == torch.int32 and o.tolist() == [2] * 3,
              "return_tuple": lambda o: [x.dtype for x in o] == [torch.int64] * 3 + [torch.int32] * 2
              and all(bool((x == 1).all()) for x in o),
              "kernel": lambda o: torch.equal(o.cpu(), torch.arange(1000))}
    if step in expect:
        assert expect[step](out), f"wrong result: {out}"
        devices = {str(x.device) for x in (out if isinstance(out, tuple) else (out,))}
        assert devices == {str(t.device)}, f"result on {devices}, input on {t.device}"
        return f"correct result on {t.device}"
    return "returned"


def _child(step: str, lib: str, device: str, conn) -> None:
    import faulthandler

    faulthandler.enable()
    try:
        detail = _call(step, lib, device)
    except Exception as e:  # noqa: BLE001  (the verdict: any Python exception is "raised")
        conn.send(("raised", f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"))
    else:
        conn.send(("ok", detail))
    conn.close()


def run_step(step: str, lib: str, device: str, timeout: float) -> dict:
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    begin = time.monotonic()
    proc = ctx.Process(target=_child, args=(step, lib, device, send), daemon=True)
    proc.start()
    send.close()
    proc.join(timeout)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        verdict, detail = "timeout", f"no answer in {timeout:.0f} s"
    elif (answer := _answer(recv)) is not None:
        verdict, detail = answer
        if proc.exitcode:
            detail += f" (then exit {proc.exitcode})"
    elif proc.exitcode < 0:
        verdict, detail = f"crashed ({signal.Signals(-proc.exitcode).name})", "the process died in the call"
    else:
        verdict, detail = f"exit {proc.exitcode}", "no verdict sent"
    return {"step": step, "verdict": verdict, "detail": detail, "seconds": round(time.monotonic() - begin, 2)}


def _answer(conn):
    """The child's (verdict, detail), or None when it died before sending one (EOF on the pipe)."""
    try:
        return conn.recv() if conn.poll() else None
    except EOFError:
        return None


def build(out: Path, cuda: bool, arch: str | None) -> tuple:
    """(library path, command) of the extension built with nvcc (cuda) or the C++ compiler."""
    torch_dir = Path(torch.__file__).parent
    lib = out / ("bisect_cuda.so" if cuda else "bisect_cpu.so")
    common = ["-shared", "-O2", "-std=c++17", f"-DTORCH_TARGET_VERSION={TARGET_VERSION}",
              f"-I{torch_dir / 'include'}", str(SOURCE), "-o", str(lib), f"-L{torch_dir / 'lib'}", "-ltorch_cpu",
              "-lc10"]
    if cuda:
        nvcc = _nvcc()
        cmd = [nvcc, "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]",
               *common, "-ltorch_cuda"]
    else:
        cmd = [os.environ.get("CXX", "c++"), "-fPIC", "-x", "c++", *common]
    out.mkdir(parents=True, exist_ok=True)
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return lib, cmd


def _gpu_capability() -> str | None:
    """The first GPU's compute capability ("90"), asked in a child: this process must not touch CUDA before it
    forks the steps' children (is_available and get_device_capability initialise the driver here)."""
    probe = ("import torch; print('%d%d' % torch.cuda.get_device_capability() if torch.cuda.is_available() "
             "else '')")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None
    return out.stdout.strip() or None


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/opt/cuda"):
        if home and os.path.exists(f"{home}/bin/nvcc"):
            return f"{home}/bin/nvcc"
    return None


def table(rows: list) -> str:
    lines = [f"{'step':<18} {'verdict':<20} detail"]
    lines += [f"{r['step']:<18} {r['verdict']:<20} {r['detail']}" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default="build/abi_bisect")
    ap.add_argument("--json", help="where to write the table as JSON (also: OUT/bisect.json)")
    ap.add_argument("--cpu", action="store_true", help="the C++ build and CPU tensors even on a CUDA machine")
    ap.add_argument("--build-only", action="store_true", help="compile (nvcc when --arch is given) and stop")
    ap.add_argument("--arch", help="compute capability for nvcc, e.g. 90 (default: the GPU's)")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("PACKKIT_BISECT_TIMEOUT", 60)))
    args = ap.parse_args()
    out = Path(args.out)
    capability = None if args.cpu or torch.version.cuda is None else _gpu_capability()
    gpu = capability is not None
    cuda = (gpu or (args.build_only and args.arch is not None)) and _nvcc() is not None
    arch = (args.arch or capability) if cuda else None
    doc = {"torch": torch.__version__, "cuda": torch.version.cuda, "mode": "cuda" if cuda else "cpu", "steps": []}
    if gpu and not cuda:
        doc["note"] = "a CUDA GPU but no nvcc: only the CPU steps (C++ build, CPU tensors)"
    try:
        lib, cmd = build(out, cuda, arch)
        doc["build"] = " ".join(cmd)
    except (subprocess.CalledProcessError, OSError) as e:
        doc["build"] = f"FAILED: {e}"
        _save(doc, out, args.json)
        print(f"the bisect extension did not build: {e}")
        return 1
    if args.build_only:
        _save(doc, out, args.json)
        print(f"built {lib}")
        return 0
    assert not torch.cuda.is_initialized(), "CUDA was initialised before the children forked"
    device = "cuda" if cuda else "cpu"
    for step, what, packkit_line, device_only, expected in STEPS:
        if device_only and not cuda:
            row = {"step": step, "verdict": "n/a", "detail": "device-only step (CPU build)", "seconds": 0.0}
        else:
            row = run_step(step, str(lib), device, args.timeout)
        row.update(exercises=what, packkit=packkit_line, expected=expected)
        doc["steps"].append(row)
        print(f"{row['step']:<18} {row['verdict']:<20} {row['detail']}", flush=True)
        _save(doc, out, args.json)  # a run cut off still leaves the rows done so far
    bad = [r for r in doc["steps"] if r["verdict"] not in (r["expected"], "n/a")]
    first_crash = next((r for r in doc["steps"] if r["verdict"].startswith("crashed")), None)
    doc["summary"] = (f"first crash: {first_crash['step']} ({first_crash['exercises']}; packkit: "
                      f"{first_crash['packkit']})" if first_crash else "no step crashed") + (
        f"; {len(bad)} step(s) not as expected: {', '.join(r['step'] for r in bad)}" if bad else
        "; every step as expected")
    _save(doc, out, args.json)
    print(doc["summary"])
    return 1 if bad else 0


def _save(doc: dict, out: Path, extra: str | None) -> None:
    text = json.dumps(doc, indent=1) + "\n"
    for path in {out / "bisect.json", *([Path(extra)] if extra else [])}:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
