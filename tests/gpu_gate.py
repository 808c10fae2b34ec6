"""Which device backends this machine can test, and the skip markers every GPU test uses.

Skip reasons of GPU tests carry REQUIRED_TAG. tests/conftest.py turns such a skip into a failure when
PACKKIT_REQUIRE_GPU=1 (tests/gpu/run.sh sets it on a CUDA machine): there, a GPU test that does not
run is a path that went unproven. Skips for other reasons (a second GPU, an optional package) stay
skips and are listed in the run's summary.
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import packkit

REQUIRED_TAG = "[gpu-required]"

CUDA = torch.cuda.is_available()
CUDA_KERNELS = CUDA and packkit.packing.ops.HAS_CUDA_KERNELS
# Compiled Triton on the GPU (the interpreter is tested in tests/triton_interp, in its own process).
TRITON_GPU = CUDA and importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") != "1"

needs_cuda = pytest.mark.skipif(not CUDA, reason=f"{REQUIRED_TAG} needs a CUDA GPU")
needs_cuda_kernels = pytest.mark.skipif(
    not CUDA_KERNELS, reason=f"{REQUIRED_TAG} needs a CUDA GPU and packkit's CUDA kernels (_ops_cuda.so)")
needs_triton_gpu = pytest.mark.skipif(not TRITON_GPU, reason=f"{REQUIRED_TAG} needs a CUDA GPU and triton")


def on(backend: str) -> str:
    """The torch device of a backend name ("cpu", "cuda" or "triton")."""
    return "cpu" if backend == "cpu" else "cuda"


def ops_for(backend: str):
    """The pack-op family of a backend, as an object with layout/pack/pack_batch/unpack/unpack_padded."""
    if backend != "triton":
        return torch.ops.packkit
    from packkit.triton_kernels import pack as _registers  # noqa: F401  (packkit::triton_*)

    class _Triton:
        def __getattr__(self, name):
            return getattr(torch.ops.packkit, "triton_" + name)

    return _Triton()
