"""Planning from lengths on the device (issue 62 part 5): ``pack_on_device(plan="device")`` against the host plan.

Run from the repository root::

    python benchmarks/bench_device_plan.py [--quick] [--out PATH.json]   # on a CUDA GPU (the GPU session's bench step)
    python benchmarks/bench_device_plan.py --cpu [--quick]               # CPU tensors: the harness (figures say nothing
                                                                         # about a GPU)

Workload: RL rollout lengths (``bench_rl.rollout_lengths``: prompt 100..1000 + lognormal response), token ids on the
device, a fixed batch of ``num_rows`` rows of ``capacity`` tokens with ``max_sequences`` slots (obfd's rows + 25%).
Rows per case: ``device`` (lengths stay on the device: plan + pack, torch ops) and ``host`` (the default: one
device-to-host copy of the lengths, obfd on the host, the CUDA/Triton pack op). Columns: median wall ms per call
(device synchronised around each), host_syncs per call (``torch.cuda.set_sync_debug_mode("warn")``; None on CPU),
rows the device plan used / obfd's (same slot rule), and whether the device batch equals, bit for bit, the host
path's batch of the same rows.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import packkit  # noqa: E402
from _results import count_sync_warnings, machine_info  # noqa: E402
from bench_rl import rollout_lengths  # noqa: E402
from packkit.packing.device_pack import host_plan  # noqa: E402


def wall_ms(fn, device, reps):
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def case(n, cap, slots, device, reps):
    lengths = rollout_lengths(n, cap)
    obfd = packkit.plan(lengths, cap, max_sequences=slots - 1).num_bins
    rows = obfd + max(obfd // 4, 1)
    lens = torch.from_numpy(lengths).to(device)
    ids = torch.randint(1, 32000, (int(lengths.sum()),), device=device)
    opts = dict(num_rows=rows, max_sequences=slots)
    runs = {"device": lambda: packkit.pack_on_device(ids, lens, cap, plan="device", **opts),
            "host": lambda: packkit.pack_on_device(ids, lens, cap, **opts)}
    batch, info = runs["device"]()
    used = int(info.rows_used)
    want = packkit.pack_sequences(ids, lengths, plan=host_plan(info, lengths), layout="padded", row_len=cap, **opts)
    equal = all(torch.equal(batch[k], v) for k, v in want.items() if isinstance(v, torch.Tensor))
    out = []
    for name, fn in runs.items():
        fn()
        syncs = count_sync_warnings(fn) if device.type == "cuda" else None
        out.append({"case": f"rl{n}@{cap}xN{slots}", "path": name, "documents": n, "num_rows": rows,
                    "ms": round(wall_ms(fn, device, reps), 3), "host_syncs": syncs,
                    "rows_used": used if name == "device" else obfd, "obfd_rows": obfd,
                    "rows_ratio": round(used / obfd, 4), "unplaced": int(info.unplaced), "bit_equal": equal})
        print(json.dumps(out[-1]), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="CPU tensors (the harness)")
    ap.add_argument("--quick", action="store_true", help="one size, few repeats (the GPU session)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    sizes = [(256, 16384, 32)] if device.type == "cpu" else [(1024, 16384, 64)]
    if not args.quick and device.type == "cuda":
        sizes += [(4096, 32768, 64)]
    rows = [r for n, cap, slots in sizes for r in case(n, cap, slots, device, 3 if args.quick else 10)]
    doc = {"machine": machine_info(device=str(device)), "rows": rows,
           "failures": [r for r in rows if not r["bit_equal"] or r["unplaced"] or r["rows_ratio"] > 1.05
                        or (r["path"] == "device" and r["host_syncs"])]}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
