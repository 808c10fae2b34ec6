"""Loads packkit's torch op library and registers the Python fake (meta) implementations.

Op schemas are defined once, in ``csrc/torch_bindings.cpp``; this module only adds what torch.compile
and FakeTensor need to trace through them.
"""
from __future__ import annotations

from pathlib import Path

import torch

from . import _planner

# Compiled libraries sit beside the _planner extension (in site-packages, also for editable installs).
_HERE = Path(_planner.__file__).resolve().parent
torch.ops.load_library(str(_HERE / "_ops.so"))
# CUDA kernels live in their own library: it needs libtorch_cuda, which a CPU torch lacks.
if torch.version.cuda and (_HERE / "_ops_cuda.so").exists():
    torch.ops.load_library(str(_HERE / "_ops_cuda.so"))

HAS_CUDA_KERNELS = bool(torch.version.cuda) and (_HERE / "_ops_cuda.so").exists()


@torch.library.register_fake("packkit::plan")
def _plan_fake(lengths, capacity, algorithm="obfd", overlong="error", dp_size=1, cost_a=1.0, cost_b=0.0):
    torch._check(lengths.dim() == 1, lambda: "packkit::plan: lengths must be 1-D")
    ctx = torch.library.get_ctx()
    num_segments = ctx.new_dynamic_size()  # "split" can make more segments than sequences
    num_offsets = ctx.new_dynamic_size(min=1)  # num_bins + 1 (a plain symbol, so it binds to the output)
    seg_seq = lengths.new_empty((num_segments,), dtype=torch.int64)
    return seg_seq, torch.empty_like(seg_seq), torch.empty_like(seg_seq), lengths.new_empty((num_offsets,), dtype=torch.int64)
