"""Attention microbenchmark: one packed row, forward + backward, ``packkit_varlen`` on the CPU (per-document
attention) vs the same row through SDPA with a block mask (what a ``PackingCollator`` batch gets today on the CPU:
transformers builds the packed row's block-diagonal causal mask from ``position_ids`` and SDPA computes the whole
``L x L`` square).

Run from the repository root::

    python benchmarks/bench_attention.py             # 2,048-token rows, 4 heads x 64 (hidden 256), fp32, 9 repeats
    python benchmarks/bench_attention.py --quick     # 3 repeats, no JSON unless --out

Rows (each 2,048 tokens): 8 documents of lognormal lengths (median 288, issue 42's profile), 8 of 256, 2 of
1,536 + 512, 32 of 64, and one document of 2,048 (nothing to save: the control). Systems, called as transformers
calls an attention function (query/key/value ``[1, H, L, D]``, leaves with gradients):

* ``varlen``: ``packkit.training.hf_attention.varlen_attention_forward`` with the row's ``cu_seq_lens_q``;
* ``sdpa_block_mask``: ``F.scaled_dot_product_attention`` with the row's ``[1, 1, L, L]`` bool document-causal mask;
* ``sdpa_causal``: SDPA ``is_causal=True`` over the row as one document (wrong for packing; the square's floor).

Each repeat runs the systems in turn (interleaved, so machine load hits all alike); times are medians, speedups
ratios of medians, next to ``sum(l ** 2) / L ** 2`` (the share of the square the documents cover). The outputs and
gradients of ``varlen`` and ``sdpa_block_mask`` are checked equal (fp32 rounding) before timing. Results go to
``benchmarks/results/attention_cpu.json``; the machine's load average is recorded (a shared machine's timings, at
more than one thread especially, move with it).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _results import machine_info, write_results


def lognormal_row(n=8, total=2048, median=288, sigma=0.7, seed=0) -> list:
    """``n`` lognormal document lengths (median ``median``) scaled to fill ``total`` tokens exactly."""
    raw = np.random.default_rng(seed).lognormal(np.log(median), sigma, n)
    lengths = np.maximum(1, np.round(raw / raw.sum() * total)).astype(int)
    lengths[np.argmax(lengths)] += total - lengths.sum()
    return sorted(lengths.tolist(), reverse=True)


ROWS = {
    "8 docs, lognormal": lognormal_row(),
    "8 docs of 256": [256] * 8,
    "2 docs, 1536 + 512": [1536, 512],
    "32 docs of 64": [64] * 32,
    "1 doc of 2048": [2048],
}


class _Layer(torch.nn.Module):  # what the attention function reads from its module
    is_causal = True


def systems(lengths, heads, dim, dtype):
    from packkit.training.hf_attention import varlen_attention_forward

    total = sum(lengths)
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    i = torch.arange(total)
    mask = ((doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None]))[None, None]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, total, dim, generator=g).to(dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(1, total, heads, dim, generator=g).to(dtype)
    layer = _Layer()

    def varlen():
        return varlen_attention_forward(layer, q, k, v, None, cu_seq_lens_q=cu, max_length_q=max(lengths))[0]

    def sdpa_block_mask():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)

    def sdpa_causal():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)

    return {"varlen": varlen, "sdpa_block_mask": sdpa_block_mask, "sdpa_causal": sdpa_causal}, (q, k, v), grad


def check_equal(fns, leaves, grad, tol):
    """varlen and SDPA with the block mask: the same outputs and gradients (relative to their largest entry)."""
    results = []
    for name in ("varlen", "sdpa_block_mask"):
        out = fns[name]()
        results.append([out.detach()] + list(torch.autograd.grad(out, leaves, grad)))
    err = max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(*results))
    if err > tol:
        raise AssertionError(f"varlen differs from SDPA with the block mask: rel {err:.2e} > {tol}")
    return err


def measure(lengths, heads, dim, dtype, repeats):
    fns, leaves, grad = systems(lengths, heads, dim, dtype)
    err = check_equal(fns, leaves, grad, 1e-4 if dtype == torch.float32 else 5e-2)
    both = {n: [] for n in fns}
    fwd = {n: [] for n in fns}
    for _ in range(repeats + 1):  # the first round warms up
        for name, fn in fns.items():
            start = time.perf_counter()
            with torch.no_grad():
                fn()
            mid = time.perf_counter()
            out = fn()
            torch.autograd.grad(out, leaves, grad)
            end = time.perf_counter()
            fwd[name].append(mid - start)
            both[name].append(end - mid)
    med = {n: statistics.median(t[1:]) for n, t in both.items()}
    med_fwd = {n: statistics.median(t[1:]) for n, t in fwd.items()}
    total = sum(lengths)
    return {"lengths": lengths, "docs": len(lengths), "covered": sum(x * x for x in lengths) / total ** 2,
            "fwd_bwd_ms": {n: 1e3 * t for n, t in med.items()}, "fwd_ms": {n: 1e3 * t for n, t in med_fwd.items()},
            "speedup_vs_block_mask": med["sdpa_block_mask"] / med["varlen"],
            "speedup_vs_causal": med["sdpa_causal"] / med["varlen"],
            "fwd_speedup_vs_block_mask": med_fwd["sdpa_block_mask"] / med_fwd["varlen"],
            "max_rel_diff_vs_block_mask": err}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts, each measured")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 9)
    dtype = getattr(torch, args.dtype)
    load_before = os.getloadavg()
    results = []
    header = (f"{'threads':>7} {'row':<22} {'docs':>4} {'sum l2/L2':>9} {'varlen ms':>10} {'block-mask ms':>13} "
              f"{'causal ms':>10} {'vs mask':>8} {'vs causal':>9} {'fwd vs mask':>11}")
    print(f"one row of 2,048 tokens, {args.heads} heads x {args.head_dim}, {args.dtype}, forward + backward, "
          f"medians of {repeats}")
    print(header)
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name, lengths in ROWS.items():
            r = {"threads": threads, "row": name, **measure(lengths, args.heads, args.head_dim, dtype, repeats)}
            results.append(r)
            ms = r["fwd_bwd_ms"]
            print(f"{threads:>7} {name:<22} {r['docs']:>4} {r['covered']:>9.3f} {ms['varlen']:>10.1f} "
                  f"{ms['sdpa_block_mask']:>13.1f} {ms['sdpa_causal']:>10.1f} {r['speedup_vs_block_mask']:>7.2f}x "
                  f"{r['speedup_vs_causal']:>8.2f}x {r['fwd_speedup_vs_block_mask']:>10.2f}x", flush=True)
    doc = {"benchmark": "attention", "machine": machine_info(load_average_before=load_before,
                                                             load_average_after=os.getloadavg()),
           "config": {"heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype, "repeats": repeats,
                      "row_tokens": 2048},
           "results": results}
    write_results(doc, "attention_cpu.json", args.out, args.quick)


if __name__ == "__main__":
    main()
