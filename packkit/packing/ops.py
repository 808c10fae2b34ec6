"""Loads packkit's torch op library and registers the Python fake (meta) implementations.

Op schemas are defined once, in ``csrc/torch_bindings.cpp``; this module only adds what torch.compile
and FakeTensor need to trace through them.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from .. import _planner

# Compiled libraries sit beside the _planner extension (in site-packages, also for editable installs).
_HERE = Path(_planner.__file__).resolve().parent
torch.ops.load_library(str(_HERE / "_ops.so"))


def _load_cuda_kernels():
    """(loaded, why not). CUDA kernels live in their own library: it needs libtorch_cuda, which a CPU torch lacks.
    One that is there but does not load (built for another torch or CUDA: an undefined symbol, a missing library)
    costs the CUDA kernels, never ``import packkit``: ``backend="auto"`` then takes Triton, else the CPU ops.
    ``PACKKIT_OPS_CUDA_SO`` names another file to load, on any torch build (tests plant a broken one)."""
    planted = os.environ.get("PACKKIT_OPS_CUDA_SO")
    path = Path(planted) if planted else _HERE / "_ops_cuda.so"
    if not planted and not (torch.version.cuda and path.exists()):
        return False, "not built" if not path.exists() else "torch is a CPU build"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:
        cause = e.__cause__ or e.__context__  # torch's message names the file; the loader's says why
        error = f"{type(e).__name__}: {e}" + (f" ({cause})" if cause is not None and str(cause) not in str(e) else "")
        why = f"{path.name} did not load: {error}"
        warnings.warn(f"packkit: {path} did not load ({error}); the CUDA kernels are disabled, "
                      f"backend='auto' uses the Triton kernels, else the CPU ops. Rebuild or reinstall packkit for "
                      f"this torch ({torch.__version__}); `packkit info` shows the build record", RuntimeWarning)
        return False, why
    return True, None


HAS_CUDA_KERNELS, CUDA_LOAD_ERROR = _load_cuda_kernels()


def has_cuda_kernels() -> bool:
    """Whether ``_ops_cuda.so`` is loaded (read at call time, so a test can patch ``HAS_CUDA_KERNELS``)."""
    return HAS_CUDA_KERNELS


def cuda_kernels_status() -> str:
    """Why the CUDA kernels are not loaded (or "loaded")."""
    return "loaded" if HAS_CUDA_KERNELS else CUDA_LOAD_ERROR or "not loaded"


@torch.library.register_fake("packkit::plan")
def _plan_fake(lengths, capacity, algorithm="obfd", overlong="error", dp_size=1, cost_a=1.0, cost_b=0.0):
    torch._check(lengths.dim() == 1, lambda: "packkit::plan: lengths must be 1-D")
    ctx = torch.library.get_ctx()
    num_segments = ctx.new_dynamic_size()  # "split" can make more segments than sequences
    num_offsets = ctx.new_dynamic_size(min=1)  # num_bins + 1 (a plain symbol, so it binds to the output)
    seg_seq = lengths.new_empty((num_segments,), dtype=torch.int64)
    return seg_seq, torch.empty_like(seg_seq), torch.empty_like(seg_seq), lengths.new_empty((num_offsets,), dtype=torch.int64)


# --- Pack op family: output sizes follow from int arguments and input shapes ---------------------
def _packed_shape(num_rows, row_len, flat):
    return (row_len,) if flat else (num_rows, row_len)


@torch.library.register_fake("packkit::layout")
def _layout_fake(seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens):
    torch._check(num_cu_seqlens >= 1, lambda: "packkit::layout: num_cu_seqlens must be >= 1")
    cu = seg_length.new_empty((num_cu_seqlens,), dtype=torch.int32)
    return cu, seg_length.new_empty((num_cu_seqlens - 1,), dtype=torch.int32)


@torch.library.register_fake("packkit::pack")
def _pack_fake(src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, num_rows, row_len, flat, pad_value=0.0,
               first_value=None):
    return src.new_empty((*_packed_shape(num_rows, row_len, flat), *src.shape[1:]))


@torch.library.register_fake("packkit::pack_batch")
def _pack_batch_fake(input_ids, labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, num_rows, row_len,
                     flat, num_cu_seqlens, pad_id=0, ignore_index=-100, mask_first_label=True, position_start=0):
    shape = _packed_shape(num_rows, row_len, flat)
    label_src = input_ids if labels is None else labels
    return (input_ids.new_empty(shape), label_src.new_empty(shape), input_ids.new_empty(shape, dtype=torch.int64),
            input_ids.new_empty(shape, dtype=torch.int32), input_ids.new_empty((num_cu_seqlens,), dtype=torch.int32))


@torch.library.register_fake("packkit::unpack")
def _unpack_fake(packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, num_src_tokens, pad_value=0.0):
    return packed.new_empty((num_src_tokens, *packed.shape[1 if flat else 2:]))


@torch.library.register_fake("packkit::unpack_padded")
def _unpack_padded_fake(packed, seg_seq, seg_start, cu_seqlens, cu_seg, flat, num_sequences, max_len, pad_value=0.0):
    return packed.new_empty((num_sequences, max_len, *packed.shape[1 if flat else 2:]))


# The out-variants (packkit::layout_out, pack_out, pack_batch_out, unpack_out, unpack_padded_out) mutate
# their Tensor(a!) outputs and return nothing: torch traces such ops without a fake impl (opcheck passes
# on every one, tests/test_pack_out_ops.py), and torch.compile functionalises the mutation.


# --- Context parallelism (packkit.context_parallel): sizes from the host int out_len ----------------
@torch.library.register_fake("packkit::cp_shard")
def _cp_shard_fake(input_ids, labels, position_ids, cu_seqlens, cu_seqlens_padded, cp_size, cp_rank, zigzag, out_len,
                   pad_id=0, ignore_index=-100, seg_src=None, position_start=0, first_label=None):
    # Fused (seg_src): input_ids/labels are the unpacked source; the outputs are still out_len long.
    torch._check(out_len >= 0, lambda: "packkit::cp_shard: out_len must be >= 0")
    return (input_ids.new_empty((out_len,)), labels.new_empty((out_len,)), labels.new_empty((out_len,)),
            input_ids.new_empty((out_len,), dtype=torch.int64), input_ids.new_empty((out_len,), dtype=torch.int64),
            input_ids.new_empty((out_len,), dtype=torch.int32))


# --- Shared-prefix (tree) packing (packkit.shared_prefix): sizes from host ints and the node count -----------
@torch.library.register_fake("packkit::tree_pack")
def _tree_pack_fake(input_ids, labels, node_src, node_dst, node_len, node_pos, node_end, row_offsets, num_rows,
                    row_len, pad_id=0, ignore_index=-100):
    torch._check(num_rows >= 0 and row_len >= 0, lambda: "packkit::tree_pack: num_rows and row_len must be >= 0")
    shape = (num_rows, row_len)
    label_src = input_ids if labels is None else labels
    return (input_ids.new_empty(shape), label_src.new_empty(shape), input_ids.new_empty(shape, dtype=torch.int64),
            input_ids.new_empty(shape, dtype=torch.int32), input_ids.new_empty(shape, dtype=torch.int32),
            input_ids.new_empty((node_src.shape[0] + num_rows + 1,), dtype=torch.int32))
