"""Compile every Triton pack kernel for a real GPU target (sm_90 PTX + cubin via triton's bundled
ptxas), as the launches of the public ops specialise them, without a GPU: the interpreter runs the
numerics but never type-checks the kernels the way the compiler does.

Run in a process WITHOUT TRITON_INTERPRET (tests/test_triton_interpreted.py does). Each launch the ops
make is intercepted: its arguments are specialised exactly as ``JITFunction.run`` would (ints equal
to 1 become constexprs, alignment attributes, ...) and the kernel is compiled instead of run.
Prints one line per distinct compiled specialisation and "COMPILED <n>" at the end.
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

from packkit.triton_kernels import pack as P  # noqa: E402

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
        P.wrap_triton = _Compiler
    except Exception as exc:  # triton internals moved: the harness, not the kernels, is at fault
        print(f"HARNESS UNSUPPORTED: {exc!r}")
        return 77
    P._interpreting = lambda: True  # CPU tensors stand in for device tensors; nothing runs
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
    print(f"COMPILED {len(_seen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
