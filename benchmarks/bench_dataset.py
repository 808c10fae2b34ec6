"""Whole-dataset packing: packkit.pack_dataset vs trl.pack_dataset ("bfd", "bfd_split"), and on Ray Data.

Run from the repository root (needs ``datasets pyarrow trl``; ``ray[data]`` for the Ray rows)::

    python benchmarks/bench_dataset.py            # 100k and 1M sequences
    python benchmarks/bench_dataset.py --quick    # smoke run: 20k sequences, no JSON written
    python benchmarks/bench_dataset.py --no-ray   # skip the Ray Data rows

Workload (fixed seed): lengths uniform 16..1024, token ids int32 < 32000, seq_length 4096, one column
``input_ids`` in one Arrow chunk, in memory (``datasets.Dataset`` over a ``pyarrow`` table; the token
values buffer is built directly as int32, so the dataset's token bytes are ``4 * tokens``).

Every (system, size) runs in a **fresh subprocess**, so its peak RSS is its own (``VmHWM``, reset after a
warm-up on a tiny dataset):
``rss_delta`` = peak RSS minus the RSS after imports, before the dataset was built — the dataset itself
plus everything packing needed; the target is ``rss_delta <= 2 x token bytes``. Times are medians of the
repeats (the slow TRL runs fewer); each repeat drops the previous result first. The Ray row runs on a
local cluster ``ray.init(num_cpus=<cores>)`` with the input in 16 blocks; its time is pack_dataset until
every output block exists, and its RSS is the driver's only (tasks run in worker processes).
The ``*_disk`` rows start from the same table saved with ``save_to_disk`` and loaded back with
``load_from_disk`` (memory-mapped Arrow files, as ``load_dataset`` gives), with ``datasets`` caching off so
every repeat writes its output afresh to a temporary cache file: ``rss_delta`` there is peak RSS minus the
RSS after loading (nothing read yet), so it too counts the input tokens, which packing reads in full.
Results: ``benchmarks/results/dataset_cpu.json``.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SEQ_LENGTH = 4096
SYSTEMS = ("packkit", "trl_bfd", "trl_bfd_split", "packkit_ray", "packkit_disk", "trl_bfd_disk")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Linux: restart the peak-RSS (VmHWM) count from the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def build(n: int, seed: int = 0):
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 1025, n).astype(np.int64)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(3, 32000, int(lengths.sum()), dtype=np.int32)
    flat = pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])  # no copy (pa.array copies)
    column = pa.ListArray.from_arrays(pa.array(offsets), flat)
    return pa.table({"input_ids": column}), int(values.nbytes), int(lengths.sum())


def worker(system: str, n: int, repeats: int) -> dict:
    import datasets
    import packkit

    if system.startswith("trl"):
        import trl
    if system == "packkit_ray":
        import ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
    datasets.disable_progress_bars()

    disk = system.endswith("_disk")
    if disk:  # every repeat packs afresh into a temporary cache file (no cache hit on the second repeat)
        datasets.disable_caching()

    def dataset(table):
        if disk:  # saved, freed, and loaded back memory-mapped: the input is Arrow files, as from load_dataset
            tmp = tempfile.mkdtemp(prefix="bench-dataset-")
            atexit.register(shutil.rmtree, tmp, ignore_errors=True)
            path = os.path.join(tmp, "src")
            datasets.Dataset(table, fingerprint=f"bench-{table.num_rows}").save_to_disk(path)
            return datasets.load_from_disk(path)
        if system != "packkit_ray":
            return datasets.Dataset(table, fingerprint=f"bench-{table.num_rows}")  # else it hashes every token
        blocks = np.linspace(0, table.num_rows, 17).astype(int)
        return ray.data.from_arrow([table.slice(a, b - a) for a, b in zip(blocks[:-1], blocks[1:])])

    def run():
        if system in ("packkit", "packkit_disk"):
            return packkit.pack_dataset(data, SEQ_LENGTH)
        if system == "packkit_ray":
            out = packkit.pack_dataset(data, SEQ_LENGTH)
            out.count()  # every output block exists
            return out
        return trl.pack_dataset(data, SEQ_LENGTH, strategy=system[len("trl_"):].removesuffix("_disk"))

    data = dataset(build(500, seed=1)[0])
    run()  # warm-up on a tiny dataset: lazy imports and first-call setup are not the workload's memory
    del data
    gc.collect()
    if disk:  # the table is built, written and freed before the count starts: only the packing is measured
        table, token_bytes, tokens = build(n)
        data = dataset(table)
        del table
        gc.collect()
        reset_peak_rss()
        base = rss_bytes()
    else:
        reset_peak_rss()
        base = rss_bytes()
        table, token_bytes, tokens = build(n)
        data = dataset(table)
        del table
    times, out = [], None
    for _ in range(repeats):
        out = None
        gc.collect()
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    if system == "packkit_ray":
        rows = out.count()
    else:
        rows = len(out)
    peak = peak_rss_bytes()
    return {"system": system, "sequences": n, "tokens": tokens, "token_bytes": token_bytes, "rows": rows,
            "efficiency": tokens / (rows * SEQ_LENGTH), "lower_bound": -(-tokens // SEQ_LENGTH),
            "median_s": statistics.median(times), "times_s": times, "peak_rss": peak, "rss_before_data": base,
            "rss_delta": peak - base, "rss_delta_over_token_bytes": (peak - base) / token_bytes}


def repeats_for(system: str, n: int, quick: bool) -> int:
    if quick:
        return 1
    if system.startswith("trl"):
        return 3 if n <= 100_000 else 1
    return 5 if n <= 100_000 else 3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.n, args.repeats)))
        return

    sys.path.insert(0, str(Path(__file__).parent))
    from _results import machine_info, results_name, write_results

    sizes = [20_000] if args.quick else [100_000, 1_000_000]
    systems = [s for s in SYSTEMS if not (args.no_ray and s == "packkit_ray")]
    results = []
    for n in sizes:
        for system in systems:
            cmd = [sys.executable, __file__, "--worker", system, "--n", str(n),
                   "--repeats", str(repeats_for(system, n, args.quick))]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                print(f"{system} n={n} failed:\n{proc.stderr[-3000:]}")
                results.append({"system": system, "sequences": n, "error": proc.stderr[-2000:]})
                continue
            results.append(json.loads(line[len("RESULT "):]))
            r = results[-1]
            print(f"  {system:15s} n={n:>9,}  {r['median_s'] * 1e3:10.1f} ms  rows {r['rows']:>9,}  "
                  f"eff {r['efficiency']:.4%}  rss delta {r['rss_delta'] / 2**20:8.0f} MiB "
                  f"({r['rss_delta_over_token_bytes']:.2f}x token bytes)", flush=True)

    print(f"\n| sequences | system | time | TRL bfd / this | rows | efficiency | peak RSS - before data "
          f"(x token bytes) |\n|---|---|---|---|---|---|---|")
    for n in sizes:
        here = {r["system"]: r for r in results if r["sequences"] == n and "error" not in r}
        bfd = here.get("trl_bfd")
        for system in systems:
            r = here.get(system)
            if r is None:
                print(f"| {n:,} | {system} | failed | | | | |")
                continue
            ratio = f"{bfd['median_s'] / r['median_s']:.1f}x" if bfd else "-"
            print(f"| {n:,} | {system} | {r['median_s'] * 1e3:,.0f} ms | {ratio} | {r['rows']:,} | "
                  f"{r['efficiency']:.3%} | {r['rss_delta'] / 2**20:,.0f} MiB ({r['rss_delta_over_token_bytes']:.2f}x) |")
    doc = {"benchmark": "dataset", "seq_length": SEQ_LENGTH, "machine": machine_info(), "results": results}
    write_results(doc, results_name("dataset", gpu=False), args.out, args.quick)


if __name__ == "__main__":
    main()
