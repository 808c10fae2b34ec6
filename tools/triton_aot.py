"""Compile every packkit Triton kernel ahead of time for real GPU targets, on a machine without a GPU (issue 48).

The interpreter (TRITON_INTERPRET=1) accepts programs the compiler rejects, and nothing else in CI compiles the
kernels for the architectures the GPU image runs. This tool:

1. drives every launcher (the public ``packkit::triton_*`` ops) over every input class they accept (every torch
   dtype, every tile size ``_tiles`` can pick, every flag and optional argument) with tiny CPU tensors, recording
   each launch instead of running it: the kernel, its argument types (pointer element types, i32 / i64 ints, as
   ``JITFunction.run`` types them), constexprs and ``num_warps``;
2. checks the enumeration is complete: every ``@triton.jit`` function in ``triton_kernels/`` is a launched kernel or
   a helper one of them calls, every launched kernel was recorded, and per kernel the recorded (constexpr, data
   pointer dtype) combinations equal the ones declared in ``DOMAINS`` below (a new constexpr, dtype or tile the
   launchers can produce, or one the drive misses, fails the tool);
3. compiles each combination (plus one "wide" variant per kernel with every int argument i64, the type sizes past
   2^31 get) for ``GPUTarget("cuda", cc, 32)``, pointers 16-byte aligned (torch's allocations), and reads
   registers, shared memory and local memory (spills) from the cubin (``cuobjdump --dump-resource-usage``, the
   one triton bundles); fails on any compile error, registers x threads > 65,536, or shared memory over the
   architecture's opt-in limit.

Usage: ``python tools/triton_aot.py [--cc 80 90 100] [--select all|cover] [--jobs N] [--json FILE] [--list]``.
``--select cover`` compiles a subset in which every constexpr value and every data dtype of every kernel appears
at least once (CI's budget); ``all`` (default) compiles every combination. Not compiled: the JIT's own
specialisations of int arguments (== 1, divisible by 16), which only remove work from these variants.
Runs without TRITON_INTERPRET, with whichever triton the interpreter imports (CI: the main venv's and 3.6.0).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from triton_aot_rules import domains, i32_loops, jit_coverage, parse_resource_usage, violations  # noqa: E402

TYPE_OF = {"torch.bool": "i1", "torch.int8": "i8", "torch.int16": "i16", "torch.int32": "i32", "torch.int64": "i64"}


# --- recording the launches ---------------------------------------------------------------------------------------
class _Recorder:
    """Stands in for ``wrap_triton`` in each op family: ``wrap_triton(kernel)[grid](*args, **kwargs)`` records."""

    launches: list = []

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            _Recorder.launches.append((self.kernel, args, dict(kwargs)))
        return launch


def _spec(fn, args, kwargs):
    """(signature, constexprs, attrs, num_warps) of one launch, typed as JITFunction.run types it."""
    import torch

    kwargs = dict(kwargs)
    num_warps = kwargs.pop("num_warps")
    names = [p.name for p in fn.params]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    assert set(bound) == set(names), (fn.__name__, sorted(set(names) ^ set(bound)))
    sig, cx, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        v = bound[p.name]
        if p.is_constexpr:
            sig[p.name], cx[p.name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + TYPE_OF[str(v.dtype)]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{fn.__name__}: argument {p.name} = {v!r} is neither a tensor, an int nor a constexpr")
        else:
            sig[p.name] = "i32" if -2**31 <= v < 2**31 else "i64"
    return sig, cx, attrs, num_warps


def _drive(skip=()):
    """Calls every launcher over every input class it accepts; returns the recorded launches."""
    import torch

    from packkit.triton_kernels import common, context_parallel as CP, tree_pack as TP
    from packkit.triton_kernels import layout, pack as P, pack_batch, unpack

    for family in (layout, P, pack_batch, unpack, CP, TP):
        family.wrap_triton = _Recorder
    common._interpreting = CP._interpreting = TP._interpreting = lambda: True  # CPU tensors; nothing runs
    _Recorder.launches = []
    i64, i32 = dict(dtype=torch.int64), dict(dtype=torch.int32)
    if "layout" not in skip:
        seg_length = torch.tensor([3, 2, 4], **i64)
        for flat, rows in ((False, 2), (True, 1)):
            P.layout(seg_length, torch.tensor([0, 2, 3], **i64), rows, 8, flat, 3)
    offs = torch.tensor([0, 3, 9], **i64)
    seg_seq, seg_start = torch.tensor([0, 1, 1], **i64), torch.tensor([0, 0, 2], **i64)
    cu, cu_seg = torch.tensor([0, 3, 5, 8], **i32), torch.tensor([0, 1, -1], **i32)
    dtypes = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
    widths = [0] + [2**k for k in range(12)]  # () and (f,): every record width _tiles distinguishes
    for dtype in dtypes:
        for f in widths:
            feature = () if f == 0 else (f,)
            try:
                src = torch.zeros((9,) + feature, dtype=dtype)
                packed = torch.zeros((2, 4) + feature, dtype=dtype)
            except (RuntimeError, TypeError):  # dtypes torch cannot allocate on the CPU
                continue
            for name, call in (
                    ("pack", lambda: P.pack(src, offs, seg_seq, seg_start, cu, cu_seg, 2, 4, False, 0.0, None)),
                    ("pack_first", lambda: P.pack(src, offs, seg_seq, seg_start, cu, cu_seg, 2, 4, False, 0.0, 1.0)),
                    ("unpack", lambda: P.unpack(packed, offs, seg_seq, seg_start, cu, cu_seg, False, 9, 0.0)),
                    ("unpack_padded", lambda: P.unpack_padded(packed, seg_seq, seg_start, cu, cu_seg, False, 2, 6,
                                                              0.0))):
                if name in skip:
                    continue
                try:
                    call()
                except (TypeError, ValueError):  # a dtype the launcher refuses (by name) produces no launch
                    pass
    ids_types = (torch.int32, torch.int64)
    if "pack_batch" not in skip:
        for ids_t, lab_t, mask in itertools.product(ids_types, (None,) + ids_types, (False, True)):
            labels = None if lab_t is None else torch.zeros(9, dtype=lab_t)
            P.pack_batch(torch.zeros(9, dtype=ids_t), labels, offs, seg_seq, seg_start, torch.tensor([3, 2, 4], **i64),
                         torch.tensor([0, 2, 3], **i64), 2, 8, False, 4, mask_first_label=mask)
    cp_cu, cp_cup = torch.tensor([0, 3, 9], **i32), torch.tensor([0, 4, 12], **i32)
    if "cp_shard" not in skip:
        for ids_t, lab_t, zigzag in itertools.product(ids_types, ids_types, (False, True)):
            cup, n = (cp_cup, 6) if zigzag else (cp_cu, 5)
            CP.cp_shard(torch.zeros(9, dtype=ids_t), torch.zeros(9, dtype=lab_t), torch.zeros(9, **i64), cp_cu, cup, 2,
                        1, zigzag, n, 0, -100)
            for first in (None, -100):
                CP.cp_shard(torch.zeros(11, dtype=ids_t), torch.zeros(11, dtype=lab_t), None, cp_cu, cup, 2, 1, zigzag,
                            n, 0, -100, torch.tensor([2, -1], **i64), 1, first)
    if "tree_pack" not in skip:
        nodes = [torch.tensor(v, **i64) for v in ([0, 3], [0, 8], [3, 4], [0, 0], [3, 4])]
        for ids_t, lab_t in itertools.product(ids_types, (None,) + ids_types):
            labels = None if lab_t is None else torch.zeros(9, dtype=lab_t)
            TP.tree_pack(torch.zeros(9, dtype=ids_t), labels, *nodes, torch.tensor([0, 1, 2], **i64), 2, 8)
    config = dict(common._CONFIG, cp_block=CP._CONFIG["block"], tree_block=TP._CONFIG["block"])
    tiles = {common._tiles(f) for f in range(1, 4 * config["max_block_f"] + 1)}
    return list(_Recorder.launches), config, tiles


def check_coverage(launches, config, tiles):
    """The enumeration must equal the declared domains and reach every kernel; returns the specs to compile:
    [(module, kernel name, signature, constexprs, attrs, num_warps, key)] plus the wide variants."""
    launched, helpers, errors = jit_coverage()
    want = domains(config, tiles)
    for name in sorted(launched - set(want)):
        errors.append(f"kernel {name} has no declared domain in tools/triton_aot.py")
    seen, specs, fixed = {}, [], {}
    for fn, args, kwargs in launches:
        sig, cx, attrs, num_warps = _spec(fn, args, kwargs)
        name = fn.__name__
        declared = {p for _, ptrs in want.get(name, ()) for p, _ in ptrs}
        cx_names = {p.name for p in fn.params if p.is_constexpr}
        for key_cx, _ in want.get(name, ()):
            if {k for k, _ in key_cx} != cx_names:
                errors.append(f"{name}: declared constexprs {sorted(k for k, _ in key_cx)} != the kernel's "
                              f"{sorted(cx_names)}")
                break
        data = {p: t[1:] for p, t in sig.items() if p in declared}
        for p, t in sig.items():  # every other pointer has one dtype across all launches (index tensors)
            if t.startswith("*") and p not in declared and fixed.setdefault((name, p), t) != t:
                errors.append(f"{name}: pointer {p} launched as {fixed[(name, p)]} and {t}; declare it in DOMAINS")
        key = (tuple(sorted(cx.items())), tuple(sorted(data.items())))
        if (name, key) not in seen:
            seen[(name, key)] = True
            specs.append((fn, sig, cx, attrs, num_warps, key))
    for name, keys in sorted(want.items()):
        got = {k for n, k in seen if n == name}
        for k in sorted(keys - got, key=str)[:5]:
            errors.append(f"{name}: combination {k} is declared but no launcher call produced it (drive missing)")
        for k in sorted(got - keys, key=str)[:5]:
            errors.append(f"{name}: launchers produce {k}, not in the declared domain")
    if errors:
        raise SystemExit("triton_aot: enumeration incomplete:\n  " + "\n  ".join(errors))
    for name in sorted({s[0].__name__ for s in specs}):  # wide: every int argument i64 (sizes >= 2^31)
        fn, sig, cx, attrs, num_warps, key = next(s for s in specs if s[0].__name__ == name)
        wide = {p: ("i64" if t == "i32" else t) for p, t in sig.items()}
        specs.append((fn, wide, cx, attrs, num_warps, key + ((("ints", "i64"),),)))
    return specs, helpers


def cover(specs):
    """A subset in which every (kernel, constexpr value) and (kernel, pointer dtype) appears at least once."""
    chosen, covered = [], set()
    for s in specs:
        fn, key = s[0], s[5]
        items = {(fn.__name__,) + kv for part in key for kv in part}
        if not items <= covered:
            chosen.append(s)
            covered |= items
    return chosen


# --- compiling ----------------------------------------------------------------------------------------------------
_JOBS: list = []


def _compile(i):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, sig, cx, attrs, num_warps, key, cc = _JOBS[i]
    t0 = time.time()
    row = dict(kernel=fn.__name__, cc=cc, num_warps=num_warps, constexprs=cx,
               dtypes={p: t for p, t in sig.items() if t.startswith("*")}, ints=sorted({t for t in sig.values()
                                                                                      if t in ("i32", "i64")}))
    try:
        k = triton.compile(ASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", cc, 32),
                           options={"num_warps": num_warps})
        with tempfile.TemporaryDirectory() as d:
            cubin = Path(d) / "k.cubin"
            cubin.write_bytes(k.asm["cubin"])
            tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
            text = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                                  check=True).stdout
        res = parse_resource_usage(text)
        r = res.get(fn.__name__) or next(iter(res.values()))
        row.update(regs=r["REG"], shared=int(k.metadata.shared) + r.get("SHARED", 0), spills=r.get("LOCAL", 0),
                   stack=r.get("STACK", 0), num_warps=int(k.metadata.num_warps))
        row["violations"] = violations(row["regs"], row["num_warps"], row["shared"], cc) + i32_loops(k.asm["ttir"])
    except Exception as exc:  # a compile error is a finding, reported with the others
        row["error"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
    row["seconds"] = round(time.time() - t0, 2)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", type=int, nargs="+", default=[80, 90, 100])
    ap.add_argument("--select", choices=("all", "cover"), default="all")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write every compiled row here")
    ap.add_argument("--list", action="store_true", help="enumerate and check coverage only; compile nothing")
    ap.add_argument("--skip-drive", nargs="*", default=[], help=argparse.SUPPRESS)  # tests: a drive left out
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("triton_aot: run without TRITON_INTERPRET (it compiles, the interpreter does not)")
    import triton

    launches, config, tiles = _drive(set(args.skip_drive))
    specs, helpers = check_coverage(launches, config, tiles)
    chosen = specs if args.select == "all" else cover(specs)
    kernels = sorted({s[0].__name__ for s in specs})
    print(f"triton {triton.__version__}: {len(launches)} launches recorded, {len(specs)} combinations "
          f"(incl. {len(kernels)} wide) of {len(kernels)} kernels ({', '.join(kernels)}); helpers inlined: "
          f"{', '.join(sorted(helpers))}; compiling {len(chosen)} x cc {args.cc} ({args.select})", flush=True)
    if args.list:
        return 0
    _JOBS[:] = [s + (cc,) for cc in args.cc for s in chosen]
    t0 = time.time()
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            rows = pool.map(_compile, range(len(_JOBS)), chunksize=1)
    else:
        rows = [_compile(i) for i in range(len(_JOBS))]
    failed = [r for r in rows if r.get("error") or r.get("violations")]
    summary = {}
    for r in rows:
        if "regs" in r:
            s = summary.setdefault((r["kernel"], r["cc"]), dict(n=0, regs=0, shared=0, spills=0, warps=set()))
            s["n"] += 1
            s["regs"], s["shared"] = max(s["regs"], r["regs"]), max(s["shared"], r["shared"])
            s["spills"] = max(s["spills"], r["spills"])
            s["warps"].add(r["num_warps"])
    print(f"{'kernel':<20} {'cc':>4} {'variants':>8} {'max regs':>8} {'warps':>6} {'max shared':>10} {'max spills':>10}")
    for (kernel, cc), s in sorted(summary.items()):
        print(f"{kernel:<20} {cc:>4} {s['n']:>8} {s['regs']:>8} {','.join(map(str, sorted(s['warps']))):>6} "
              f"{s['shared']:>10} {s['spills']:>10}")
    for r in failed:
        print(f"FAILED {r['kernel']} sm_{r['cc']} {r['constexprs']} {r['dtypes']}: "
              f"{r.get('error') or '; '.join(r['violations'])}")
    print(f"triton {triton.__version__}: compiled {len(rows) - len(failed)}/{len(rows)} in {time.time() - t0:.0f} s "
          f"({args.jobs} processes)")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(triton=triton.__version__, rows=rows), indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
