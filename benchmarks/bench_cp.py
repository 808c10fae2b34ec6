"""Context-parallel sharding benchmark (issue 25): packkit.shard_context_parallel vs a Python-loop splitter.

Run from the repository root::

    python benchmarks/bench_cp.py            # CPU (and the GPU section when a GPU is present)
    python benchmarks/bench_cp.py --quick    # smoke run: fewer rows and repeats, writes nothing

Workload: seed 001's length profile (``packkit.tools.demo.demo_lengths``: 99,388 lengths, median 864),
clipped to and planned into rows of 32,768 tokens with ``pad_to_multiple_of=2*cp``; each batch is one row packed flat
(``pack_sequences``), then rank 0's zigzag shard is taken at cp 2, 4, 8, 16.

* packkit: ``shard_context_parallel(batch, cp, 0, "zigzag", lengths=host segment lengths)`` (the host
  lengths a loader has from its plan; one ``packkit::cp_shard`` call).
* fused (``packkit.pack_context_parallel``): the rank's shard straight from the unpacked flat tokens +
  lengths (one ``packkit::cp_shard`` launch in its ``seg_src`` mode; no packed row is built), timed against
  the loader pass it replaces, ``pack_sequences`` + ``shard_context_parallel`` from the same flat tokens
  (pack-then-shard: the pack op's launches plus one cp_shard launch). Both outputs are checked equal.
* loop: a faithful ColossalAI ``split_varlen_zigzag``-style splitter: walk ``cu_seqlens`` reading each
  boundary with ``.item()``, pad each document to a multiple of 2*cp, shift its labels, continue its
  positions, ``chunk(2*cp)`` and keep chunks r and 2*cp-1-r; concatenate.

Reported per batch: median microseconds, torch ops dispatched (each a kernel launch on a GPU) and host
syncs (``aten._local_scalar_dense``, i.e. ``.item()``), counted with a TorchDispatchMode. Both outputs are
checked equal. Also reported: the extra tokens CP padding costs at cp 2-16 (whole dataset, and rows planned
to capacity without ``pad_to_multiple_of`` that overflow once padded), and the per-rank causal-attention
work (sum over tokens of position-in-document + 1) of zigzag vs contiguous shards, max/mean per row.
Results go to ``benchmarks/results/cp_cpu.json``.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_info, results_name, write_results  # noqa: E402

import packkit  # noqa: E402
from packkit.context_parallel import cp_padded_lengths  # noqa: E402
from packkit.tools.demo import demo_lengths  # noqa: E402

CAPACITY = 32768
CP_SIZES = (2, 4, 8, 16)


def loop_split_zigzag(batch, cp, rank, pad_id=0, ignore_index=-100):
    """ColossalAI-style zigzag split over cu_seqlens with per-boundary .item() (labels shifted per document)."""
    cu = batch["cu_seq_lens_q"]
    ids, lab, pos = batch["input_ids"][0], batch["labels"][0], batch["position_ids"][0]
    out_ids, out_lab, out_pos, local_cu = [], [], [], [0]
    m = 2 * cp
    for i in range(len(cu) - 1):
        start, end = cu[i].item(), cu[i + 1].item()
        n = end - start
        pad = (-n) % m
        s_ids = F.pad(ids[start:end], (0, pad), value=pad_id)
        s_lab = F.pad(lab[start + 1:end], (0, pad + 1), value=ignore_index)
        s_pos = torch.cat([pos[start:end], pos[end - 1] + 1 + torch.arange(pad, device=pos.device)])
        for t, out in ((s_ids, out_ids), (s_lab, out_lab), (s_pos, out_pos)):
            chunks = t.chunk(m)
            out.append(torch.cat([chunks[rank], chunks[m - 1 - rank]]))
        local_cu.append(local_cu[-1] + (n + pad) // cp)
    return {"input_ids": torch.cat(out_ids)[None], "shift_labels": torch.cat(out_lab)[None],
            "position_ids": torch.cat(out_pos)[None],
            "cu_seq_lens_q": torch.tensor(local_cu, dtype=torch.int32, device=ids.device)}


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.packkit_ops = 0  # packkit kernels (each one launch on a GPU)
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.packkit_ops += func.namespace == "packkit"
        if func is torch.ops.aten._local_scalar_dense.default:
            self.syncs += 1
        return func(*args, **(kwargs or {}))


def median_us(fn, repeats):
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def padding_cost(lengths):
    total = int(lengths.sum())
    rows = {}
    for cp in CP_SIZES:
        zig = int(cp_padded_lengths(lengths, cp).sum()) - total
        plain = packkit.plan(lengths, CAPACITY)
        padded_rows = np.array([int(cp_padded_lengths(lengths[b], cp).sum()) for b in plain.bins])
        aware = packkit.plan(lengths, CAPACITY, pad_to_multiple_of=2 * cp)
        rows[cp] = {"zigzag_extra_tokens": zig, "zigzag_extra_pct": 100 * zig / total,
                    "plain_plan_rows": plain.num_bins, "plain_rows_overflowing_after_padding": int((padded_rows > CAPACITY).sum()),
                    "plain_worst_row_after_padding": int(padded_rows.max()),
                    "pad_aware_plan_rows": aware.num_bins, "pad_aware_efficiency_real_tokens": aware.efficiency,
                    "contiguous_extra_tokens_per_row_max": cp - 1}
    return rows


def load_balance(lengths, num_rows):
    out = {}
    rng = np.random.default_rng(0)
    for cp in CP_SIZES:
        p = packkit.plan(lengths, CAPACITY, pad_to_multiple_of=2 * cp)
        picks = rng.choice(p.num_bins, size=min(num_rows, p.num_bins), replace=False)
        res = {}
        for mode in ("zigzag", "contiguous"):
            ratios = []
            for b in picks:
                rows = p.bins[b]
                batch = packkit.pack_sequences([np.zeros(int(lengths[i]), np.int64) for i in rows])
                seg = np.diff(batch["cu_seq_lens_q"].numpy())
                work = [float((packkit.shard_context_parallel(batch, cp, r, mode, lengths=seg)["position_ids"] + 1)
                              .double().sum()) for r in range(cp)]
                ratios.append(max(work) / (sum(work) / cp))
            res[mode] = {"mean_max_over_mean": float(np.mean(ratios)), "worst_row_max_over_mean": float(np.max(ratios))}
        out[cp] = res
    return out


def timing(lengths, num_rows, repeats, device):
    out = {}
    for cp in CP_SIZES:
        p = packkit.plan(lengths, CAPACITY, pad_to_multiple_of=2 * cp)
        rng = np.random.default_rng(1)
        picks = rng.choice(p.num_bins, size=min(num_rows, p.num_bins), replace=False)
        ours, loop, counts, fused, two_pass, fcounts = [], [], [], [], [], []
        for b in picks:
            rows = p.bins[b]
            seqs = [torch.from_numpy(rng.integers(1, 32000, int(lengths[i]))) for i in rows]
            batch = packkit.pack_sequences(seqs, device=device)
            seg = np.array([int(lengths[i]) for i in rows])
            mine = lambda: packkit.shard_context_parallel(batch, cp, 0, "zigzag", lengths=seg)  # noqa: E731
            theirs = lambda: loop_split_zigzag(batch, cp, 0)  # noqa: E731
            a, r = mine(), theirs()
            for k in ("input_ids", "shift_labels", "position_ids", "cu_seq_lens_q"):
                assert torch.equal(a[k], r[k]), k
            with OpCounter() as c1:
                mine()
            with OpCounter() as c2:
                theirs()
            counts.append((c1.ops, c1.syncs, c2.ops, c2.syncs, len(rows)))
            ours.append(median_us(mine, repeats))
            loop.append(median_us(theirs, max(1, repeats // 3)))
            # The loader pass from the unpacked flat tokens: fused vs pack-then-shard.
            flat = torch.cat(seqs)
            one = lambda: packkit.pack_context_parallel(flat, cp, 0, "zigzag", lengths=seg, device=device)  # noqa: E731
            two = lambda: packkit.shard_context_parallel(packkit.pack_sequences(flat, seg, device=device), cp, 0,  # noqa: E731
                                                         "zigzag", lengths=seg)
            f, t = one(), two()
            assert f.keys() == t.keys() and all(torch.equal(f[k], t[k]) for k in f if isinstance(f[k], torch.Tensor))
            with OpCounter() as c3:
                one()
            with OpCounter() as c4:
                two()
            fcounts.append((c3.ops, c3.packkit_ops, c3.syncs, c4.ops, c4.packkit_ops, c4.syncs))
            fused.append(median_us(one, repeats))
            two_pass.append(median_us(two, repeats))
        c = np.array(counts)
        fc = np.array(fcounts)
        out[cp] = {"docs_per_row_mean": float(c[:, 4].mean()), "packkit_us": float(np.median(ours)),
                   "loop_us": float(np.median(loop)), "speedup": float(np.median(loop) / np.median(ours)),
                   "packkit_ops": float(c[:, 0].mean()), "packkit_syncs": float(c[:, 1].mean()),
                   "loop_ops": float(c[:, 2].mean()), "loop_syncs": float(c[:, 3].mean()),
                   "fused_us": float(np.median(fused)), "pack_then_shard_us": float(np.median(two_pass)),
                   "fused_speedup": float(np.median(two_pass) / np.median(fused)),
                   "fused_ops": float(fc[:, 0].mean()), "fused_packkit_launches": float(fc[:, 1].mean()),
                   "fused_syncs": float(fc[:, 2].mean()), "pack_then_shard_ops": float(fc[:, 3].mean()),
                   "pack_then_shard_packkit_launches": float(fc[:, 4].mean()),
                   "pack_then_shard_syncs": float(fc[:, 5].mean())}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lengths = np.minimum(demo_lengths(), CAPACITY)  # the profile has a few documents over 32,768 tokens
    if args.quick:
        lengths = lengths[:5000]
    doc = {"machine": machine_info(), "capacity": CAPACITY, "samples": int(len(lengths)),
           "tokens": int(lengths.sum())}
    doc["padding_cost"] = padding_cost(lengths)
    doc["load_balance"] = load_balance(lengths, 4 if args.quick else 40)
    doc["cpu"] = timing(lengths, 2 if args.quick else 8, 3 if args.quick else 15, "cpu")
    if torch.cuda.is_available():
        doc["gpu"] = timing(lengths, 2 if args.quick else 8, 3 if args.quick else 30, "cuda")
    for section in ("padding_cost", "load_balance", "cpu", "gpu"):
        if section in doc:
            print(section)
            for cp, row in doc[section].items():
                print(f"  cp {cp}: {row}")
    write_results(doc, results_name("cp", gpu=True), args.out, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
