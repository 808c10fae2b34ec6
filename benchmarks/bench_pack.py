"""Plan + pack benchmark: packkit vs fast_axolotl, transformers' collator and a vectorised PyTorch reference.

Run from the repository root::

    python benchmarks/bench_pack.py                 # CPU, 100k sequences (51.9M tokens), 5 repeats
    python benchmarks/bench_pack.py --quick         # smoke run: 10k sequences, 2 repeats
    python benchmarks/bench_pack.py --gpu           # also the CUDA/Triton section (needs a GPU)
    python benchmarks/bench_pack.py --dtypes-only   # just the per-dtype rows (below)

CPU workload (fixed seed): 100k sequences, lengths uniform 16..1024, token ids < 32000, capacity 4096.
Every system gets its input in its natural form, built before timing:
  * packkit: one flat int64 tensor + lengths -> ``pack_sequences(..., capacity=4096, layout=...)``, i.e.
    plan (obfd) + input_ids, labels, position_ids, seq_idx and cu_seqlens.
  * PyTorch reference (vectorised): the same obfd plan, then gather indices built with
    ``repeat_interleave``/``cumsum`` and ``index_select`` for ids and labels, plus position_ids and
    cu_seqlens — the best plain-PyTorch way we know.
  * ``fast_axolotl.pack_sequences`` from lists (its own next-fit; rows of seq+[eos, pad]; no
    position_ids / cu_seqlens), call alone.
  * ``transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)`` on
    the same sequences as features (one flat row, no padding), call alone.
  * fresh vs reused outputs (issue 17), each pair timed alternately: ``pack_sequences`` vs
    ``pack_sequences(..., out=PackBuffers())``, the ``pack_batch`` op vs ``pack_batch_out`` into reused
    outputs (plan excluded), and ``torch.Tensor.copy_`` of the same output bytes into fresh vs warm
    memory; the fresh/reused ratios of medians and the load average are printed and stored under
    ``fresh_over_reused``.
  * per dtype (issue 22): ``torch.ops.packkit.pack`` of int32 and int64 tokens and of bf16 and fp32
    features ([tokens, 8], from the first 25k sequences: the same bytes as the token rows), each as a
    fraction of a plain ``copy_`` of the same bytes (copy time / pack time; every source a torch allocation,
    plus int64 straight from the numpy-backed workload tensor, whose memory numpy advises onto huge pages),
    timed alternately: into
    reused outputs (``pack_out`` vs ``copy_`` into a warm tensor: the kernel against memory bandwidth)
    and into fresh ones (``pack`` vs ``torch.empty_like(..).copy_``: page faults included); plus the first
    and second ``pack`` of each dtype in a fresh process (the first pays for memory the process never
    touched before).
Times are medians of the repeats (``gc.collect()`` before each); slow peers run fewer repeats.
GPU section: device-to-device copy bandwidth vs pack_batch (bytes that must move: ids + labels read
once, ids + labels + position_ids + seq_idx written once) at 1M/16M/64M tokens, CUDA vs Triton,
timed with CUDA events. Results go to ``benchmarks/results/pack_cpu.json`` (or ``pack_<gpu>.json``).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import packkit
from _results import machine_info, results_name, timed, write_results

CAPACITY = 4096


def make_workload(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 1025, n).astype(np.int64)
    flat = torch.from_numpy(rng.integers(3, 32000, int(lengths.sum())).astype(np.int64))
    return lengths, flat


def torch_reference(flat: torch.Tensor, lengths: np.ndarray, capacity: int):
    """Vectorised plain-PyTorch pack into [rows, capacity] from a packkit obfd plan."""
    plan = packkit.plan(lengths, capacity)
    seg = plan.segments
    seq = torch.from_numpy(seg.seq_index.copy())
    seg_len = torch.from_numpy(seg.length.copy())
    offsets = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))))
    src_start = offsets[seq] + torch.from_numpy(seg.start.copy())
    # Destination of each segment: row * capacity + prefix of earlier segments in the row.
    bin_of_seg = torch.repeat_interleave(torch.arange(plan.num_bins), torch.from_numpy(np.diff(seg.bin_offsets)))
    excl = torch.cumsum(seg_len, 0) - seg_len
    row_first = torch.from_numpy(seg.bin_offsets[:-1].copy())
    dst_start = bin_of_seg * capacity + (excl - excl[row_first][bin_of_seg])
    total_kept = int(seg_len.sum())
    within = torch.arange(total_kept) - torch.repeat_interleave(excl, seg_len)
    src_idx = torch.repeat_interleave(src_start, seg_len) + within
    dst_idx = torch.repeat_interleave(dst_start, seg_len) + within
    size = plan.num_bins * capacity
    ids = torch.zeros(size, dtype=flat.dtype)
    ids[dst_idx] = flat[src_idx]
    labels = torch.full((size,), -100, dtype=flat.dtype)
    labels[dst_idx] = flat[src_idx]
    labels[dst_start] = -100
    positions = torch.zeros(size, dtype=torch.int64)
    positions[dst_idx] = within
    cu = torch.cat((torch.zeros(1, dtype=torch.int32), torch.cumsum(seg_len, 0).to(torch.int32)))  # flat-style
    return ids.view(-1, capacity), labels.view(-1, capacity), positions.view(-1, capacity), cu


def efficiency(tokens: int, rows: int, capacity: int) -> float:
    return tokens / (rows * capacity) if rows else 1.0


def cpu_section(n: int, repeats: int, slow_repeats: int) -> list[dict]:
    lengths, flat = make_workload(n)
    tokens = int(lengths.sum())
    print(f"CPU workload: {n:,} sequences, {tokens:,} tokens, capacity {CAPACITY}, torch threads "
          f"{torch.get_num_threads()}")
    rows = []

    def add(system, fn, reps, rows_of, note=""):
        median, times, out = timed(fn, reps)
        r = rows_of(out)
        rows.append({"system": system, "median_s": median, "times_s": times, "rows": r,
                     "efficiency": efficiency(tokens, r, CAPACITY) if r else None, "note": note})
        print(f"  {system:<52} {median * 1000:10.1f} ms  rows {r}")
        del out
        return median

    add("packkit pack_sequences padded (plan+pack)",
        lambda: packkit.pack_sequences(flat, lengths, capacity=CAPACITY, layout="padded"), repeats,
        lambda b: b["input_ids"].shape[0])
    add("packkit pack_sequences flat (plan+pack)",
        lambda: packkit.pack_sequences(flat, lengths, capacity=CAPACITY, layout="flat"), repeats,
        lambda b: -(-b["input_ids"].shape[1] // CAPACITY), "one [1, T] row of obfd bins")
    add("pytorch reference, vectorised (plan+pack)", lambda: torch_reference(flat, lengths, CAPACITY), repeats,
        lambda out: out[0].shape[0])

    def record(system, times, note):
        rows.append({"system": system, "median_s": statistics.median(times), "times_s": times, "rows": None,
                     "efficiency": None, "note": note})
        print(f"  {system:<52} {statistics.median(times) * 1000:10.1f} ms")

    reuse_rows(record, flat, lengths, repeats)
    try:
        import fast_axolotl

        seqs = [s.tolist() for s in torch.split(flat, lengths.tolist())]
        add("fast_axolotl.pack_sequences (lists)",
            lambda: fast_axolotl.pack_sequences(seqs, CAPACITY, 0, 2, -100), slow_repeats,
            lambda out: len(out["input_ids"]), "next fit, seq+[eos,pad], no position_ids/cu_seqlens")
    except ImportError:
        print("  fast_axolotl not installed: skipped")
        seqs = [s.tolist() for s in torch.split(flat, lengths.tolist())]
    try:
        from transformers import DataCollatorWithFlattening

        collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
        features = [{"input_ids": s} for s in seqs]
        add("transformers DataCollatorWithFlattening", lambda: collator(features), slow_repeats,
            lambda out: 0, "one flat row, input order (no bins)")
    except ImportError:
        print("  transformers not installed: skipped")
    return rows


def paired(fresh, reused, repeats: int):
    """Medians of fresh() and reused() timed alternately (F, R, F, R, ...) after one untimed call of
    each, so load drift on a shared machine hits both sides alike."""
    fresh(), reused()
    times = ([], [])
    for _ in range(repeats):
        for fn, out in zip((fresh, reused), times):
            result = None
            gc.collect()
            start = time.perf_counter()
            result = fn()
            out.append(time.perf_counter() - start)
            del result
    return times


def reuse_rows(record, flat: torch.Tensor, lengths: np.ndarray, repeats: int) -> None:
    """Fresh vs reused outputs (issue 17), each pair timed alternately: pack_sequences with fresh
    outputs vs ``out=PackBuffers()``; the op alone (plan excluded): pack_batch vs pack_batch_out into
    reused outputs; torch's copy_ of the same output bytes into fresh vs warm memory (what first-touch
    page faults cost on this machine)."""
    for layout in ("padded", "flat"):
        buffers = packkit.PackBuffers()
        call = lambda out=None: packkit.pack_sequences(flat, lengths, capacity=CAPACITY, layout=layout,  # noqa: E731
                                                       out=out)
        fresh_t, reused_t = paired(call, lambda: call(buffers), repeats)
        record(f"reuse: pack_sequences {layout}, fresh outputs", fresh_t, "plan + pack, paired with the next row")
        record(f"reuse: pack_sequences {layout}, out=PackBuffers", reused_t, "plan + pack, warm buffers")
        buffers.release()
    plan = packkit.plan(lengths, CAPACITY)
    shape = packkit.pack_layout(plan.segments, flat=False, row_len=CAPACITY)
    segs = [torch.from_numpy(a.copy()) for a in plan.segments]
    offs = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))))
    ops = torch.ops.packkit
    outs = packkit.PackBuffers().pack_batch_outputs((shape.num_rows, CAPACITY), shape.num_cu_seqlens, flat.dtype,
                                                    flat.dtype, "cpu")
    fresh_t, reused_t = paired(
        lambda: ops.pack_batch(flat, None, offs, *segs, shape.num_rows, CAPACITY, False, shape.num_cu_seqlens),
        lambda: ops.pack_batch_out(flat, None, offs, *segs, False, *outs), repeats)
    record("reuse: op pack_batch, fresh outputs", fresh_t, "padded layout, plan excluded")
    record("reuse: op pack_batch_out, reused outputs", reused_t, "padded layout, plan excluded")
    nbytes = sum(t.numel() * t.element_size() for t in outs)
    del outs
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    fresh_t, reused_t = paired(lambda: torch.empty_like(src).copy_(src), lambda: dst.copy_(src), repeats)
    record(f"reuse: torch copy_ {nbytes / 1e6:.0f} MB, fresh destination", fresh_t, "pack_batch's output bytes")
    record(f"reuse: torch copy_ {nbytes / 1e6:.0f} MB, warm destination", reused_t, "pack_batch's output bytes")


FEATURES = 8  # feature rows: [tokens, 8] bf16 / fp32, from the first quarter of the sequences


def dtype_case(name: str, lengths: np.ndarray, flat: torch.Tensor, algorithm: str = "obfd"):
    """Source tensor and pack arguments (one flat row, as pack_dataset packs) for one dtype."""
    if name in ("int32", "int64"):
        # A copy, as for every other dtype: flat itself wraps a numpy array, which numpy backs with huge
        # pages, and the page size of the source decides which read order is fastest (pack_cpu_notes.md).
        src = flat.to(getattr(torch, name), copy=True)
    elif name == "int64 numpy":  # the workload tensor itself: numpy memory (huge-page advised by numpy)
        src = flat
    else:  # features of the first quarter of the sequences: the token rows' bytes again
        lengths = lengths[: len(lengths) // 4]
        src = torch.randn(int(lengths.sum()), FEATURES).to(torch.bfloat16 if name == "bf16 x8" else torch.float32)
    plan = packkit.plan(lengths, CAPACITY, algorithm=algorithm)
    seg = plan.segments
    seg_seq, seg_start = torch.from_numpy(seg.seq_index.copy()), torch.from_numpy(seg.start.copy())
    cu = torch.from_numpy(np.concatenate(([0], np.cumsum(seg.length))).astype(np.int32))
    offsets = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))))
    args = (src, offsets, seg_seq, seg_start, cu, torch.arange(len(seg_seq), dtype=torch.int32))
    return src, args, int(cu[-1])


DTYPES = ("int32", "int64", "bf16 x8", "fp32 x8", "int64 numpy")
# Controls: the same tokens planned with next fit, whose segments read the source in order. What the
# obfd rows lose against these is the cost of gathering from random places, not of the dtype.
CONTROLS = ("int32", "int64")


def dtype_rows(repeats: int, n: int) -> list[dict]:
    """Per-dtype pack speed as a fraction of a plain copy of the same bytes (see the module docstring)."""
    lengths, flat = make_workload(n)
    rows = []
    for name, algorithm in [(d, "obfd") for d in DTYPES] + [(d, "nf") for d in CONTROLS]:
        src, args, total = dtype_case(name, lengths, flat, algorithm)
        assert total == src.shape[0]  # one flat row of every token: the output has the source's bytes
        out, warm = torch.empty_like(src), torch.empty_like(src)
        nbytes = out.numel() * out.element_size()
        pack_t, copy_t = paired(lambda: torch.ops.packkit.pack_out(*args, True, out), lambda: warm.copy_(src), repeats)
        fresh_t, fresh_copy_t = paired(lambda: torch.ops.packkit.pack(*args, 1, total, True),
                                       lambda: torch.empty_like(src).copy_(src), repeats)
        first = first_calls(name, n) if algorithm == "obfd" else (float("nan"), float("nan"))
        row = {"dtype": name, "plan": algorithm, "bytes": nbytes, "pack_out_s": statistics.median(pack_t),
               "copy_warm_s": statistics.median(copy_t), "pack_fresh_s": statistics.median(fresh_t),
               "copy_fresh_s": statistics.median(fresh_copy_t), "first_call_s": first[0], "second_call_s": first[1]}
        row["fraction_of_copy_warm"] = row["copy_warm_s"] / row["pack_out_s"]
        row["fraction_of_copy_fresh"] = row["copy_fresh_s"] / row["pack_fresh_s"]
        rows.append(row)
        print(f"  {name:<8} {algorithm:<4} {nbytes / 1e6:6.0f} MB  reused: pack_out {row['pack_out_s'] * 1e3:6.1f} ms, copy_ "
              f"{row['copy_warm_s'] * 1e3:6.1f} ms = {row['fraction_of_copy_warm']:.2f} of copy | fresh: pack "
              f"{row['pack_fresh_s'] * 1e3:6.1f} ms, copy {row['copy_fresh_s'] * 1e3:6.1f} ms = "
              f"{row['fraction_of_copy_fresh']:.2f} | fresh process: 1st pack {first[0] * 1e3:6.1f} ms, "
              f"2nd {first[1] * 1e3:6.1f} ms")
        del src, args, out, warm
        gc.collect()
    return rows


def first_calls(name: str, n: int) -> tuple[float, float]:
    """The first and second pack of ``name`` in a fresh process (fresh output memory both times)."""
    import subprocess
    import sys

    code = (f"import sys, time, torch; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_pack as b; "
            f"lengths, flat = b.make_workload({n}); src, args, total = b.dtype_case({name!r}, lengths, flat); t = []\n"
            "for _ in range(2):\n"
            "    s = time.perf_counter(); out = torch.ops.packkit.pack(*args, 1, total, True); "
            "t.append(time.perf_counter() - s); del out\n"
            "print(t[0], t[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return float(out[-2]), float(out[-1])


def gpu_section(repeats: int) -> list[dict]:
    results = []
    device = torch.device("cuda")
    backends = (["cuda"] if packkit.packing.ops.HAS_CUDA_KERNELS else []) + ["triton"]
    for tokens_target in (1 << 20, 16 << 20, 64 << 20):
        n = tokens_target // 520
        lengths, flat = make_workload(n, seed=1)
        plan = packkit.plan(lengths, CAPACITY)
        flat = flat.to(device)
        src = flat.numel()
        copy_src = torch.empty(src * 4, dtype=torch.int64, device=device)  # comparable bytes: ~4 int64 per token
        copy_dst = torch.empty_like(copy_src)

        def event_time(fn, reps=repeats):
            times = []
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000)
            return statistics.median(times)

        copy_dst.copy_(copy_src)
        copy_s = event_time(lambda: copy_dst.copy_(copy_src))
        copy_bw = 2 * copy_src.numel() * 8 / copy_s
        layout = packkit.pack_layout(plan.segments, flat=False, row_len=CAPACITY)
        segs = [torch.from_numpy(a.copy()).to(device) for a in plan.segments]
        offs = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))).to(device)
        out_tokens = layout.num_rows * layout.row_len
        moved = src * 8 + out_tokens * (8 + 8 + 8 + 4)  # ids read (labels = ids), 4 outputs written
        for backend in backends:
            op = torch.ops.packkit.pack_batch if backend == "cuda" else None
            if backend == "triton":
                from packkit.triton_kernels import pack as _tp  # noqa: F401

                op = torch.ops.packkit.triton_pack_batch
            call = lambda: op(flat, None, offs, *segs, layout.num_rows, layout.row_len, False,  # noqa: E731
                              layout.num_cu_seqlens)
            call()
            # The same pack into reused outputs (pack_batch_out): no allocation inside the timed call.
            out_op = getattr(torch.ops.packkit, ("" if backend == "cuda" else "triton_") + "pack_batch_out", None)
            outs = packkit.PackBuffers().pack_batch_outputs((layout.num_rows, layout.row_len), layout.num_cu_seqlens,
                                                            flat.dtype, flat.dtype, device)
            reused = None if out_op is None else (lambda: out_op(flat, None, offs, *segs, False, *outs))  # noqa: E731
            for variant, fn in (("fresh", call), ("reused", reused)):
                if fn is None:
                    continue
                fn()
                seconds = event_time(fn)
                bw = moved / seconds
                results.append({"tokens": src, "backend": backend, "outputs": variant, "median_s": seconds,
                                "bytes": moved, "bandwidth_GBps": bw / 1e9, "copy_bandwidth_GBps": copy_bw / 1e9,
                                "fraction_of_copy": bw / copy_bw})
                print(f"  {src:>11,} tokens {backend:<7} {variant:<7} {seconds * 1e6:9.1f} us  {bw / 1e9:7.1f} GB/s  "
                      f"{bw / copy_bw:6.1%} of copy ({copy_bw / 1e9:.0f} GB/s)")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k sequences, 2 repeats")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpu", action="store_true", help="run the GPU section too")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--dtypes-only", action="store_true", help="only the per-dtype rows (pack_dtypes_cpu.json)")
    args = parser.parse_args()
    n = 10_000 if args.quick else 100_000
    repeats = 2 if args.quick else args.repeats
    print(f"Per dtype: pack vs a plain copy of the same bytes ({n:,} sequences; torch threads {torch.get_num_threads()})")
    per_dtype = dtype_rows(max(repeats, 7) if not args.quick else 2, n)
    if args.dtypes_only:
        doc = {"machine": machine_info(load_average=os.getloadavg()), "workload": {"sequences": n, "capacity": CAPACITY,
               "features": FEATURES}, "per_dtype": per_dtype}
        write_results(doc, "pack_dtypes_cpu.json", args.out, args.quick)
        return
    rows = cpu_section(n, repeats, slow_repeats=1 if not args.quick else 2)
    base = rows[0]["median_s"]
    best_torch = min(r["median_s"] for r in rows if r["system"].startswith("pytorch"))
    print(f"\n{'system':<52} {'median':>10} {'vs packkit':>11} {'rows':>8} {'efficiency':>11}")
    for r in rows:
        eff = f"{r['efficiency']:.4%}" if r["efficiency"] else "-"
        print(f"{r['system']:<52} {r['median_s'] * 1000:8.1f}ms {r['median_s'] / base:10.2f}x {r['rows'] or '-':>8} "
              f"{eff:>11}")
    targets = {"vs_pytorch_reference": best_torch / base}
    fa = [r for r in rows if r["system"].startswith("fast_axolotl")]
    if fa:
        targets["vs_fast_axolotl"] = fa[0]["median_s"] / base
    hf = [r for r in rows if r["system"].startswith("transformers")]
    if hf:
        targets["vs_transformers_collator"] = hf[0]["median_s"] / base
    targets["packkit_efficiency"] = rows[0]["efficiency"]
    by_name = {r["system"]: r["median_s"] for r in rows}
    pairs = [k for k in by_name if k.startswith("reuse: ")]
    reuse = {pairs[i][len("reuse: "):].split(",")[0]: by_name[pairs[i]] / by_name[pairs[i + 1]] for i in range(0, len(pairs), 2)}
    print("\nFresh / reused outputs (same run, ratio of medians): "
          + "; ".join(f"{k}: {v:.2f}x" for k, v in reuse.items())
          + f"; load average {os.getloadavg()[0]:.2f}")
    print("\nTargets: >= 10x fast_axolotl, >= 5x the PyTorch reference, >= 99.9% efficiency")
    print("  " + ", ".join(f"{k} = {v:.4g}" for k, v in targets.items()))
    doc = {"machine": machine_info(load_average=os.getloadavg()), "workload": {"sequences": n, "lengths": "uniform 16..1024",
                                                   "capacity": CAPACITY}, "cpu": rows, "targets": targets,
           "fresh_over_reused": reuse, "per_dtype": per_dtype}
    if args.gpu and torch.cuda.is_available():
        print("\nGPU section")
        doc["gpu"] = gpu_section(max(repeats, 10))
    write_results(doc, results_name("pack", args.gpu), args.out, args.quick)

if __name__ == "__main__":
    main()
