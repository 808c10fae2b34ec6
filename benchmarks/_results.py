"""What every benchmark script records: the machine it ran on, where its JSON goes, and (GPU scripts) how many
host syncs a call makes."""
from __future__ import annotations

import datetime
import json
import os
import platform
import gc
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch


def timed(fn, repeats: int):
    """(median seconds, every repeat's seconds, the last call's result) of ``fn()``, ``gc.collect()`` before each
    repeat; the one timing loop of bench_pack and bench_plan."""
    times, result = [], None
    for _ in range(repeats):
        result = None
        gc.collect()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, result


def count_sync_warnings(fn) -> int:
    """Synchronising CUDA calls made by ``fn()`` (torch's sync debug mode 'warn', restored after); one
    counter for bench_pack_gpu and bench_rl."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(w.message) for w in caught)


def machine_info(**extra) -> dict:
    info = {"processor": platform.processor(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0], "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "date": datetime.date.today().isoformat()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return {**info, **extra}


def results_name(prefix: str, gpu: bool) -> str:
    """``<prefix>_cpu.json``, or ``<prefix>_<gpu name>.json`` for a run with a GPU section."""
    if gpu and torch.cuda.is_available():
        return f"{prefix}_" + torch.cuda.get_device_name().replace(" ", "_").lower() + ".json"
    return f"{prefix}_cpu.json"


def device_slug(gpu: bool = True) -> str:
    """File-name-safe name of the device a run measured: ``nvidia-h100-80gb-hbm3``, or ``cpu``."""
    if gpu and torch.cuda.is_available():
        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
    return "cpu"


def write_results(doc: dict, name: str, out: Path | None, quick: bool) -> None:
    """Write to ``out`` or ``benchmarks/results/<name>``; quick (smoke) runs write only with an explicit out."""
    if quick and not out:
        return
    path = out or Path(__file__).parent / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}")
