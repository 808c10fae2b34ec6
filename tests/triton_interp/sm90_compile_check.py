"""Compile every Triton pack kernel for a real GPU target (sm_90 PTX + cubin via triton's bundled
ptxas), as the launches of the public ops specialise them, without a GPU: the interpreter runs the
numerics but never type-checks the kernels the way the compiler does.

Run in a process WITHOUT TRITON_INTERPRET (tests/test_triton_interpreted.py does). Each launch the ops
make is intercepted: its arguments are specialised exactly as ``JITFunction.run`` would (ints equal
to 1 become constexprs, alignment attributes, ...) and the kernel is compiled instead of run.
Prints one line per distinct compiled specialisation and "COMPILED <n>"; then checks the fake impls
and AOT autograd's decomposition of every op into its kernel launches ("TRACED <n> ...").
"""
from __future__ import annotations

import os
import sys

assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from packkit.triton_kernels import common, layout, pack_batch, unpack  # noqa: E402
from packkit.triton_kernels import pack as P  # noqa: E402

FAMILIES = (layout, P, pack_batch, unpack)

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)
_seen: dict = {}


class _Compiler:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            fn = self.kernel
            binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
            bound_args, specialization, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = fn._pack_args(BACKEND, kwargs, bound_args, specialization,
                                                                  options)
            key = (fn.__name__, str(signature), str(constexprs), str(attrs))
            if key not in _seen:
                compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                                          options=options.__dict__)
                _seen[key] = compiled
                consts = {k: v for k, v in constexprs.items()}
                print(f"{fn.__name__}: ptx {len(compiled.asm['ptx'])} chars, constexprs {consts}", flush=True)
        return launch


def main() -> int:
    try:
        BACKEND.parse_options({})
        for family in FAMILIES:  # each op family module launches through its own wrap_triton
            family.wrap_triton = _Compiler
    except Exception as exc:  # triton internals moved: the harness, not the kernels, is at fault
        print(f"HARNESS UNSUPPORTED: {exc!r}")
        return 77
    common._interpreting = lambda: True  # CPU tensors stand in for device tensors; nothing runs
    i64 = dict(dtype=torch.int64)
    i32 = dict(dtype=torch.int32)
    seg_length = torch.tensor([3, 2, 4], **i64)
    # layout: padded, flat, one row (num_rows specialised to 1), no segments (several args == 1)
    for flat, rows, row_len, bins in ((False, 4, 8, [0, 2, 3]), (True, 1, 12, [0, 2, 3]),
                                      (False, 1, 16, [0, 3]), (False, 3, 1, [0])):
        sl = seg_length if bins[-1] else seg_length[:0]
        P.layout(sl, torch.tensor(bins, **i64), rows, row_len, flat, 2)
    offs = torch.tensor([0, 3, 9], **i64)
    seg_seq, seg_start = torch.tensor([0, 1, 1], **i64), torch.tensor([0, 0, 2], **i64)
    cu, cu_seg = torch.tensor([0, 3, 5, 8], **i32), torch.tensor([0, 1, -1], **i32)
    # Every word width (bool -> int8, bfloat16 -> int16, int32, int64, complex128 -> 2 x int64), records
    # of one word (F specialised to 1) and of several.
    for dtype in (torch.bool, torch.bfloat16, torch.int32, torch.int64, torch.complex128):
        for feature in ((), (3,)):
            src = torch.zeros((9,) + feature, dtype=dtype)
            firsts = (None, 1.0) if dtype in (torch.int64, torch.complex128) else (None,)
            for first in firsts:
                P.pack(src, offs, seg_seq, seg_start, cu, cu_seg, 2, 4, False, 1.0, first)
            packed = torch.zeros((2, 4) + feature, dtype=dtype)
            P.unpack(packed, offs, seg_seq, seg_start, cu, cu_seg, False, 9, 0.0)
            P.unpack_padded(packed, seg_seq, seg_start, cu, cu_seg, False, 2, 6, 1.0)
    for ids_dtype, lab_dtype in ((torch.int64, None), (torch.int32, torch.int64)):
        ids = torch.zeros(9, dtype=ids_dtype)
        labels = None if lab_dtype is None else torch.zeros(9, dtype=lab_dtype)
        for kw in (dict(), dict(pad_id=1, ignore_index=1, position_start=1, mask_first_label=False)):
            P.pack_batch(ids, labels, offs, seg_seq, seg_start, seg_length, torch.tensor([0, 2, 3], **i64), 2, 8,
                         False, 4, **kw)
    # The context-parallel kernel (triton_kernels/context_parallel.py): both modes, int64/int32 ids and labels.
    from packkit.triton_kernels import context_parallel as CP

    CP.wrap_triton = _Compiler
    CP._interpreting = lambda: True
    cp_cu, cp_cup = torch.tensor([0, 3, 9], **i32), torch.tensor([0, 4, 12], **i32)
    for ids_dtype, lab_dtype in ((torch.int64, torch.int64), (torch.int32, torch.int64), (torch.int32, torch.int32)):
        for zigzag in (True, False):
            CP.cp_shard(torch.zeros(9, dtype=ids_dtype), torch.zeros(9, dtype=lab_dtype), torch.zeros(9, **i64), cp_cu,
                        cp_cup if zigzag else cp_cu, 2, 1, zigzag, 6 if zigzag else 5, 0, -100)
            # Fused pack + shard (seg_src over the unpacked source), with and without a first label.
            for first in (None, -100):
                CP.cp_shard(torch.zeros(11, dtype=ids_dtype), torch.zeros(11, dtype=lab_dtype), None, cp_cu,
                            cp_cup if zigzag else cp_cu, 2, 1, zigzag, 6 if zigzag else 5, 0, -100,
                            torch.tensor([2, -1], **i64), 1, first)
    # The shared-prefix kernel (triton_kernels/tree_pack.py): int64/int32 ids, labels or not.
    from packkit.triton_kernels import tree_pack as TP

    TP.wrap_triton = _Compiler
    TP._interpreting = lambda: True
    nodes = [torch.tensor(v, **i64) for v in ([0, 3], [0, 8], [3, 4], [0, 0], [3, 4])]
    for ids_dtype, lab_dtype in ((torch.int64, None), (torch.int32, torch.int64)):
        labels = None if lab_dtype is None else torch.zeros(9, dtype=lab_dtype)
        TP.tree_pack(torch.zeros(9, dtype=ids_dtype), labels, *nodes, torch.tensor([0, 1, 2], **i64), 2, 8)
    print(f"COMPILED {len(_seen)}")
    trace_checks()
    return 0


class _StopAfterTrace(Exception):
    pass


def trace_checks() -> None:
    """What torch.compile relies on, checked without running a kernel: the ops' fake impls (the
    functions themselves under FakeTensorMode: shapes, dtypes, pad bit patterns made outside the fake
    mode) and AOT autograd's functional decomposition into triton_kernel_wrapper_functional nodes."""
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode

    logging.getLogger("torch._higher_order_ops.triton_kernel_wrap").setLevel(logging.ERROR)
    for family in FAMILIES:
        family.wrap_triton = torch.library.wrap_triton
    i64, i32 = dict(dtype=torch.int64), dict(dtype=torch.int32)
    args = dict(offs=torch.tensor([0, 3, 9], **i64), seg_seq=torch.tensor([0, 1, 1], **i64),
                seg_start=torch.tensor([0, 0, 2], **i64), seg_length=torch.tensor([3, 2, 4], **i64),
                bins=torch.tensor([0, 2, 3], **i64), cu=torch.tensor([0, 3, 5, 8], **i32),
                cu_seg=torch.tensor([0, 1, -1], **i32), src=torch.zeros(9, 2, dtype=torch.bfloat16),
                ids=torch.zeros(9, dtype=torch.int32))

    def ops(a):
        ids, labels, pos, seq_idx, cu = P.pack_batch(a["ids"], None, a["offs"], a["seg_seq"], a["seg_start"],
                                                     a["seg_length"], a["bins"], 2, 8, False, 4)
        lay = P.layout(a["seg_length"], a["bins"], 1, 12, True, 4)
        packed = P.pack(a["src"], a["offs"], a["seg_seq"], a["seg_start"], a["cu"], a["cu_seg"], 2, 4, False, -0.0,
                        None)
        back = P.unpack(packed, a["offs"], a["seg_seq"], a["seg_start"], a["cu"], a["cu_seg"], False, 9, 1.5)
        padded = P.unpack_padded(packed, a["seg_seq"], a["seg_start"], a["cu"], a["cu_seg"], False, 2, 6, 1.5)
        return ids, labels, pos, seq_idx, cu, *lay, packed, back, padded

    with FakeTensorMode() as mode:
        out = ops({k: mode.from_tensor(v) for k, v in args.items()})
    got = [(tuple(t.shape), t.dtype) for t in out]
    want = [((2, 8), torch.int32), ((2, 8), torch.int32), ((2, 8), torch.int64), ((2, 8), torch.int32),
            ((4,), torch.int32), ((4,), torch.int32), ((3,), torch.int32), ((2, 4, 2), torch.bfloat16),
            ((9, 2), torch.bfloat16), ((2, 6, 2), torch.bfloat16)]
    assert got == want, got

    targets = aot_targets(ops, args)
    launches = targets.count("triton_kernel_wrapper_functional")
    # pack_batch 2 + layout 1 + pack 1 + unpack 2 + unpack_padded 2
    assert launches == 8, targets
    assert not any("packkit" in t for t in targets), targets
    launches += trace_out_variants(args)
    print(f"TRACED {launches} kernel launches")


def aot_targets(ops, args: dict) -> list:
    """The call targets of the forward graph AOT autograd makes of ``ops(args)`` (traced, never run)."""
    from torch._functorch.aot_autograd import aot_function

    graphs = []

    def compiler(gm, _):
        graphs.append(gm)
        raise _StopAfterTrace

    names = list(args)
    try:
        aot_function(lambda *xs: ops(dict(zip(names, xs))), fw_compiler=compiler)(*args.values())
    except _StopAfterTrace:
        pass
    assert graphs, "AOT autograd produced no graph"
    return [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]


def trace_out_variants(args) -> int:
    """The out-variants the same way: under FakeTensorMode they run (output checks included) without
    a kernel, and AOT autograd turns them into the same kernel launches plus copies back into the
    caller's buffers (functionalised mutation)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    i64, i32, bf16 = dict(dtype=torch.int64), dict(dtype=torch.int32), dict(dtype=torch.bfloat16)
    outs = dict(o_ids=torch.empty(2, 8, **i32), o_lab=torch.empty(2, 8, **i32), o_pos=torch.empty(2, 8, **i64),
                o_doc=torch.empty(2, 8, **i32), o_cu=torch.empty(4, **i32), o_seg=torch.empty(3, **i32),
                l_cu=torch.empty(4, **i32), l_seg=torch.empty(3, **i32), packed=torch.empty(2, 4, 2, **bf16),
                back=torch.empty(9, 2, **bf16), padded=torch.empty(2, 6, 2, **bf16))
    every = {**args, **outs}

    def ops(a):
        P.pack_batch_out(a["ids"], None, a["offs"], a["seg_seq"], a["seg_start"], a["seg_length"], a["bins"], False,
                         a["o_ids"], a["o_lab"], a["o_pos"], a["o_doc"], a["o_cu"], a["o_seg"])
        P.layout_out(a["seg_length"], a["bins"], 1, 12, True, a["l_cu"], a["l_seg"])
        P.pack_out(a["src"], a["offs"], a["seg_seq"], a["seg_start"], a["cu"], a["cu_seg"], False, a["packed"], -0.0,
                   None)
        P.unpack_out(a["packed"], a["offs"], a["seg_seq"], a["seg_start"], a["cu"], a["cu_seg"], False, a["back"], 1.5)
        P.unpack_padded_out(a["packed"], a["seg_seq"], a["seg_start"], a["cu"], a["cu_seg"], False, a["padded"], 1.5)
        return tuple(a[k] for k in outs)

    with FakeTensorMode() as mode:
        ops({k: mode.from_tensor(v) for k, v in every.items()})

    targets = aot_targets(ops, every)
    launches = targets.count("triton_kernel_wrapper_functional")
    assert launches == 8, targets  # the same launches as the functional ops
    assert not any("packkit" in t for t in targets), targets
    return launches


if __name__ == "__main__":
    sys.exit(main())
