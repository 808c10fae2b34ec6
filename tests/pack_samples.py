"""One generator of pack-op inputs feeding every pack test (CPU, CUDA, opcheck, compile).

A case is a random plan (any algorithm/over-long policy, so split pieces, dropped and zero-length
sequences, empty rows) laid out flat or padded, with a source tensor of some dtype and feature shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

import packkit

DTYPES = (torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.float16, torch.bool, torch.uint8,
          torch.complex64)
FEATURES = ((), (3,), (2, 2))


@dataclass
class PackCase:
    lengths: np.ndarray
    plan: packkit.Plan
    flat: bool
    num_rows: int
    row_len: int
    layout: packkit.PackLayout
    src: torch.Tensor  # [sum(lengths), *feature]
    src_offsets: torch.Tensor
    seg_seq: torch.Tensor
    seg_start: torch.Tensor
    seg_length: torch.Tensor
    bin_offsets: torch.Tensor
    extra: dict = field(default_factory=dict)

    def to(self, device) -> "PackCase":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return PackCase(**moved)

    @property
    def plan_tensors(self):
        return self.seg_seq, self.seg_start, self.seg_length, self.bin_offsets


def random_source(rng: np.random.Generator, tokens: int, dtype: torch.dtype, feature=()) -> torch.Tensor:
    shape = (tokens, *feature)
    if dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, shape).astype(bool))
    if dtype.is_complex:
        return torch.from_numpy((rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64))
    if dtype.is_floating_point:
        return torch.from_numpy(rng.normal(size=shape).astype(np.float32)).to(dtype)
    high = 255 if dtype == torch.uint8 else 50_000
    return torch.from_numpy(rng.integers(0, high, shape)).to(dtype)


def make_case(seed: int, *, dtype=torch.int64, feature=(), flat=None, max_len: int = 40, max_seqs: int = 12,
              algorithm=None, overlong=None, extra_rows=None, extra_tail=None) -> PackCase:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, max_seqs + 1))
    lengths = rng.integers(0, max_len + 1, n).astype(np.int64)
    capacity = int(rng.integers(4, max_len + 8))
    algorithm = algorithm or str(rng.choice(packkit.ALGORITHMS))
    overlong = overlong or str(rng.choice(["split", "drop", "truncate"]))
    dp = int(rng.integers(1, 4)) if algorithm == "ogbfd" else 1
    plan = packkit.plan(lengths, capacity, algorithm=algorithm, overlong=overlong, dp_size=dp)
    flat = bool(rng.integers(0, 2)) if flat is None else flat
    if flat:
        extra_tail = int(rng.integers(0, 4)) if extra_tail is None else extra_tail
        layout = packkit.pack_layout(plan.segments, flat=True, row_len=plan.kept_tokens + extra_tail)
    else:
        extra_rows = int(rng.integers(0, 3)) if extra_rows is None else extra_rows
        layout = packkit.pack_layout(plan.segments, flat=False, row_len=capacity, num_rows=plan.num_bins + extra_rows)
    src = random_source(rng, int(lengths.sum()), dtype, feature)
    segs = [torch.from_numpy(np.array(a)) for a in plan.segments]
    return PackCase(lengths, plan, flat, layout.num_rows, layout.row_len, layout, src,
                    torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)), *segs)


def sample_cases(count: int = 6):
    """A fixed spread for opcheck/compile: both layouts, several dtypes and feature shapes."""
    specs = [dict(flat=True), dict(flat=False), dict(flat=False, dtype=torch.float32, feature=(3,)),
             dict(flat=True, dtype=torch.bfloat16, feature=(2, 2)), dict(flat=False, dtype=torch.int32),
             dict(flat=False, extra_rows=2, overlong="split")]
    return [make_case(100 + i, max_seqs=8, **specs[i % len(specs)]) for i in range(count)]
