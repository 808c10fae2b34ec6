"""The summary of tests/gpu/run.sh: one row per step, kept in one JSON file across separate calls.

    python tests/gpu/summary.py path                       # the JSON path for this machine and day
    python tests/gpu/summary.py add STEP RESULT SECONDS [DETAIL]
    python tests/gpu/summary.py info                       # machine facts (also stored in the JSON)
    python tests/gpu/summary.py attach BENCH.json          # the benchmark's rows, into the same file
    python tests/gpu/summary.py show                       # the table; exit 1 if any step failed

The file is benchmarks/results/gpu-<device>-<date>.json (copied to $PACKKIT_GPU_OUT when set). A
step run again replaces its row, so `run.sh test` after a fix updates the same summary.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def machine() -> dict:
    import torch

    info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), compute_capability="%d.%d" % (props.major, props.minor),
                    multiprocessors=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                    device_count=torch.cuda.device_count())
    else:
        info["device"] = "cpu"
    import packkit.packing.ops

    pkg = Path(packkit.packing.ops._HERE)  # where the compiled libraries are (site-packages, also when editable)

    info["ops_cuda_built"] = (pkg / "_ops_cuda.so").exists()
    info["ops_cuda_loaded"] = bool(packkit.packing.ops.HAS_CUDA_KERNELS) and torch._C._dispatch_has_kernel_for_dispatch_key(
        "packkit::pack_batch", "CUDA")
    return info


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def path() -> Path:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return ROOT / "benchmarks" / "results" / f"gpu-{_slug(device)}-{day}.json"


def _load(p: Path) -> dict:
    if p.exists():
        return json.loads(p.read_text())
    return {"machine": machine(), "steps": []}


def _save(p: Path, data: dict) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(p)
    out = os.environ.get("PACKKIT_GPU_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, Path(out) / p.name)


def add(step: str, result: str, seconds: str, detail: str = "") -> None:
    p = path()
    data = _load(p)
    data["machine"] = machine()
    data["steps"] = [s for s in data["steps"] if s["step"] != step]
    data["steps"].append({"step": step, "result": result, "seconds": round(float(seconds), 1), "detail": detail,
                          "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
    order = ["build", "test", "sanitize", "bench", "prefix"]
    data["steps"].sort(key=lambda s: order.index(s["step"]) if s["step"] in order else len(order))
    _save(p, data)


def attach(bench_json: str) -> None:
    """Store the benchmark's rows (bench_pack_gpu.py's JSON) in the summary, under "benchmark"."""
    p = path()
    data = _load(p)
    data["benchmark"] = json.loads(Path(bench_json).read_text())
    _save(p, data)


def show() -> int:
    p = path()
    data = _load(p)
    m = data["machine"]
    print(f"\npackkit GPU run: {m.get('device')} (cc {m.get('compute_capability', '-')}), torch {m['torch']} "
          f"(CUDA {m['torch_cuda']}), triton {m['triton']}, _ops_cuda.so built={m['ops_cuda_built']} "
          f"loaded={m['ops_cuda_loaded']}")
    print(f"{'step':<10} {'result':<8} {'seconds':>8}  detail")
    for s in data["steps"]:
        print(f"{s['step']:<10} {s['result']:<8} {s['seconds']:>8.1f}  {s['detail']}")
    print(f"summary: {p.relative_to(ROOT)}")
    return int(any(s["result"] == "FAIL" for s in data["steps"]))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "path":
        print(path())
    elif cmd == "info":
        print(json.dumps(machine(), indent=2))
    elif cmd == "add":
        add(*args)
    elif cmd == "attach":
        attach(*args)
    elif cmd == "show":
        sys.exit(show())
    else:
        sys.exit(f"unknown command {cmd!r}; use path, info, add or show")
