"""Which device path ``backend="auto"`` may take on this GPU: each one proves itself first, once.

At the first CUDA use of a process, the CUDA kernels, then the compiled Triton kernels, run packkit's self-check
(``python -m packkit.tools.selfcheck BACKEND``: every op against known answers, and error probes that must raise)
in a child process, so a kernel or op layer that crashes, answers wrongly or hangs on this torch build and GPU is
a verdict, not the user's crash. The first backend that passes is used; if none does, the CPU ops run with a host
round trip. The verdict is cached per packkit build, torch build, Triton version and GPU name in
``$PACKKIT_CACHE_DIR`` (default ``$XDG_CACHE_HOME/packkit``, else ``~/.cache/packkit``), so later processes read
a file instead of checking again; delete the file to check again. A fallback says so in one warning naming the
failed check and the cache file. ``PACKKIT_BACKEND=cuda|triton|cpu`` forces a backend without any check.

After the first call per device, choosing is one dict lookup: no child process, no file, no device sync.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Optional

import torch

import packkit.packing.ops as _ops  # the module, not the package: no import circle through packkit.packing

FORCE_ENV = "PACKKIT_BACKEND"
FORCED = ("cuda", "triton", "cpu")
CHECK_TIMEOUT_S = 300.0  # a cold machine: the first CUDA call, Triton's compiles (PACKKIT_CHECK_TIMEOUT overrides)
HOST = "host"  # the CPU ops on a CUDA device's tensors: copied to the host and back (the last resort)
_CACHE_FORMAT = 1

_chosen: dict = {}  # device index -> backend: the hot path reads only this
_warned: set = set()
_lock = threading.Lock()


def auto_backend(device: torch.device) -> str:
    """The backend ``backend="auto"`` uses for tensors on CUDA ``device``: ``"cuda"``, ``"triton"`` or ``"host"``."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    chosen = _chosen.get(index)
    if chosen is None:
        with _lock:
            chosen = _chosen.get(index)
            if chosen is None:
                chosen = _chosen[index] = _decide(index)
    return chosen


def forced_backend() -> Optional[str]:
    """``PACKKIT_BACKEND`` as a backend name (``"cpu"`` -> ``"host"``), or None when unset."""
    value = os.environ.get(FORCE_ENV, "").strip().lower()
    if not value:
        return None
    if value not in FORCED:
        raise ValueError(f"{FORCE_ENV}={os.environ[FORCE_ENV]!r}; allowed: {', '.join(FORCED)} (or unset: checked "
                         f"automatically)")
    if value == "cuda" and not _ops.has_cuda_kernels():
        raise ValueError(f"{FORCE_ENV}=cuda but packkit's CUDA kernels are not loaded ({_ops.cuda_kernels_status()})")
    return HOST if value == "cpu" else value


def _decide(index: int) -> str:
    forced = forced_backend()
    if forced is not None:
        return forced
    key = cache_key(_gpu_name(index))
    path = cache_dir() / f"backend-check-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"
    record = _read(path, key)
    if record is None:
        record = _check_under_lock(path, key, index)
    if record["failed"] and str(path) not in _warned:
        _warned.add(str(path))
        warnings.warn(fallback_message(record, path), RuntimeWarning, stacklevel=4)
    return record["chosen"]


def _check_under_lock(path: Path, key: dict, index: int) -> dict:
    """Checks (one process at a time per cache file: ranks of one job starting together wait for the first)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(str(path) + ".lock", "w")
    except OSError:  # no writable cache folder: check in this process's lifetime only
        return _check(key, index)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = _read(path, key)  # another process may have finished while this one waited
        if record is None:
            record = _check(key, index)
            _write(path, record)
    return record


def _check(key: dict, index: int) -> dict:
    results = []
    chosen = HOST
    for backend in ("cuda", "triton"):
        missing = _missing(backend)
        result = {"backend": backend, "checks": [], "skipped": missing} if missing else run_selfcheck(backend, index)
        results.append(result)
        if not missing and passed(result):
            chosen = backend
            break
    failed = [f"{r['backend']} {c['check']}: {c['result']} ({c['detail']})"
              for r in results for c in r["checks"] if c["result"] != "PASS"]
    failed += [f"{r['backend']}: not usable ({r['skipped']})" for r in results if r.get("skipped")]
    return {"format": _CACHE_FORMAT, "key": key, "chosen": chosen, "failed": failed, "results": results}


def passed(result: dict) -> bool:
    return bool(result["checks"]) and all(c["result"] == "PASS" for c in result["checks"])


def _missing(backend: str) -> Optional[str]:
    if backend == "cuda":
        return None if _ops.has_cuda_kernels() else _ops.cuda_kernels_status()
    return None if importlib.util.find_spec("triton") is not None else "triton is not installed"


def fallback_message(record: dict, path: Path) -> str:
    used = {"triton": "the compiled Triton kernels", HOST: "the CPU ops (with a copy to the host and back)"}
    first = record["failed"][0] if record["failed"] else "?"
    more = f" (and {len(record['failed']) - 1} more)" if len(record["failed"]) > 1 else ""
    return (f"packkit: backend='auto' uses {used.get(record['chosen'], record['chosen'])} on this GPU: a device path "
            f"failed its self-check on this torch build: {first}{more}. Verdict cached in {path} (delete it to check "
            f"again; `packkit info` shows every check; {FORCE_ENV}=cuda|triton|cpu forces a backend)")


# --- the cache: one JSON file per packkit build, torch build, Triton version and GPU name ----------------------
def cache_dir() -> Path:
    if os.environ.get("PACKKIT_CACHE_DIR"):
        return Path(os.environ["PACKKIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packkit"


def cache_key(gpu_name: str) -> dict:
    from .._version import __version__

    cuda_so = _ops._HERE / "_ops_cuda.so"
    try:  # a rebuild of the same version is another build: its size and time tell them apart
        st = cuda_so.stat()
        build = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        build = None
    triton = importlib.util.find_spec("triton")
    return {"packkit": __version__, "ops_cuda": build, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "torch_git": getattr(torch.version, "git_version", None),
            "triton": _dist_version("triton") if triton is not None else None, "gpu": gpu_name}


def _dist_version(name: str) -> Optional[str]:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _read(path: Path, key: dict) -> Optional[dict]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(record, dict) and record.get("format") == _CACHE_FORMAT and record.get("key") == key
          and record.get("chosen") in ("cuda", "triton", HOST) and isinstance(record.get("failed"), list))
    return record if ok else None


def _write(path: Path, record: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass  # read-only cache folder: the verdict holds for this process only


# --- the child process ----------------------------------------------------------------------------------------
def check_timeout() -> float:
    return float(os.environ.get("PACKKIT_CHECK_TIMEOUT") or CHECK_TIMEOUT_S)


def selfcheck_command(backend: str, index: Optional[int] = None, crash_control: bool = False) -> list:
    """The child's command line (tests replace it to plant a crash, a wrong result or a hang)."""
    cmd = [sys.executable, "-m", "packkit.tools.selfcheck", backend]
    if index is not None:
        cmd += ["--device", str(index)]
    return cmd + (["--crash-control"] if crash_control else [])


def run_selfcheck(backend: str, index: Optional[int] = None, crash_control: bool = False,
                  timeout: Optional[float] = None) -> dict:
    """Runs the self-check of one backend in a child process; a crash or a timeout is a result, not ours."""
    timeout = check_timeout() if timeout is None else timeout
    try:
        proc = subprocess.run(selfcheck_command(backend, index, crash_control), capture_output=True, text=True,
                              timeout=timeout)
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        returncode = None
        stdout, stderr = (x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
    checks, running = [], None
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "START":
            running = rest
        elif kind in ("PASS", "FAIL"):
            name, _, detail = rest.partition("\t")
            checks.append({"check": name, "result": kind, "detail": detail})
            running = None
    if running is not None or returncode not in (0, 1):
        if returncode is None:
            how = f"timed out after {timeout:.0f} s"
        elif returncode < 0:
            how = f"process killed by {signal.Signals(-returncode).name}"
        else:
            how = f"process exited with status {returncode}"
        checks.append({"check": running or f"{backend} checks", "result": "CRASH", "detail": how,
                       "stderr_tail": stderr.strip().splitlines()[-25:]})
    return {"backend": backend, "returncode": returncode, "checks": checks}


# --- the last resort: the CPU ops on a CUDA device's tensors ---------------------------------------------------
def on_host(op):
    """``op`` (a packkit CPU op) called with CUDA tensors: inputs copied to the host, returned tensors and the
    arguments the op writes (its ``out`` variants) copied back to the device of the first tensor argument."""
    schema = op.default._schema if hasattr(op, "default") else op._schema
    written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]

    def call(*args):
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        host = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
        result = op(*host)
        for i in written:
            if i < len(args) and args[i] is not host[i]:
                args[i].copy_(host[i])
        if isinstance(result, torch.Tensor):
            return result.to(device)
        if isinstance(result, (tuple, list)):
            return type(result)(r.to(device) if isinstance(r, torch.Tensor) else r for r in result)
        return result

    return call


def _reset_for_tests() -> None:
    _chosen.clear()
    _warned.clear()
