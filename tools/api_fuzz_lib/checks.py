"""Invariant checkers the fuzzer's registrations share. Source token ``t`` of sequence ``i`` has the id
``ID0 * (i + 1) + t`` (unique, far above any padding id a baseline uses), its label ``LABEL0 + id``; so a packed
batch names where each of its tokens came from, and a token lost, duplicated, moved out of its document or given
another token's label or position shows. The planner's checker (tests/plan_checks.py) is reused as is."""
from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np
import torch

TESTS = os.path.join(os.path.dirname(__file__), "..", "..", "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from plan_checks import check_plan as check_plan_invariants  # noqa: E402,F401 - re-exported for registrations

ID0 = 1000
LABEL0 = 10**6
LENGTHS = [5, 3, 7, 2, 6]
CAPACITY = 10


def sources(lengths=LENGTHS) -> list:
    return [[ID0 * (i + 1) + t for t in range(n)] for i, n in enumerate(lengths)]


def source_labels(lengths=LENGTHS) -> list:
    return [[LABEL0 + v for v in s] for s in sources(lengths)]


def _flat(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
    return np.asarray(x).reshape(-1).astype(np.int64)


def check_tokens(ids, expected, pad=0, *, labels=None, positions=None, start=0, ignore=-100,
                 first_label_masked=True) -> None:
    """Every expected source token exactly once in ``ids``, nothing else but ``pad``; labels and positions of
    each real token (when given) those of its source place."""
    flat = _flat(ids)
    want = Counter(v for s in expected for v in s)
    real = np.array([v in want for v in flat.tolist()], dtype=bool) if len(flat) else np.zeros(0, bool)
    got = Counter(flat[real].tolist())
    assert got == want, f"tokens lost or duplicated: missing {list((want - got).elements())[:5]}, " \
                        f"extra {list((got - want).elements())[:5]}"
    assert np.all(flat[~real] == pad), f"a padding entry is not pad={pad}: {sorted(set(flat[~real].tolist()))[:5]}"
    where = np.flatnonzero(real)
    offset = {v: t for s in expected for t, v in enumerate(s)}
    if positions is not None:
        pos = _flat(positions)
        for k in where:
            assert pos[k] == offset[int(flat[k])] + start, f"token {flat[k]} at position {pos[k]}"
    if labels is not None:
        lab = _flat(labels)
        for k in where:
            v = int(flat[k])
            want_label = ignore if (first_label_masked and offset[v] == 0) else LABEL0 + v
            assert lab[k] == want_label, f"token {v} has label {lab[k]}, not {want_label}"


def check_cu(cu, total: int) -> np.ndarray:
    cu = _flat(cu)
    assert cu[0] == 0 and cu[-1] == total and np.all(np.diff(cu) >= 0), f"cu_seqlens {cu.tolist()[:12]}"
    return cu


def check_documents(ids, cu, expected) -> None:
    """Each ``cu`` segment holding real tokens is one contiguous run of one source sequence."""
    flat = _flat(ids)
    want = {v for s in expected for v in s}
    for a, b in zip(cu[:-1], cu[1:]):
        seg = [v for v in flat[a:b].tolist() if v in want]
        if seg:
            assert len({v // ID0 for v in seg}) == 1, f"segment [{a}, {b}) mixes documents"
            assert seg == list(range(seg[0], seg[0] + len(seg))), f"segment [{a}, {b}) is not one run"


def check_batch(batch: dict, expected, kwargs: dict, *, labels=True, positions=True) -> None:
    """A packkit batch (flat or padded): tokens, labels, positions, documents."""
    pad = kwargs.get("pad_token_id", 0)
    start = kwargs.get("position_ids_start", 0)
    ignore = kwargs.get("ignore_index", -100)
    sep = kwargs.get("separator_id", ignore) if "separator_id" in kwargs else ignore
    check_tokens(batch["input_ids"], expected, pad, labels=batch.get("labels") if labels else None,
                 positions=batch.get("position_ids") if positions else None, start=start,
                 ignore=ignore if sep is None else sep, first_label_masked=kwargs.get("mask_first_label", True))
    if "cu_seq_lens_q" in batch:
        cu = check_cu(batch["cu_seq_lens_q"], batch["input_ids"].numel())
        check_documents(batch["input_ids"], cu, expected)


def digest(x) -> object:
    """A comparable form of a nested result (tensors, arrays, dicts, lists)."""
    if isinstance(x, torch.Tensor):
        return ("t", str(x.dtype), tuple(x.shape), x.detach().cpu().reshape(-1).tolist())
    if isinstance(x, np.ndarray):
        return ("a", str(x.dtype), x.shape, x.reshape(-1).tolist())
    if isinstance(x, dict):
        return {k: digest(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [digest(v) for v in x]
    return x
