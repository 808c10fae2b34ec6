"""GPU pack benchmark: packkit CUDA/Triton vs copy_, vectorised PyTorch, the unpad_input recipe and fla.

Run from the repository root::

    python benchmarks/bench_pack_gpu.py [--out PATH.json]        # on a CUDA GPU (< 6 min on one H100)
    python benchmarks/bench_pack_gpu.py --cpu [--out PATH.json]  # CPU tensors, tiny sizes (< 60 s): the harness
    python benchmarks/bench_pack_gpu.py --quick [--cpu]          # pack_batch only: ~32K, 1M, 16M, 64M tokens

Without ``--out`` the JSON goes to ``benchmarks/results/pack_gpu-<device slug>-<date>.json``.

Workload (seeded): sequence lengths uniform 16..1024, token ids 3..31999 (int64), planned by
``packkit.plan`` (obfd) once on the host, outside every timed region; the plan tensors are moved to
the device once. Sizes: 1M, 16M and 64M tokens, each at capacity 4096 and 16384 (padded rows), and two
training batches of the same 64 sequences (~37K tokens): flat at capacity 8192 and 8 rows x 8192 padded.
``--cpu`` scales the large sizes down to 16K/64K tokens.

Tasks and systems (one row per task, size and system; every system gets its natural input, built
before timing; each task-size has its own ``copy_`` row, the roof):

* ``pack_batch`` — flat source + plan -> padded (or flat) rows: input_ids, labels (first label of every
  segment = -100), position_ids int64, seq_idx int32, cu_seqlens int32.
    - packkit ``torch.ops.packkit.pack_batch`` (CUDA kernels; the CPU op in ``--cpu``) and
      ``torch.ops.packkit.triton_pack_batch`` (``packkit.triton_kernels.pack``; in ``--cpu`` under
      Triton's interpreter, training batches only);
    - ``torch_gather``: the best vectorised PyTorch we know: cu_seqlens and a per-token gather index
      built on the device from the plan tensors (cumsum, scatter, ``repeat_interleave`` with
      ``output_size=`` — no host sync), then one ``index_select`` per output;
    - ``copy_``: ``dst.copy_(src)`` of an int64 buffer of B/2 bytes, B = pack_batch's bytes below.
  Byte model (minimal, the same for every system of the task): read the kept source tokens (8 B each)
  and the plan tensors (seg_seq, seg_start, seg_length, bin_offsets, src_offsets; 8 B per entry);
  write rows x row_len x (8 + 8 + 8 + 4) B and 4 B per cu_seqlens entry.
* ``unpad`` — a padded batch [n, 1024] (one sequence per row) -> flat [T] ids + cu_seqlens, input order:
    - ``flash-attn recipe``: mask [n, 1024] bool -> seqlens -> ``nonzero`` indices + cu_seqlens + max
      seqlen -> one gather (written here after flash-attn's ``unpad_input`` design; host syncs: nonzero
      and max_seqlen, as in flash-attn);
    - fla ``pack_sequence(x, cu_seqlens, padding_side="right")`` where importable (given cu_seqlens);
    - packkit ``torch.ops.packkit.pack`` (CUDA, Triton; CPU in ``--cpu``) with src_offsets = i x 1024
      (given cu_seqlens and cu_seg, like fla);
    - ``copy_`` of the same bytes. Byte model: read T x 8 B tokens + n x 8 B lengths, write T x 8 B
      + (n + 1) x 4 B cu_seqlens.
* ``pack_features`` / ``unpack_features`` — ``torch.ops.packkit.pack`` of [T, 4096] bf16 embeddings into
  capacity-4096 rows (T = 256K; ``--cpu``: 2K x 256) and ``unpack`` of the packed tensor back, vs
  ``torch_gather`` (index_select / index_copy_ with the device-built index) and ``copy_``. Byte model:
  pack reads T x F x 2 B and writes rows x capacity x F x 2 B; unpack reads T x F x 2 B of real tokens and
  writes T x F x 2 B (index tensors not counted).
* ``collate`` (end to end) — Python lists of token ids -> packed tensors on the device:
  ``packkit.PackingCollator(capacity, layout="padded", device=...)`` vs transformers'
  ``DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)`` + ``.to(device)``
  of every tensor; ``torch.cuda.synchronize()`` inside the timed region; median wall time (no byte model).

Columns: microseconds = median per call (CUDA events around each call after warm-up, the input rotated
among copies so small sizes are not served from L2; ``perf_counter`` on CPU); gb_per_s = bytes (model
above) / median; fraction_of_copy_bandwidth = gb_per_s / the task-size's copy_ gb_per_s; launches =
CUDA kernels per call and memcpy_memset = memcpy + memset operations per call, from ``torch.profiler``'s
CUDA events over 3 calls; host_syncs = synchronising CUDA calls in one call
(``torch.cuda.set_sync_debug_mode("warn")``, counting its warnings). All three are None on CPU.
``--cpu`` runs with one torch thread (stable numbers on a small shared machine) and its figures only
show that the harness works: they say nothing about a GPU.

Correctness first: before timing, every system's outputs are compared with packkit's CPU op on the same
plan (every output of pack_batch; ids and cu_seqlens for unpad; the packed / unpacked features; the
real tokens of the collated batches). A mismatch is printed as ``CORRECTNESS FAILURE`` and the system
is not timed; the script then exits 1 (also if a packkit system raises). Peers that are missing or
raise are skipped rows with the reason.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

# --cpu runs the Triton kernels under the interpreter, which must be chosen before triton is imported.
if "--cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import torch
import torch.nn.functional as F

import packkit
from _results import count_sync_warnings, device_slug, machine_info, write_results

LENGTHS = (16, 1024)
PAD_ID, IGNORE = 0, -100
FEATURES_GPU, FEATURES_CPU = 4096, 256
TIME_BUDGET_S = 330  # GPU mode: sizes left after this are skipped (run.sh allows the bench < 6 minutes)
PER_SYSTEM_S = 0.25  # timed seconds per system and size (at least MIN_REPS calls)
MIN_REPS, MAX_REPS, WARMUP = 5, 200, 3


class CorrectnessError(AssertionError):
    pass


# --------------------------------------------------------------------------------------------------
# Device abstraction: the same functions run on CUDA (events) and on CPU (perf_counter).
# --------------------------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, device: torch.device, reps: int) -> list[float]:
    """Seconds per call; CUDA: one event pair per call, all read after one synchronize at the end."""
    if device.type == "cuda":
        pairs = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) / 1e3 for s, e in pairs]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def wall_calls(fn, device: torch.device, reps: int) -> list[float]:
    """Host wall time per call including a device synchronize (end-to-end rows)."""
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def measure(fn, device: torch.device, wall: bool = False, budget_s: float = PER_SYSTEM_S, warmup: int = WARMUP,
            min_reps: int = MIN_REPS) -> tuple[float, int]:
    """(median seconds, reps): warm-up, one probe call, then as many calls as fit the budget."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    timer = wall_calls if wall else time_calls
    probe = timer(fn, device, 1)[0]
    reps = int(min(MAX_REPS, max(min_reps, budget_s / max(probe, 1e-7))))
    if reps <= 1:
        return probe, 1
    return statistics.median(timer(fn, device, reps)), reps


def profile_device_work(fn, device: torch.device, calls: int = 3) -> tuple[float, float]:
    """(kernel launches, memcpy + memset operations) per call, from torch.profiler's CUDA events.

    On CPU the profiler runs too (CPU activity only, so this code path is exercised) and finds none.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        synchronize(device)
    on_device = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    copies_ = sum(name.startswith(("Memcpy", "Memset")) for name in on_device)
    return round((len(on_device) - copies_) / calls, 2), round(copies_ / calls, 2)


def count_launches(fn, device: torch.device):
    """(kernel launches, memcpy/memset) per call on CUDA; (None, None) on CPU."""
    return profile_device_work(fn, device) if device.type == "cuda" else (None, None)


def count_syncs(fn, device: torch.device):
    """Synchronising CUDA calls made by one call (sync debug mode 'warn'); None on CPU."""
    if device.type != "cuda":
        return None
    synchronize(device)
    syncs = count_sync_warnings(fn)
    synchronize(device)
    return syncs


class Rotating:
    """Call ``fn(inputs[k])`` cycling over k identical input copies, so repeats don't hit a warm L2."""

    def __init__(self, fn, inputs):
        self.fn, self.inputs, self.i = fn, inputs, 0

    def __call__(self):
        self.i = (self.i + 1) % len(self.inputs)
        return self.fn(self.inputs[self.i])


def copies(t: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    """Identical device copies of t, together >= 256 MB or 64 copies (an H100's L2 is 50 MB)."""
    nbytes = t.numel() * t.element_size()
    k = 1 if device.type != "cuda" else max(1, min(64, -(-(256 << 20) // max(nbytes, 1))))
    return [t] + [t.clone() for _ in range(k - 1)]


# --------------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------------

def make_sequences(n: int, seed: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(LENGTHS[0], LENGTHS[1] + 1, n).astype(np.int64)
    flat = torch.from_numpy(rng.integers(3, 32000, int(lengths.sum())).astype(np.int64))
    return lengths, flat


class PlanTensors:
    """A packkit plan as the int64 tensors the ops take, on one device, plus the host-side ints."""

    def __init__(self, plan, lengths: np.ndarray, device: torch.device, *, flat: bool, num_rows=None,
                 row_len=None):
        seg = plan.segments
        self.layout = packkit.pack_layout(seg, flat=flat, row_len=row_len, num_rows=num_rows)
        host = [torch.from_numpy(np.ascontiguousarray(a).copy()) for a in seg]
        self.seg_seq, self.seg_start, self.seg_length, self.bin_offsets = (t.to(device) for t in host)
        self.src_offsets = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))).to(device)
        self.kept = int(seg.length.sum())
        self.plan_entries = sum(len(a) for a in seg) + len(lengths) + 1

    def args(self):
        lay = self.layout
        return (self.src_offsets, self.seg_seq, self.seg_start, self.seg_length, self.bin_offsets, lay.num_rows,
                lay.row_len, lay.flat, lay.num_cu_seqlens, PAD_ID, IGNORE, True, 0)

    def to(self, device):
        other = object.__new__(PlanTensors)
        other.__dict__.update(self.__dict__)
        for name in ("seg_seq", "seg_start", "seg_length", "bin_offsets", "src_offsets"):
            setattr(other, name, getattr(self, name).to(device))
        return other


def pack_batch_bytes(p: PlanTensors) -> int:
    lay = p.layout
    return p.kept * 8 + p.plan_entries * 8 + lay.num_rows * lay.row_len * 28 + lay.num_cu_seqlens * 4


# --------------------------------------------------------------------------------------------------
# Vectorised PyTorch: output segments and a per-token gather index from the plan, on the device.
# --------------------------------------------------------------------------------------------------

def torch_token_index(p: PlanTensors):
    """(token -> source row or junk, token is padding, position within segment, token's segment, cu_seqlens).

    Items = plan segments and one tail per row, interleaved row by row (row b: its segments, then its
    tail of ``row_len - tokens`` padding); zero-length tails are not output segments. No host syncs:
    every size is a host int from the layout.
    """
    lay = p.layout
    dev = p.seg_length.device
    rows, row_len, nseg = lay.num_rows, lay.row_len, p.seg_length.numel()
    n_out = lay.num_cu_seqlens - 1
    if lay.flat:  # one row holding every segment
        ext = torch.cat((p.bin_offsets[:1], p.bin_offsets[-1:]))
    else:  # rows past the plan's bins are empty
        nbins = p.bin_offsets.numel() - 1
        ext = torch.cat((p.bin_offsets, p.bin_offsets[-1:].expand(rows - nbins)))
    row_ids = torch.arange(rows, device=dev)
    bin_of_seg = torch.repeat_interleave(row_ids, ext.diff(), output_size=nseg)
    cs = F.pad(torch.cumsum(p.seg_length, 0), (1, 0))
    tail = row_len - (cs[ext[1:]] - cs[ext[:-1]])
    seg_pos = torch.arange(nseg, device=dev) + bin_of_seg
    tail_pos = ext[1:] + row_ids
    items = nseg + rows
    item_len = torch.empty(items, dtype=torch.int64, device=dev)
    item_len.scatter_(0, seg_pos, p.seg_length).scatter_(0, tail_pos, tail)
    item_src = torch.full((items,), -1, dtype=torch.int64, device=dev)
    item_src.scatter_(0, seg_pos, p.src_offsets[p.seg_seq] + p.seg_start)
    item_end = torch.cumsum(item_len, 0)
    nonzero = item_len > 0
    rank = torch.cumsum(nonzero, 0) - 1
    cu = torch.zeros(n_out + 2, dtype=torch.int32, device=dev)  # slot n_out + 1 takes the empty tails
    cu.scatter_(0, torch.where(nonzero, rank + 1, n_out + 1), item_end.to(torch.int32))
    tok_item = torch.repeat_interleave(torch.arange(items, device=dev), item_len, output_size=rows * row_len)
    within = torch.arange(rows * row_len, device=dev) - (item_end - item_len).index_select(0, tok_item)
    tok_src = item_src.index_select(0, tok_item)
    is_pad = tok_src < 0
    tok_src = tok_src.add_(within).masked_fill_(is_pad, 0)
    return tok_src, is_pad, within, rank.to(torch.int32).index_select(0, tok_item), cu[:n_out + 1]


def torch_pack_batch(ids: torch.Tensor, p: PlanTensors):
    tok_src, is_pad, within, seq_idx, cu = torch_token_index(p)
    gathered = ids.index_select(0, tok_src)
    out_ids = gathered.masked_fill(is_pad, PAD_ID)
    labels = gathered.masked_fill_(is_pad | (within == 0), IGNORE)
    lay = p.layout
    shape = (lay.row_len,) if lay.flat else (lay.num_rows, lay.row_len)
    return out_ids.view(shape), labels.view(shape), within.view(shape), seq_idx.view(shape), cu


def torch_pack_features(src: torch.Tensor, p: PlanTensors):
    tok_src, is_pad, _, _, _ = torch_token_index(p)
    out = src.index_select(0, tok_src).masked_fill_(is_pad[:, None], 0)
    lay = p.layout
    return out.view(lay.num_rows, lay.row_len, -1)


def torch_unpack_features(packed: torch.Tensor, p: PlanTensors, num_src: int):
    tok_src, is_pad, _, _, _ = torch_token_index(p)
    out = torch.empty((num_src + 1, packed.shape[-1]), dtype=packed.dtype, device=packed.device)
    out.index_copy_(0, tok_src.masked_fill_(is_pad, num_src), packed.reshape(-1, packed.shape[-1]))  # pads -> spare row
    return out[:num_src]


# --------------------------------------------------------------------------------------------------
# The unpad task: padded [n, S] -> flat ids + cu_seqlens
# --------------------------------------------------------------------------------------------------

def unpad_recipe(padded: torch.Tensor, mask: torch.Tensor):
    """flash-attn's unpad_input design, written here: mask -> nonzero indices -> one gather."""
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten()).flatten()
    max_seqlen = int(seqlens.max())
    cu = F.pad(torch.cumsum(seqlens, 0, dtype=torch.int32), (1, 0))
    return padded.flatten().index_select(0, indices), cu, indices, max_seqlen


def load_fla():
    errors = []
    for module in ("fla.ops.utils", "fla.ops.utils.pack", "fla.ops"):
        try:
            mod = __import__(module, fromlist=["pack_sequence"])
            return getattr(mod, "pack_sequence"), None
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
            errors.append(f"{module}: {type(exc).__name__}: {exc}".splitlines()[0][:120])
    return None, "fla pack_sequence not importable (" + "; ".join(errors) + ")"


# --------------------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------------------

class Bench:
    def __init__(self, device: torch.device, cpu_mode: bool):
        self.device, self.cpu_mode = device, cpu_mode
        self.rows: list[dict] = []
        self.failures: list[str] = []
        self.started = time.perf_counter()
        self.has_cuda_kernels = device.type == "cuda" and packkit.packing.ops.HAS_CUDA_KERNELS
        try:
            from packkit.triton_kernels import pack as _triton_pack  # noqa: F401  (registers the ops)

            self.triton_error = None
        except Exception as exc:  # noqa: BLE001
            self.triton_error = f"packkit.triton_kernels.pack not importable: {type(exc).__name__}: {exc}"

    def no_cuda_reason(self) -> str:
        return "needs a CUDA GPU" if self.device.type != "cuda" else "packkit was built without CUDA kernels"

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def out_of_time(self, task: str, size: str) -> bool:
        """GPU mode: True (and a skipped row) once the time budget is spent."""
        if self.cpu_mode or self.elapsed() <= TIME_BUDGET_S:
            return False
        self.add(task, size, "*", "*", 0, None, skip=f"time budget ({TIME_BUDGET_S} s) spent")
        return True

    def add(self, task, size, system, backend, tokens, nbytes, fn=None, check=None, *, skip=None, wall=False,
            peer=False, copy_row=None, note=""):
        """Check, then time one system; ``copy_row`` is the task-size's copy row (None for the copy itself).

        ``wall=True``: host wall time with a device synchronize after each call (end-to-end rows); ``fn``
        itself must not synchronise, so that launches and host syncs count only its own.
        """
        row = {"task": task, "size": size, "system": system, "backend": backend, "tokens": tokens,
               "microseconds": None, "gb_per_s": None, "fraction_of_copy_bandwidth": None, "launches": None,
               "memcpy_memset": None, "host_syncs": None, "bytes": nbytes, "reps": 0, "skipped": skip, "note": note}
        self.rows.append(row)
        if skip:
            return row
        try:
            if check is not None:
                out = fn()
                synchronize(self.device)
                check(out)
                del out
            if backend.endswith("-interpreter"):  # seconds per call: the checked call was the warm-up
                seconds, reps = measure(fn, self.device, wall=wall, budget_s=0, warmup=0, min_reps=1)
            elif self.cpu_mode:  # the harness check: few, short repeats
                seconds, reps = measure(fn, self.device, wall=wall, budget_s=0.03, warmup=1, min_reps=3)
            else:
                seconds, reps = measure(fn, self.device, wall=wall)
            launches, device_copies = count_launches(fn, self.device)
            row.update(microseconds=seconds * 1e6, reps=reps, launches=launches, memcpy_memset=device_copies,
                       host_syncs=count_syncs(fn, self.device))
            if nbytes:
                row["gb_per_s"] = nbytes / seconds / 1e9
            if system == "copy_":
                row["fraction_of_copy_bandwidth"] = 1.0
            elif copy_row is not None and copy_row.get("gb_per_s") and row["gb_per_s"]:
                row["fraction_of_copy_bandwidth"] = row["gb_per_s"] / copy_row["gb_per_s"]
        except CorrectnessError as exc:
            row["skipped"] = f"CORRECTNESS FAILURE: {exc}"
            self.failures.append(f"{task} {size} {system}: {exc}")
            print(f"CORRECTNESS FAILURE: {task} {size} {system} ({backend}): {exc}", flush=True)
        except Exception as exc:  # noqa: BLE001 - a peer's failure is a skipped row; packkit's fails the run
            msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            row["skipped"] = ("error: " if peer else "ERROR: ") + msg
            if not peer:
                self.failures.append(f"{task} {size} {system}: {msg}")
                traceback.print_exc()
            print(f"  {system} ({backend}) at {size}: {row['skipped']}", flush=True)
        finally:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.print_row(row)
        return row

    def add_copy(self, task, size, tokens, nbytes):
        """copy_ of an int64 buffer of nbytes / 2 bytes: reads + writes = nbytes."""
        n = max(1, nbytes // 16)
        src = torch.randint(0, 1 << 40, (n,), dtype=torch.int64, device=self.device)
        dst = torch.empty_like(src)
        srcs = copies(src, self.device)

        def check(_):
            if not torch.equal(dst, srcs[-1]):
                raise CorrectnessError("copy_ destination differs from its source")

        row = self.add(task, size, "copy_", "torch", tokens, n * 16, Rotating(dst.copy_, srcs), check,
                       note="roof: bytes read once + written once")
        return row

    def print_row(self, r):
        def f(v, spec):
            return format(v, spec) if v is not None else "-"
        print(f"  {r['task']:<15} {r['size']:<12} {r['system']:<22} {r['backend']:<17} {r['tokens']:>11,} "
              f"{f(r['microseconds'], '12.1f')} {f(r['gb_per_s'], '9.1f')} "
              f"{f(r['fraction_of_copy_bandwidth'], '7.1%')} {f(r['launches'], '>5')} {f(r['host_syncs'], '>4')}"
              + (f"  [{r['skipped']}]" if r["skipped"] else ""), flush=True)


def expect_equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.detach()
    want = want.to(got.device)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise CorrectnessError(f"{name}: shape/dtype {tuple(got.shape)} {got.dtype}, expected "
                               f"{tuple(want.shape)} {want.dtype}")
    if not torch.equal(got, want):
        bad = torch.nonzero((got != want).flatten())[:1].item()
        raise CorrectnessError(f"{name}: first mismatch at flat index {bad}: {got.flatten()[bad].item()} vs "
                               f"{want.flatten()[bad].item()}")


def pack_batch_task(b: Bench, size: str, flat_cpu: torch.Tensor, plan_cpu: PlanTensors, interpret_ok: bool,
                    gather: bool = True):
    """pack_batch rows for one (size, layout): copy, packkit CUDA/Triton/CPU, torch_gather."""
    dev = b.device
    tokens = plan_cpu.kept
    nbytes = pack_batch_bytes(plan_cpu)
    names = ("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens")
    # The reference: packkit's CPU op, moved to the device once for the comparisons.
    ref = tuple(t.to(dev) for t in torch.ops.packkit.pack_batch(flat_cpu, None, *plan_cpu.args()))

    def check(out):
        for name, got, want in zip(names, out, ref):
            expect_equal(name, got, want)

    copy_row = b.add_copy("pack_batch", size, tokens, nbytes)
    p = plan_cpu.to(dev)
    srcs = copies(flat_cpu.to(dev), dev)
    op = torch.ops.packkit.pack_batch
    if dev.type == "cpu":
        b.add("pack_batch", size, "packkit", "cpu", tokens, nbytes, Rotating(lambda s: op(s, None, *p.args()), srcs),
              check, copy_row=copy_row)
    if b.has_cuda_kernels:
        b.add("pack_batch", size, "packkit", "cuda", tokens, nbytes, Rotating(lambda s: op(s, None, *p.args()), srcs),
              check, copy_row=copy_row)
    else:
        b.add("pack_batch", size, "packkit", "cuda", tokens, nbytes, skip=b.no_cuda_reason())
    interp_ok = dev.type == "cuda" or interpret_ok
    if b.triton_error or not interp_ok:
        b.add("pack_batch", size, "packkit", "triton", tokens, nbytes,
              skip=b.triton_error or "Triton interpreter (--cpu): training batches only")
    else:
        top = torch.ops.packkit.triton_pack_batch
        b.add("pack_batch", size, "packkit", "triton" + ("-interpreter" if dev.type == "cpu" else ""), tokens,
              nbytes, Rotating(lambda s: top(s, None, *p.args()), srcs), check, copy_row=copy_row)
    if gather:
        b.add("pack_batch", size, "torch_gather", "torch", tokens, nbytes,
              Rotating(lambda s: torch_pack_batch(s, p), srcs), check, copy_row=copy_row,
              note="device-built index, repeat_interleave(output_size=), index_select")


def unpad_task(b: Bench, size: str, lengths: np.ndarray, flat_cpu: torch.Tensor, fla, fla_reason, interpret_ok):
    """padded [n, 1024] -> flat ids + cu_seqlens: copy, flash-attn recipe, fla, packkit pack."""
    dev = b.device
    n, width, total = len(lengths), LENGTHS[1], int(lengths.sum())
    nbytes = total * 16 + n * 8 + (n + 1) * 4
    cols = torch.arange(width)
    mask_cpu = cols[None, :] < torch.from_numpy(lengths)[:, None]
    padded_cpu = torch.zeros((n, width), dtype=torch.int64)
    padded_cpu[mask_cpu] = flat_cpu
    cu_cpu = F.pad(torch.cumsum(torch.from_numpy(lengths), 0), (1, 0)).to(torch.int32)
    # packkit's view of the same job: sequence i starts at row i of the padded source, kept whole, in order.
    src_offsets = torch.arange(n + 1, dtype=torch.int64) * width
    seg_seq, seg_start = torch.arange(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
    cu_seg = torch.arange(n, dtype=torch.int32)
    pk_args_cpu = (src_offsets, seg_seq, seg_start, cu_cpu, cu_seg)
    ref = torch.ops.packkit.pack(padded_cpu.flatten(), *pk_args_cpu, 1, total, True)
    expect_equal("packkit CPU unpad reference vs source", ref, flat_cpu)  # guards the setup itself

    def check_ids(out):
        expect_equal("input_ids", out[0] if isinstance(out, tuple) else out, ref)

    def check_recipe(out):
        check_ids(out)
        expect_equal("cu_seqlens", out[1], cu_cpu)

    copy_row = b.add_copy("unpad", size, total, nbytes)
    padded = copies(padded_cpu.to(dev), dev)
    mask = mask_cpu.to(dev)
    cu = cu_cpu.to(dev)
    b.add("unpad", size, "flash-attn recipe", "torch", total, nbytes,
          Rotating(lambda x: unpad_recipe(x, mask), padded), check_recipe, copy_row=copy_row,
          note="mask -> nonzero -> index_select (flash-attn unpad_input design)")
    if fla is None or dev.type != "cuda":
        b.add("unpad", size, "fla pack_sequence", "triton", total, nbytes,
              skip=fla_reason or "needs a CUDA GPU")
    else:
        b.add("unpad", size, "fla pack_sequence", "triton", total, nbytes,
              Rotating(lambda x: fla(x, cu, padding_side="right"), padded), check_ids, peer=True, copy_row=copy_row,
              note="given cu_seqlens")
    pk_args = tuple(t.to(dev) for t in pk_args_cpu)
    backends = [("cpu", torch.ops.packkit.pack)] if dev.type == "cpu" else []
    if b.has_cuda_kernels:
        backends.append(("cuda", torch.ops.packkit.pack))
    else:
        b.add("unpad", size, "packkit pack", "cuda", total, nbytes, skip=b.no_cuda_reason())
    if not b.triton_error and (dev.type == "cuda" or interpret_ok):
        backends.append(("triton" + ("-interpreter" if dev.type == "cpu" else ""), torch.ops.packkit.triton_pack))
    else:
        b.add("unpad", size, "packkit pack", "triton", total, nbytes,
              skip=b.triton_error or "Triton interpreter (--cpu): training batches only")
    for backend, op in backends:
        b.add("unpad", size, "packkit pack", backend, total, nbytes,
              Rotating(lambda x, op=op: op(x.view(-1), *pk_args, 1, total, True), padded), check_ids,
              copy_row=copy_row, note="given cu_seqlens + cu_seg")


def feature_tasks(b: Bench, num_tokens: int, features: int):
    """pack / unpack of [T, F] bf16 embeddings: packkit backends, torch_gather, copy_."""
    dev = b.device
    lengths, _ = make_sequences(max(1, num_tokens // 520), seed=7)
    total = int(lengths.sum())
    size = f"{total // 1024}Kx{features}"
    plan = PlanTensors(packkit.plan(lengths, 4096), lengths, torch.device("cpu"), flat=False, row_len=4096)
    lay = plan.layout
    cu_cpu, cu_seg_cpu = torch.ops.packkit.layout(plan.seg_length, plan.bin_offsets, lay.num_rows, lay.row_len,
                                                  False, lay.num_cu_seqlens)
    gen = torch.Generator(dev).manual_seed(3)  # random (never zeros), made where it is fast
    src_dev = torch.randn((total, features), generator=gen, device=dev, dtype=torch.bfloat16)
    idx_cpu = (plan.src_offsets, plan.seg_seq, plan.seg_start, cu_cpu, cu_seg_cpu)
    packed_ref = torch.ops.packkit.pack(src_dev.cpu(), *idx_cpu, lay.num_rows, lay.row_len, False).to(dev)
    pack_bytes = total * features * 2 + lay.num_rows * lay.row_len * features * 2
    unpack_bytes = 2 * total * features * 2
    p = plan.to(dev)
    idx = tuple(t.to(dev) for t in idx_cpu)
    backends = [("cpu", "")] if dev.type == "cpu" else []
    if b.has_cuda_kernels:
        backends.append(("cuda", ""))
    else:
        b.add("pack_features", size, "packkit pack", "cuda", total, pack_bytes, skip=b.no_cuda_reason())
        b.add("unpack_features", size, "packkit unpack", "cuda", total, unpack_bytes, skip=b.no_cuda_reason())
    if b.triton_error:
        b.add("pack_features", size, "packkit pack", "triton", total, pack_bytes, skip=b.triton_error)
    elif dev.type == "cuda":
        backends.append(("triton", "triton_"))
    else:
        b.add("pack_features", size, "packkit pack", "triton", total, pack_bytes,
              skip="Triton interpreter (--cpu): training batches only")

    def check_pack(out):
        expect_equal("packed features", out, packed_ref)

    # pack
    copy_row = b.add_copy("pack_features", size, total, pack_bytes)
    srcs = copies(src_dev, dev)
    for backend, prefix in backends:
        op = getattr(torch.ops.packkit, prefix + "pack")
        b.add("pack_features", size, "packkit pack", backend, total, pack_bytes,
              Rotating(lambda s, op=op: op(s, *idx, lay.num_rows, lay.row_len, False), srcs), check_pack,
              copy_row=copy_row)
    b.add("pack_features", size, "torch_gather", "torch", total, pack_bytes,
          Rotating(lambda s: torch_pack_features(s, p), srcs), check_pack, copy_row=copy_row)
    # unpack
    copy_row = b.add_copy("unpack_features", size, total, unpack_bytes)
    packed = copies(packed_ref, dev)

    def check_unpack(out):
        expect_equal("unpacked features", out, src_dev)

    for backend, prefix in backends:
        op = getattr(torch.ops.packkit, prefix + "unpack")
        b.add("unpack_features", size, "packkit unpack", backend, total, unpack_bytes,
              Rotating(lambda x, op=op: op(x, idx[0], idx[1], idx[2], idx[3], idx[4], False, total), packed),
              check_unpack, copy_row=copy_row)
    b.add("unpack_features", size, "torch_gather", "torch", total, unpack_bytes,
          Rotating(lambda x: torch_unpack_features(x, p, total), packed), check_unpack, copy_row=copy_row,
          note="index_copy_ (padding to a spare row)")


def collate_task(b: Bench, label: str, n: int, capacity: int, seed: int):
    """End to end: lists of ids -> packed device tensors; PackingCollator vs HF flattening + .to()."""
    dev = b.device
    lengths, flat = make_sequences(n, seed)
    feats = [{"input_ids": s.tolist()} for s in torch.split(flat, lengths.tolist())]
    total = int(lengths.sum())
    want = torch.sort(flat).values

    def check_tokens(ids, what):
        got = ids.flatten()
        got = torch.sort(got[got != PAD_ID].cpu()).values
        expect_equal(f"{what}: multiset of real tokens", got, want)

    collator = packkit.PackingCollator(capacity, layout="padded", device=str(dev))

    def run_packkit():
        return collator(feats)

    b.add("collate", label, "packkit PackingCollator", f"padded@{capacity}", total, None, run_packkit,
          lambda out: check_tokens(out["input_ids"], "packkit"), wall=True,
          note="lists -> padded rows on the device, synchronize included")
    try:
        from transformers import DataCollatorWithFlattening

        hf = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    except Exception as exc:  # noqa: BLE001 - missing, or too old for these options
        b.add("collate", label, "transformers flattening", "flat+.to", total, None,
              skip=f"transformers DataCollatorWithFlattening unavailable: {type(exc).__name__}: {exc}")
        return

    def run_hf():
        return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in hf(feats, return_tensors="pt").items()}

    b.add("collate", label, "transformers flattening", "flat+.to", total, None, run_hf,
          lambda out: check_tokens(out["input_ids"], "transformers"), wall=True, peer=True,
          note="DataCollatorWithFlattening + .to(device) of every tensor, synchronize included")


def run_quick(b: Bench, cpu_mode: bool) -> None:
    """--quick: pack_batch only, CUDA and Triton against the copy_ roof of the same bytes, at a ~32K-token training
    batch (flat), then 1M, 16M and 64M tokens at capacity 16384 (16K / 64K on --cpu)."""
    lengths, flat = make_sequences(63, seed=11)
    pack_batch_task(b, f"batch{int(lengths.sum()) // 1024}K-flat", flat,
                    PlanTensors(packkit.plan(lengths, 8192), lengths, torch.device("cpu"), flat=True), True, gather=False)
    targets = [("16K", 16 << 10), ("64K", 64 << 10)] if cpu_mode else [("1M", 1 << 20), ("16M", 16 << 20),
                                                                        ("64M", 64 << 20)]
    for label, target in targets:
        if b.out_of_time("pack_batch", label):
            continue
        lengths, flat = make_sequences(target // 520, seed=1)
        plan = packkit.plan(lengths, 16384)
        pack_batch_task(b, f"{label}@16384", flat, PlanTensors(plan, lengths, torch.device("cpu"), flat=False,
                                                               row_len=16384), False, gather=False)
        del lengths, flat
        gc.collect()


def run(b: Bench, cpu_mode: bool) -> None:
    fla, fla_reason = load_fla() if not cpu_mode else (None, "not tried in --cpu (fla needs a CUDA GPU)")
    targets = [("16K", 16 << 10), ("64K", 64 << 10)] if cpu_mode else [("1M", 1 << 20), ("16M", 16 << 20),
                                                                        ("64M", 64 << 20)]
    # Training batches first (small, and what a trainer sees every step).
    lengths, flat = make_sequences(64, seed=11)
    plan = packkit.plan(lengths, 8192)
    tok = f"{int(lengths.sum()) // 1024}K"
    print(f"\ntraining batch: 64 sequences, {int(lengths.sum()):,} tokens, capacity 8192 ({plan.num_bins} bins)",
          flush=True)
    pack_batch_task(b, f"batch{tok}-flat", flat, PlanTensors(plan, lengths, torch.device("cpu"), flat=True), True)
    pack_batch_task(b, "batch-8x8192", flat, PlanTensors(plan, lengths, torch.device("cpu"), flat=False,
                                                         num_rows=8, row_len=8192), True)
    unpad_task(b, f"batch{tok}", lengths, flat, fla, fla_reason, True)
    for label, target in targets:
        if b.out_of_time("pack_batch+unpad", label):
            continue
        lengths, flat = make_sequences(target // 520, seed=1)
        print(f"\n{label}: {len(lengths):,} sequences, {int(lengths.sum()):,} tokens", flush=True)
        for capacity in (4096, 16384):
            plan = packkit.plan(lengths, capacity)
            pack_batch_task(b, f"{label}@{capacity}", flat,
                            PlanTensors(plan, lengths, torch.device("cpu"), flat=False, row_len=capacity), False)
        unpad_task(b, label, lengths, flat, fla, fla_reason, False)
        del lengths, flat
        gc.collect()
    print("\nfeature dim", flush=True)
    if not b.out_of_time("pack_features", "256Kx4096"):
        if cpu_mode:
            feature_tasks(b, 2 << 10, FEATURES_CPU)
        else:
            feature_tasks(b, 256 << 10, FEATURES_GPU)
    print("\nend to end (lists -> packed tensors on the device)", flush=True)
    larger = 256 if cpu_mode else 1024
    for n, capacity in ((64, 8192), (larger, 16384)):
        if not b.out_of_time("collate", f"{n} seqs"):
            collate_task(b, f"{n} seqs", n, capacity, seed=11 + n)


def print_table(rows):
    print(f"\n{'task':<15} {'size':<12} {'system':<22} {'backend':<17} {'tokens':>11} {'us (median)':>12} "
          f"{'GB/s':>9} {'of copy':>7} {'launch':>6} {'sync':>4}")
    for r in rows:
        def f(key, spec):
            v = r.get(key)
            return format(v, spec) if v is not None else "-"
        print(f"{r['task']:<15} {r['size']:<12} {r['system']:<22} {r['backend']:<17} {r['tokens']:>11,} "
              f"{f('microseconds', '12.1f')} {f('gb_per_s', '9.1f')} {f('fraction_of_copy_bandwidth', '7.1%')} "
              f"{f('launches', '>6')} {f('host_syncs', '>4')}" + (f"  [{r['skipped']}]" if r.get("skipped") else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="CPU tensors, tiny sizes: exercises the harness")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/...)")
    parser.add_argument("--quick", action="store_true", help="pack_batch only (CUDA, Triton, copy_ roof) at ~32K, "
                        "1M, 16M and 64M tokens: the one-call GPU session's step (tests/gpu/run.sh session)")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA GPU: run with --cpu for the CPU harness check", file=sys.stderr)
        return 2
    device = torch.device("cpu") if args.cpu else torch.device("cuda", torch.cuda.current_device())
    if args.cpu:  # on a small shared CPU, intra-op threads waiting on a descheduled sibling make 20 ms stalls
        torch.set_num_threads(1)
    torch.manual_seed(0)
    extra = {"mode": "cpu" if args.cpu else "gpu", "cuda": torch.version.cuda,
             "packkit_cuda_kernels": bool(packkit.packing.ops.HAS_CUDA_KERNELS)}
    try:
        import triton

        extra["triton"] = triton.__version__
    except ImportError:
        extra["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        extra.update(compute_capability=f"{props.major}.{props.minor}", gpu_memory_gb=props.total_memory / 2**30)
    b = Bench(device, args.cpu)
    if args.cpu:  # the profiler path runs on CPU too (it finds no CUDA events there)
        assert profile_device_work(lambda: torch.arange(8).sum(), device, calls=1) == (0, 0)
    print(f"bench_pack_gpu: {'CPU harness check' if args.cpu else torch.cuda.get_device_name(device)}; "
          f"columns: task size system backend tokens us GB/s of-copy launches syncs", flush=True)
    try:
        (run_quick if args.quick else run)(b, args.cpu)
    except Exception:  # noqa: BLE001 - keep the rows measured so far
        traceback.print_exc()
        b.failures.append("harness raised: " + traceback.format_exc().splitlines()[-1])
    print_table(b.rows)
    seconds = b.elapsed()
    print(f"\n{len(b.rows)} rows in {seconds:.1f} s; failures: {len(b.failures)}")
    for f in b.failures:
        print(f"  FAILED {f}")
    doc = {"machine": machine_info(**extra), "seconds": seconds, "failures": b.failures,
           "workload": {"lengths": f"uniform {LENGTHS[0]}..{LENGTHS[1]}", "token_ids": "3..31999 int64",
                        "planner": "obfd", "pad_id": PAD_ID, "ignore_index": IGNORE},
           "rows": b.rows}
    doc["quick"] = args.quick
    name = f"pack_gpu{'-quick' if args.quick else ''}-{device_slug(device.type == 'cuda')}-{doc['machine']['date']}.json"
    write_results(doc, name, args.out, quick=False)
    return 1 if b.failures else 0


if __name__ == "__main__":
    sys.exit(main())
