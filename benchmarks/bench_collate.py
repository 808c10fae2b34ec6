"""Collator benchmark: packkit.PackingCollator vs transformers' and TRL's padding-free collators.

Run from the repository root::

    python benchmarks/bench_collate.py            # 256 sequences, lengths uniform 16..2048, 30 repeats
    python benchmarks/bench_collate.py --quick    # 5 repeats, no JSON unless --out

The features are what a dataset yields: ``{"input_ids": [python ints]}``, built before timing.
Systems, all producing a flat ``[1, T]`` batch with position_ids/cu_seq_lens (no padding):
  * ``packkit.PackingCollator()`` (default flat; equals the HF collator key by key), and
    ``PackingCollator(4096, layout="padded")`` (obfd rows of 4096);
  * ``transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)``;
  * ``trl``'s ``DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)``.
Throughput = tokens per second of the median call. With a GPU (``--gpu``), also host lists -> tensors
ready on the device (``torch.cuda.synchronize()`` included): PackingCollator(device="cuda") vs the HF
collator followed by ``.to("cuda")`` of every tensor.
Results go to ``benchmarks/results/collate_cpu.json`` (``collate_<gpu>.json`` with --gpu).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import packkit
from _results import machine_info, results_name, write_results


def features(n=256, seed=0):
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(3, 32000, int(k)).tolist()} for k in rng.integers(16, 2049, n)]


def median_time(fn, repeats, sync=None):
    times = []
    fn()
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
        del out
    return statistics.median(times)


def make_collator(name: str):
    if name.startswith("packkit") and "padded" in name:
        return packkit.PackingCollator(4096, layout="padded")
    if name.startswith("packkit"):
        return packkit.PackingCollator()
    if name.startswith("transformers"):
        from transformers import DataCollatorWithFlattening

        return DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)


SYSTEMS = ("packkit PackingCollator() flat", "packkit PackingCollator(4096, padded)",
           "transformers DataCollatorWithFlattening", "trl DataCollatorForLanguageModeling(padding_free)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", choices=SYSTEMS, help=argparse.SUPPRESS)  # child process: one system
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats
    feats = features()
    if args.only:
        collate = make_collator(args.only)
        print(json.dumps({"median_s": median_time(lambda: collate(feats), repeats)}))
        return
    tokens = sum(len(f["input_ids"]) for f in feats)
    print(f"{len(feats)} sequences, {tokens:,} tokens, lengths uniform 16..2048, torch threads {torch.get_num_threads()}")
    rows = []
    for name in SYSTEMS:
        # Each system runs in a fresh interpreter: importing trl/datasets starts background threads
        # that slow everything after them by ~1.5x on this 2-core machine.
        proc = subprocess.run([sys.executable, __file__, "--only", name, "--repeats", str(repeats)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{name}: skipped ({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'failed'})")
            continue
        seconds = json.loads(proc.stdout.strip().splitlines()[-1])["median_s"]
        rows.append({"system": name, "median_s": seconds, "tokens_per_s": tokens / seconds})
    hf = next((r for r in rows if r["system"].startswith("transformers")), None)
    print(f"\n{'system':<52} {'median':>10} {'Mtok/s':>8} {'vs HF':>7}")
    for r in rows:
        r["throughput_vs_hf"] = r["tokens_per_s"] / hf["tokens_per_s"] if hf else None
        vs = f"{r['throughput_vs_hf']:.1f}x" if hf else "-"
        print(f"{r['system']:<52} {r['median_s'] * 1000:8.2f}ms {r['tokens_per_s'] / 1e6:8.1f} {vs:>7}")
    print("Target: PackingCollator >= 10x the HF collator's throughput")
    doc = {"machine": machine_info(), "workload": {"sequences": len(feats), "tokens": tokens,
                                                    "lengths": "uniform 16..2048"}, "cpu": rows}
    if args.gpu and torch.cuda.is_available():
        from transformers import DataCollatorWithFlattening

        hf_collate = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
        ours = packkit.PackingCollator(device="cuda")

        def hf_to_device():
            batch = hf_collate(feats)
            return {k: v.to("cuda", non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

        gpu_rows = []
        for label, fn in (("packkit PackingCollator(device='cuda')", lambda: ours(feats)),
                          ("transformers collator + .to('cuda')", hf_to_device)):
            seconds = median_time(fn, repeats, sync=torch.cuda.synchronize)
            gpu_rows.append({"system": label, "median_s": seconds, "tokens_per_s": tokens / seconds})
            print(f"{label:<52} {seconds * 1000:8.2f}ms (host lists -> device tensors)")
        doc["gpu"] = {"device": torch.cuda.get_device_name(), "rows": gpu_rows}
    write_results(doc, results_name("collate", args.gpu), args.out, args.quick)

if __name__ == "__main__":
    main()
