"""``packkit info``: what a bug report needs, and a self-check that survives a crashing op.

Prints the torch / CUDA / Triton versions, which backends are built, loaded and registered, how each
compiled module was built (packkit/_build_info.json, the compilers named in its ELF ``.comment``, the
libraries it needs), the C++ runtime this process really loaded, and then runs
``packkit.tools.selfcheck`` once per available backend in a child process: every op against known
answers and error probes that must raise. A child that dies is reported with its signal and the check it
was running. Exit status 1 if any check failed or crashed, or a module links its own C++ runtime.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import sys
from pathlib import Path
from typing import Optional

from .elf import mapped_libraries, newest_versions, read_elf

OPS = ("layout", "pack", "pack_batch", "unpack", "unpack_padded", "layout_out", "pack_out", "pack_batch_out",
       "unpack_out", "unpack_padded_out", "cp_shard")
# A C++ exception thrown in an op unwinds through torch's frames: both must use one libstdc++ and one
# libgcc_s unwinder. A module that links either statically turns every raised error into a crash.
SHARED_RUNTIME = ("libstdc++.so.6", "libgcc_s.so.1")


def _package_dir() -> Path:
    from .. import _planner  # compiled files sit beside it (in site-packages, also for editable installs)

    return Path(_planner.__file__).resolve().parent


def _version(dist: str):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _registered(op: str, key: str) -> bool:
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, key))


def environment() -> dict:
    import torch

    from .._version import __version__

    info = {"packkit": __version__, "location": str(Path(__file__).resolve().parents[1]),
            "python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "torch_cxx11_abi": torch.compiled_with_cxx11_abi(),
            "cuda_available": torch.cuda.is_available(), "devices": [], "triton": _version("triton")}
    if info["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["devices"].append(f"{p.name} (compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB)")
        info["cuda_driver"] = _cuda_driver_version()
    return info


def _cuda_driver_version():
    try:
        import ctypes

        version = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):
        return None


def backends() -> dict:
    """built (the file is there), loaded (imported without error) and registered (kernels in torch's dispatcher)."""
    import torch

    here = _package_dir()
    out = {}
    try:
        from ..packing import ops

        cpu_loaded, cpu_error, has_cuda, cuda_error = True, None, ops.HAS_CUDA_KERNELS, ops.CUDA_LOAD_ERROR
    except Exception as e:  # a library that does not load is exactly what this command must report
        cpu_loaded, cpu_error, has_cuda, cuda_error = False, f"{type(e).__name__}: {e}", False, None
    out["cpu"] = {"built": (here / "_ops.so").exists(), "file": "_ops.so", "loaded": cpu_loaded, "error": cpu_error,
                  "registered": [op for op in ("plan",) + OPS if cpu_loaded and _registered(f"packkit::{op}", "CPU")]}
    cuda_built = (here / "_ops_cuda.so").exists()
    out["cuda"] = {"built": cuda_built, "file": "_ops_cuda.so", "loaded": has_cuda,
                   "error": None if has_cuda else "not built" if not cuda_built else
                   "torch is a CPU build" if not torch.version.cuda else cuda_error or "not loaded",
                   "registered": [op for op in OPS if has_cuda and _registered(f"packkit::{op}", "CUDA")]}
    import importlib.util

    triton_spec = importlib.util.find_spec("packkit.triton_kernels")  # beside packkit/ in an editable install
    try:
        from ..triton_kernels import context_parallel as _triton_cp  # noqa: F401
        from ..triton_kernels import pack as _triton  # noqa: F401

        triton_loaded, triton_error = True, None
    except Exception as e:
        triton_loaded, triton_error = False, f"{type(e).__name__}: {e}"
    out["triton"] = {"built": triton_spec is not None, "file": "triton_kernels/", "loaded": triton_loaded,
                     "error": triton_error,
                     "registered": [op for op in OPS if triton_loaded and hasattr(torch.ops.packkit, "triton_" + op)]}
    return out


def build_record() -> dict:
    """packkit/_build_info.json plus, per compiled module, what its ELF file says."""
    here = _package_dir()
    path = here / "_build_info.json"
    record = json.loads(path.read_text()) if path.exists() else {"missing": str(path)}
    modules = {}
    for f in sorted(here.glob("*.so")):
        try:
            elf = read_elf(f)
        except (OSError, ValueError) as e:
            modules[f.name] = {"error": str(e)}
            continue
        static = [lib for lib in SHARED_RUNTIME if lib not in elf.needed]
        modules[f.name] = {"comment": elf.comment, "needed": elf.needed, "runpath": elf.runpath, "versions": elf.versions,
                           "cxx_runtime": "shared" if not static else "NOT shared: links " + ", ".join(static)
                           + " statically (or not at all)"}
    record["modules"] = modules
    return record


def wheel_record(modules: dict) -> dict:
    """The installed wheel's tag (its dist-info WHEEL file), the newest glibc / libstdc++ symbol versions its
    compiled modules need (``modules``: :func:`build_record`'s, read from their ELF files) and the glibc this
    machine runs."""
    tags = []
    try:
        wheel = importlib.metadata.distribution("packkit").read_text("WHEEL") or ""
        tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    except importlib.metadata.PackageNotFoundError:
        pass
    versions: dict[str, list[str]] = {}
    for m in modules.values():
        for lib, names in m.get("versions", {}).items():
            versions.setdefault(lib, []).extend(names)
    libc, libc_version = platform.libc_ver()
    return {"tags": tags, "needs": newest_versions(versions), "libc": f"{libc} {libc_version}".strip() or "unknown"}


def _older(have: str, need: str) -> bool:
    return tuple(map(int, have.split("."))) < tuple(map(int, need.split(".")))


def run_selfcheck(backend: str, crash_control: bool = False, timeout: Optional[float] = None) -> dict:
    """Runs the self-check of one backend in a child process; a crash is a result, not our crash (the same
    runner ``backend="auto"`` checks a GPU's device paths with, packkit.packing.backend_check). Timeout: ``timeout``,
    else ``$PACKKIT_CHECK_TIMEOUT``, else 300 s (a cold machine: the first CUDA call, Triton's compiles)."""
    from ..packing.backend_check import run_selfcheck as run_child

    return run_child(backend, crash_control=crash_control, timeout=timeout)


def collect(selfcheck: bool = True, crash_control: bool = False) -> dict:
    doc = {"environment": environment(), "backends": backends(), "build": build_record()}
    doc["wheel"] = wheel_record(doc["build"]["modules"])
    # After the op libraries are loaded: the C++ runtime these modules really use in this process.
    doc["loaded_runtime"] = mapped_libraries("libstdc++", "libgcc_s")
    problems = []
    for name, m in doc["build"]["modules"].items():
        if m.get("cxx_runtime", "shared") != "shared":
            problems.append(f"{name}: {m['cxx_runtime']}: errors raised in it cannot reach Python")
    for lib, paths in doc["loaded_runtime"].items():
        if len(paths) > 1:
            problems.append(f"two {lib} are loaded: {', '.join(paths)}")
    libc, needs = doc["wheel"]["libc"], doc["wheel"]["needs"]
    if libc.startswith("glibc ") and "GLIBC" in needs and _older(libc.split()[1], needs["GLIBC"]):
        problems.append(f"the compiled modules need glibc >= {needs['GLIBC']}, this machine has {libc}: "
                        "install a wheel for an older glibc or build from source (docs/install.md)")
    if not doc["backends"]["cpu"]["loaded"]:
        problems.append(f"the CPU ops did not load: {doc['backends']['cpu']['error']}")
    doc["selfcheck"] = []
    if selfcheck:
        env, b = doc["environment"], doc["backends"]
        runnable = [("cpu", b["cpu"]["loaded"]), ("cuda", b["cuda"]["loaded"] and env["cuda_available"]),
                    ("triton", b["triton"]["loaded"] and env["cuda_available"])]
        for backend, ok in runnable:
            if ok:
                result = run_selfcheck(backend, crash_control=crash_control and backend == "cpu")
            else:
                result = {"backend": backend, "checks": [],
                          "skipped": "no GPU" if b[backend]["loaded"] else b[backend]["error"] or "not loaded"}
            doc["selfcheck"].append(result)
            for c in result["checks"]:
                if c["result"] != "PASS":
                    problems.append(f"{backend} {c['check']}: {c['result']} ({c['detail']})")
    doc["problems"] = problems
    return doc


def format_report(doc: dict) -> str:
    env, out = doc["environment"], []
    out.append(f"packkit {env['packkit']} at {env['location']}")
    out.append(f"python {env['python']} on {env['platform']}")
    cuda = f"CUDA {env['torch_cuda']} build" if env["torch_cuda"] else "CPU build"
    out.append(f"torch {env['torch']} ({cuda}; CUDA available: {'yes' if env['cuda_available'] else 'no'}; "
               f"C++11 ABI: {env['torch_cxx11_abi']})")
    for d in env["devices"]:
        out.append(f"  GPU: {d}; driver CUDA {env.get('cuda_driver') or '?'}")
    out.append(f"triton {env['triton'] or 'not installed'}")
    out.append("")
    out.append("backends          built  loaded  registered")
    for name, b in doc["backends"].items():
        total = len(OPS) + (1 if name == "cpu" else 0)
        line = (f"  {name:<6} {b['file']:<16} {'yes' if b['built'] else 'no':<6} {'yes' if b['loaded'] else 'no':<7} "
                f"{len(b['registered'])}/{total} ops")
        if b["error"]:
            line += f"  ({b['error'][:200]})"
        out.append(line)
    out.append("")
    wheel = doc["wheel"]
    needs = wheel["needs"]
    out.append(f"wheel tag: {', '.join(wheel['tags']) or 'unknown (not installed from a wheel)'}; its modules need "
               f"glibc >= {needs.get('GLIBC', '?')}, libstdc++ GLIBCXX >= {needs.get('GLIBCXX', '?')}, "
               f"CXXABI >= {needs.get('CXXABI', '?')}; this machine runs {wheel['libc']}")
    build = doc["build"]
    if "missing" in build:
        out.append(f"build record: missing ({build['missing']})")
    else:
        out.append(f"build record (packkit/_build_info.json): built {build.get('built_at')} on {build.get('host')}, "
                   f"commit {build.get('git_commit') or '?'}")
        out.append(f"  against torch {build.get('torch_version')} (headers {build.get('torch_include')}), "
                   f"TORCH_TARGET_VERSION {build.get('torch_target_version')}; CMake {build.get('cmake')}")
        out.append(f"  C++: {build.get('cxx_compiler')}; flags: {build.get('cxx_flags') or '-'}")
        if build.get("cuda_compiler"):
            out.append(f"  CUDA: {build.get('cuda_compiler')}; architectures {build.get('cuda_architectures')}")
        env_flags = {k[4:]: v for k, v in build.items() if k.startswith("env_") and v}
        if env_flags:
            out.append("  build environment: " + "; ".join(f"{k}={v}" for k, v in env_flags.items()))
    targets = build.get("targets", {})
    for name, m in build["modules"].items():
        out.append(f"  {name}")
        target = next((t for t in targets.values() if t.get("file") == name), None)
        if target:
            out.append(f"    compiled: {target['compile_command']}")
            if target.get("link_options"):
                out.append(f"    link options: {target['link_options']}")
        if "error" in m:
            out.append(f"    ELF: {m['error']}")
            continue
        out.append(f"    .comment: {' | '.join(m['comment']) or '-'}")
        out.append(f"    needs: {', '.join(m['needed'])}{'; runpath ' + ':'.join(m['runpath']) if m['runpath'] else ''}")
        out.append(f"    C++ runtime: {m['cxx_runtime']}")
    out.append("")
    rt = doc["loaded_runtime"]
    out.append("loaded in this process: " + "; ".join(f"{k}: {', '.join(v) or 'none'}" for k, v in rt.items()))
    if doc["selfcheck"]:
        out.append("")
        out.append("self-check (each backend in its own process; known answers from the reference):")
    for r in doc["selfcheck"]:
        if "skipped" in r:
            out.append(f"  {r['backend']}: skipped ({r['skipped']})")
            continue
        for c in r["checks"]:
            out.append(f"  {r['backend']:<6} {c['result']:<5} {c['check']}: {c['detail']}")
            for line in c.get("stderr_tail", []):
                out.append(f"         | {line}")
    out.append("")
    if doc["problems"]:
        out.append(f"PROBLEMS ({len(doc['problems'])}):")
        out.extend(f"  - {p}" for p in doc["problems"])
    else:
        out.append("OK: no problems found")
    return "\n".join(out)


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="versions, backends, build record and a self-check (paste it into bug reports)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-selfcheck", action="store_true", help="skip the self-check (no op is called)")
    p.add_argument("--save", metavar="PATH", help="also write the report as JSON to PATH")
    p.add_argument("--crash-control", action="store_true",
                   help="add a probe that kills the CPU check's process with SIGSEGV, to show crashes are reported")


def run(args) -> int:
    doc = collect(selfcheck=not args.no_selfcheck, crash_control=args.crash_control)
    if args.save:
        Path(args.save).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1) if args.json else format_report(doc))
    return 1 if doc["problems"] else 0


if __name__ == "__main__":  # python -m packkit.tools.info (packkit info is the usual way)
    parser = argparse.ArgumentParser(prog="packkit")
    add_parser(parser.add_subparsers(dest="command", required=True))
    sys.exit(run(parser.parse_args(["info"] + sys.argv[1:])))
