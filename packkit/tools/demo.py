"""``packkit demo``: plans a built-in length profile with every algorithm and prints one table.

The profile is a lognormal fitted to the published length profile of a Qwen3-VL SFT dataset (99,388 LVIS
image + text samples: median 864, mean ~1334, p99 ~7900 tokens, text + image tokens), packed into rows of 20,000.
That dataset's own packer reached 92.73% efficiency (7,091 rows, 101 samples over 20,000 dropped): the bar.

One padding baseline, here and in the report: no packing, every sample kept (truncated to the row length),
shuffled, micro-batches of ``PADDED_MICRO_BATCH`` padded to their longest sample (dynamic padding, as
transformers' ``DataCollatorWithPadding``).
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..planning.planner import ALGORITHMS, plan

PROFILE = {"samples": 99_388, "median": 864, "sigma": 0.932, "seed": 1, "capacity": 20_000}
DATASET = "a Qwen3-VL SFT dataset's published length profile (99,388 LVIS image + text samples)"
BAR = "that dataset's own packer: 92.73% efficiency, 7,091 rows, 101 samples dropped"
PADDED_MICRO_BATCH = 8


def demo_lengths(samples: int = PROFILE["samples"], seed: int = PROFILE["seed"]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.normal(np.log(PROFILE["median"]), PROFILE["sigma"], samples))
    return np.maximum(np.round(lengths), 1).astype(np.int64)


def pack_backend() -> tuple[str, str]:
    """(device, description) of the fastest pack backend present: CUDA kernels, else Triton, else CPU."""
    import torch

    from ..packing import ops

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        if ops.HAS_CUDA_KERNELS:
            return "cuda", f"CUDA kernels on {name}"
        return "cuda", f"Triton kernels on {name} (packkit built without its CUDA kernels)"
    return "cpu", f"C++ CPU kernels ({os.cpu_count()} CPU threads; no GPU here)"


def pack_throughput(lengths: np.ndarray, capacity: int, algorithm: str, dp_size: int, device: str,
                    repeats: int = 3) -> float:
    """Tokens/s of plan + pack (input_ids, labels, position_ids, seq_idx, cu_seqlens) of real token tensors."""
    import torch

    from ..packing.sequences import pack_sequences

    tokens = torch.from_numpy(np.random.default_rng(7).integers(3, 32_000, int(lengths.sum())))
    tokens = tokens.to(device)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        p = plan(lengths, capacity, algorithm=algorithm, overlong="drop", dp_size=dp_size, cost="attention")
        batch = pack_sequences(tokens, lengths, plan=p, layout="padded", row_len=capacity)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        kept = p.kept_tokens
        del batch
    return kept / sorted(times)[len(times) // 2]


def run(capacity: int = PROFILE["capacity"], dp_size: int = 8, out: str | None = "packkit-demo-report",
        sample: int = 4096, figures: bool = True) -> list[dict]:
    from ..analyze.simulate import padding_baseline

    lengths = demo_lengths()
    tokens = int(lengths.sum())
    longest = int(lengths.max())
    device, backend = pack_backend()
    print(f"packkit demo: {len(lengths):,} sequences drawn from {DATASET}")
    print(f"  {tokens:,} tokens (median {int(np.median(lengths))}, mean {lengths.mean():.0f}, max {longest:,}); "
          f"rows of {capacity:,} tokens; sequences longer than a row are dropped")
    print(f"  pack backend: {backend}; real token tensors of the first {sample:,} sequences packed")
    (pad,) = padding_baseline(lengths, [capacity], PADDED_MICRO_BATCH)
    pad_tokens = pad["token_slots"] - pad["tokens"]
    rows = []
    for algorithm in ALGORITHMS:
        dp = dp_size if algorithm == "ogbfd" else 1
        start = time.perf_counter()
        p = plan(lengths, capacity, algorithm=algorithm, overlong="drop", dp_size=dp, cost="attention")
        seconds = time.perf_counter() - start
        waste = p.num_bins * capacity - p.kept_tokens
        rows.append({**p.summary(), "plan_seconds": seconds, "padding_waste": 1 - p.efficiency,
                     "waste_tokens": waste, "waste_vs_padding_baseline": waste / pad_tokens,
                     "pack_tokens_per_s": pack_throughput(lengths[:sample], capacity, algorithm, dp, device)})
    nf_waste = rows[0]["waste_tokens"]
    header = (f"{'algorithm':<9} {'rows':>7} {'bound':>7} {'efficiency':>10} {'padding':>9} {'padding':>9} "
              f"{'padding':>8} {'plan':>7} {'plan+pack':>9}  {'dp balance':<10}")
    units = (f"{'':<9} {'':>7} {'(rows)':>7} {'(%)':>10} {'(M tok)':>9} {'(% of bl)':>9} "
             f"{'(x nf)':>8} {'(ms)':>7} {'(Mtok/s)':>9}  {'(max/mean)':<10}")
    print()
    print(header)
    print(units)
    print("-" * len(header))
    for r in rows:
        r["waste_vs_nf"] = r["waste_tokens"] / nf_waste if nf_waste else 0.0
        balance = f"{r['balance']:.4f} over {r['dp_size']} ranks" if r["dp_size"] > 1 else ""
        print(f"{r['algorithm']:<9} {r['bins']:>7,} {r['lower_bound']:>7,} {r['efficiency'] * 100:>10.3f} "
              f"{r['waste_tokens'] / 1e6:>9.3f} {r['waste_vs_padding_baseline'] * 100:>9.2f} "
              f"{r['waste_vs_nf']:>8.3f} {r['plan_seconds'] * 1e3:>7.1f} {r['pack_tokens_per_s'] / 1e6:>9.0f}  "
              f"{balance}")
    print(f"""
efficiency: real tokens / row tokens. padding: the rows' padding tokens, in millions, as a share of the
  padding baseline's, and as a multiple of next fit's (nf: rows filled in data order).
padding baseline (bl): no packing; micro-batches of {PADDED_MICRO_BATCH} samples, each padded to its longest sample
  (dynamic padding): {pad['efficiency']:.2%} efficiency, {pad_tokens / 1e6:,.1f} M padding tokens.
dp balance: ogbfd's rows grouped into steps of {dp_size} ranks; the slowest rank's attention cost / the mean.
{rows[0]['dropped']} samples over {capacity:,} tokens dropped. The bar: {BAR}.""")
    if out:
        try:
            from ..analyze.api import analyze_lengths

            result = analyze_lengths(lengths, out, max_lengths=["auto", capacity], algorithms=list(ALGORITHMS[:1])
                                     + ["obfd"], dp_size=1, figures=figures, progress=False,
                                     padded_micro_batch_size=PADDED_MICRO_BATCH, command="packkit demo")
            print(f"analyze report: {result.out_dir}/report.md ({len(result.files)} files)")
        except ImportError as exc:  # matplotlib etc. missing: the table above still stands
            print(f"analyze report skipped: {exc}")
    print(f"backend that packed: {backend}")
    return rows
