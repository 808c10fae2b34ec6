"""Inconsistent plans for the raw pack ops: one generator feeding the CPU, Triton and CUDA safety tests.

A consistent case from ``pack_samples.make_case`` gets one to three perturbations: an entry of
src_offsets, seg_seq, seg_start, seg_length, bin_offsets, cu_seqlens or cu_seg moved by a small or
huge amount (up to +-2^62), num_cu_seqlens off by a few, or the source cut short. Some perturbations
leave the plan consistent (a start moved inside its sequence); the tests treat those like any other
consistent plan (outputs must equal the reference).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pack_reference import reference_layout
from pack_samples import make_case

FIELDS = ("src_offsets", "seg_seq", "seg_start", "seg_length", "bin_offsets", "cu_seqlens", "cu_seg",
          "num_cu_seqlens", "src")
HUGE = (2**31, 2**40, 2**62, -(2**31), -(2**40), -(2**62))


@dataclass
class BadCase:
    src: torch.Tensor
    src_offsets: torch.Tensor
    seg_seq: torch.Tensor
    seg_start: torch.Tensor
    seg_length: torch.Tensor
    bin_offsets: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seg: torch.Tensor
    num_rows: int
    row_len: int
    flat: bool
    num_cu_seqlens: int
    changes: list

    def to(self, device) -> "BadCase":
        return BadCase(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()})

    @property
    def plan_args(self):
        """The arguments of check_plan for both op families."""
        return dict(num_rows=self.num_rows, row_len=self.row_len, flat=self.flat, num_cu_seqlens=self.num_cu_seqlens,
                    cu_seqlens=self.cu_seqlens, cu_seg=self.cu_seg, num_src_tokens=self.src.shape[0])


def _delta(rng: np.random.Generator) -> int:
    if rng.random() < 0.3:
        return int(rng.choice(HUGE))
    d = int(rng.integers(-3, 4))
    return d or 1


def bad_case(seed: int, *, max_seqs: int = 10, max_len: int = 24) -> BadCase:
    rng = np.random.default_rng(seed)
    case = make_case(seed, max_seqs=max_seqs, max_len=max_len, dtype=torch.int64)
    cu, cu_seg = reference_layout(case.seg_length, case.bin_offsets, case.num_rows, case.row_len, case.flat)
    t = dict(src=case.src.clone(), src_offsets=case.src_offsets.clone(), seg_seq=case.seg_seq.clone(),
             seg_start=case.seg_start.clone(), seg_length=case.seg_length.clone(), bin_offsets=case.bin_offsets.clone(),
             cu_seqlens=cu.clone(), cu_seg=cu_seg.clone())
    num_cu = case.layout.num_cu_seqlens
    changes = []
    for _ in range(int(rng.integers(1, 4))):
        field = str(rng.choice(FIELDS))
        if field == "num_cu_seqlens":
            num_cu = max(1, num_cu + int(rng.integers(-2, 3)))
            changes.append(("num_cu_seqlens", num_cu))
            continue
        if field == "src":
            cut = int(rng.integers(0, t["src"].shape[0] + 1))
            t["src"] = t["src"][:cut].clone()
            changes.append(("src", cut))
            continue
        target = t[field]
        if target.numel() == 0:
            continue
        i = int(rng.integers(0, target.numel()))
        if field == "cu_seg":
            value = int(rng.integers(-3, case.seg_seq.numel() + 3))
        elif field in ("cu_seqlens",):
            value = int(np.clip(int(target[i]) + _delta(rng), -(2**31), 2**31 - 1))
        elif field == "seg_seq" and rng.random() < 0.5:
            value = int(rng.integers(-2, len(case.lengths) + 2))
        else:
            value = int(np.clip(int(target[i]) + _delta(rng), -(2**63), 2**63 - 1))
        target[i] = value
        changes.append((field, i, value))
    return BadCase(**t, num_rows=case.num_rows, row_len=case.row_len, flat=case.flat, num_cu_seqlens=num_cu,
                   changes=changes)
