"""Shared by the Triton op families: tile sizes, the device helpers that locate a packed position's
segment and source row, and the host conversions of values and tensors to raw integer words
(metadata only: nothing reads a device value back to the host)."""
from __future__ import annotations

import contextlib
import struct
import torch

from torch._subclasses.fake_tensor import is_fake

# The guarded triton import of the whole package: the op modules take triton/tl from here.
try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - exercised only without triton
    raise ImportError(
        "packkit.triton_kernels needs Triton (pip install 'packkit[triton]', or triton>=3.3)"
    ) from exc


# Tile sizes. BLOCK: elements per program in the gather/scatter kernels (positions x features);
# LAYOUT_BLOCK: items per step of the single layout program. Tests shrink them to cover many tiles.
_CONFIG = {"block": 2048, "layout_block": 1024, "max_block_f": 1024, "num_warps": 4}

_INT32_MAX = 2**31 - 1
# Grid limits a device enforces (cudaLaunchKernel refuses more): grid.x, and grid.y / grid.z.
_GRID_X_MAX = 2**31 - 1
_GRID_YZ_MAX = 65535


def _device_guard(t: torch.Tensor):
    """The context a launch over ``t`` runs in: ``t``'s CUDA device made current (Triton launches on the
    current device and its stream, not the tensors'; cheap, no sync). Nothing for CPU tensors (the
    interpreter) and for fake tensors (tracing: no launch happens, the compiled graph guards itself)."""
    if t.device.type != "cuda" or is_fake(t):
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)


def _grid_1d(op: str, work: int, block: int) -> tuple:
    """The 1-D grid covering ``work`` items, ``block`` per program; a ValueError past grid.x's limit."""
    programs = -(-int(work) // int(block))
    if programs > _GRID_X_MAX:
        raise ValueError(f"packkit::triton_{op}: {work} items need {programs} programs of {block}, more than the "
                         f"{_GRID_X_MAX} a grid may have")
    return (programs,)


@triton.jit
def _i64(x):
    """x as an int64 scalar: loop bounds and indices that may reach 2^31 (an i32 loop counter wraps)."""
    return tl.full([], 0, tl.int64) + x


@triton.jit
def _pow2_at_least(n, cap: tl.constexpr):
    """Smallest power of two >= min(n, cap) (and >= 1), as an int32 scalar."""
    top = tl.full([], 1, tl.int32)
    while (top < n) & (top < cap):
        top = top * 2
    return top


@triton.jit
def _locate(cu_ptr, cu_seg_ptr, seg_seq_ptr, seg_start_ptr, p, p_ok, num_out, num_segments, num_sequences):
    """Output segment k of each position p (last k with cu[k] <= p), its plan segment j (-1: padding
    or invalid), the offset of p in its segment, and the segment's sequence and start."""
    top = _pow2_at_least(num_out, 1 << 30)
    k = tl.zeros_like(p)
    step = top
    while step > 0:
        cand = k + step
        in_range = cand < num_out
        c = tl.load(cu_ptr + cand, mask=in_range, other=0)
        k = tl.where(in_range & (c <= p), cand, k)
        step = step // 2
    k_ok = p_ok & (k < num_out)
    seg_begin = tl.load(cu_ptr + k, mask=k_ok, other=0)
    j = tl.load(cu_seg_ptr + k, mask=k_ok, other=-1)
    is_seg = k_ok & (j >= 0) & (j < num_segments)
    seq = tl.load(seg_seq_ptr + j, mask=is_seg, other=0)
    seg_start = tl.load(seg_start_ptr + j, mask=is_seg, other=0)
    seq_ok = is_seg & (seq >= 0) & (seq < num_sequences)
    off = (p - seg_begin).to(tl.int64)
    return k, is_seg, seq_ok, seq, seg_start, off


@triton.jit
def _source_rows(src_offsets_ptr, p, p_ok, cu_ptr, cu_seg_ptr, seg_seq_ptr, seg_start_ptr, num_out, num_segments,
                 num_sequences, num_src_tokens):
    """For each packed position: its output segment k, offset in the segment, whether it is a real
    segment's token, and its source row (valid where src_ok)."""
    k, is_seg, seq_ok, seq, seg_start, off = _locate(cu_ptr, cu_seg_ptr, seg_seq_ptr, seg_start_ptr, p, p_ok,
                                                     num_out, num_segments, num_sequences)
    base = tl.load(src_offsets_ptr + seq, mask=seq_ok, other=0)
    src_row = base + seg_start + off
    src_ok = seq_ok & (src_row >= 0) & (src_row < num_src_tokens)
    return k, off, is_seg, src_ok, src_row


@triton.jit
def _pattern(w0, w1, f, WORDS: tl.constexpr, dtype: tl.constexpr):
    """The pad/first pattern for word f of a token record (16-byte dtypes alternate two words)."""
    v0 = w0.to(dtype)
    if WORDS == 2:
        return tl.where((f % 2) == 0, v0, w1.to(dtype))
    else:
        return v0 + tl.zeros_like(f).to(dtype)


_WORD_DTYPES = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}


def _interpreting() -> bool:
    """Whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 when triton was imported)."""
    return type(_locate).__name__ == "InterpretedFunction"


def _words(op: str, t: torch.Tensor, name: str):
    """A contiguous tensor as a flat tensor of same-width integers, and the words per element."""
    size = t.element_size()
    if size not in _WORD_DTYPES:
        raise TypeError(f"packkit::triton_{op}: {name} has dtype {t.dtype} ({size}-byte elements); supported "
                        "element sizes are 1, 2, 4, 8 and 16 bytes")
    try:
        flat = t.reshape(-1).view(_WORD_DTYPES[size])
    except RuntimeError as exc:
        raise TypeError(f"packkit::triton_{op}: cannot view {name} ({t.dtype}) as raw words: {exc}") from exc
    return flat, (2 if size == 16 else 1)


def _no_dispatch_modes():
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    return _disable_current_modes()


_PATTERN_CACHE: dict = {}


def _value_words(op: str, value: float, dtype: torch.dtype, name: str):
    """The bits of ``value`` converted to ``dtype`` by torch (``torch.full((1,), value, dtype=dtype)``, as
    the C++ ops and the reference do), as two signed integers (the second only for 16-byte dtypes).
    Computed on the host from a Python number, outside any fake/functional mode, so it works while
    torch.compile traces the op."""
    value = float(value)
    key = (struct.pack("<d", value), dtype)
    words = _PATTERN_CACHE.get(key)
    if words is None:
        with _no_dispatch_modes():
            try:
                one = torch.full((1,), value, dtype=dtype, device="cpu")
            except RuntimeError as exc:
                raise ValueError(f"packkit::triton_{op}: {name} = {value!r} cannot be converted to {dtype}: "
                                 f"{exc}") from exc
            raw = bytes(one.view(torch.uint8).numpy().tobytes())
        size = len(raw)
        width = 8 if size == 16 else size
        w0 = int.from_bytes(raw[:width], "little", signed=True)
        w1 = int.from_bytes(raw[width:], "little", signed=True) if size == 16 else 0
        words = (w0, w1)
        if len(_PATTERN_CACHE) < 4096:
            _PATTERN_CACHE[key] = words
    return words


def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _tiles(features: int):
    """(BLOCK_P, BLOCK_F) for records of `features` words."""
    block = _CONFIG["block"]
    block_f = min(_next_pow2(max(features, 1)), _CONFIG["max_block_f"], block)
    return max(block // block_f, 1), block_f
