"""No Triton kernel reads or writes outside its tensors, whatever the metadata (issue 48, fix 3), checked in the
interpreter: every launch runs on isolated copies of its tensors with sentinel guards on both sides
(conftest.py's ``isolated_launches``), every load and store is checked against the launch's tensors
(``strict_memory``), and outputs are poisoned and guarded (``guarded_outputs``). Hypothesis draws inconsistent
cu_seqlens / seg_src / prefix-forest layouts for cp_shard and tree_pack (pack, pack_batch, layout, unpack and the
fill kernel: test_plan_safety_triton.py, same fixtures); where the CPU op accepts the input (it validates the data),
the Triton result equals it bit for bit. The control: the cp_shard kernel as it was before the fix (a read before
input_ids when cu_seqlens does not start at 0) fails the same check."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - conftest.py already ignores us
    pytest.skip("needs TRITON_INTERPRET=1 set before triton is imported", allow_module_level=True)
pytest.importorskip("triton")

import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import packkit  # noqa: E402,F401
from conftest import MemoryViolation  # noqa: E402
from packkit.triton_kernels import context_parallel as tcp  # noqa: E402
from packkit.triton_kernels import tree_pack as ttp  # noqa: E402

pytestmark = pytest.mark.full

OPS = torch.ops.packkit
EXAMPLES = int(os.environ.get("PACKKIT_BOUNDS_EXAMPLES", "40"))  # CI budget; raise it by hand
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
i32, i64 = torch.int32, torch.int64


def _cpu_or_none(fn):
    """The CPU op's result, or None where it refuses the input (it checks the data: the input is inconsistent)."""
    try:
        return fn()
    except RuntimeError:
        return None


@st.composite
def cp_cases(draw):
    num_src = draw(st.integers(0, 12))
    s = draw(st.integers(0, 4))
    small = st.integers(-6, 30)
    cu = draw(st.lists(small, min_size=s + 1, max_size=s + 1))
    if draw(st.booleans()):  # often consistent, so the reference comparison runs too
        lengths = draw(st.lists(st.integers(0, 5), min_size=s, max_size=s))
        cu = [0] + [sum(lengths[:i + 1]) for i in range(s)]
    cp_size = draw(st.integers(1, 3))
    zigzag = draw(st.booleans())
    if zigzag and draw(st.booleans()):
        cup = [0]
        for a, b in zip(cu, cu[1:]):
            cup.append(cup[-1] + -(-max(b - a, 0) // (2 * cp_size)) * 2 * cp_size)
    else:
        cup = draw(st.lists(st.integers(-6, 40), min_size=s + 1, max_size=s + 1))
    fused = draw(st.booleans())
    seg_src = draw(st.lists(st.integers(-3, 14), min_size=s, max_size=s)) if fused else None
    out_len = (cup[-1] // cp_size if zigzag and cup[-1] >= 0 and draw(st.booleans())
               else draw(st.integers(0, 24)))
    return dict(num_src=num_src if fused else max(cu[-1], 0) if draw(st.booleans()) else num_src, cu=cu, cup=cup,
                cp_size=cp_size, cp_rank=draw(st.integers(0, cp_size - 1)), zigzag=zigzag, out_len=out_len,
                seg_src=seg_src, ids_dtype=draw(st.sampled_from([i32, i64])),
                lab_dtype=draw(st.sampled_from([i32, i64])),
                first=draw(st.sampled_from([None, -5])) if fused else None)


def _cp_args(c):
    n = c["num_src"]
    ids = (torch.arange(n, dtype=i64) * 7 + 100).to(c["ids_dtype"])
    labels = (torch.arange(n, dtype=i64) * 5 + 1000).to(c["lab_dtype"])
    fused = c["seg_src"] is not None
    pos = None if fused else torch.arange(n, dtype=i64) % 4
    seg_src = torch.tensor(c["seg_src"], dtype=i64) if fused else None
    return (ids, labels, pos, torch.tensor(c["cu"], dtype=i32), torch.tensor(c["cup"], dtype=i32), c["cp_size"],
            c["cp_rank"], c["zigzag"], c["out_len"], -1, -100, seg_src, 3 if fused else 0, c["first"])


def check_cp(c, op):
    args = _cp_args(c)
    try:
        got = op(*args)
    except ValueError:  # metadata the host refuses before any launch
        return False
    want = _cpu_or_none(lambda: OPS.cp_shard(*args))
    if want is not None:
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w), c
    return want is None


@SETTINGS
@given(c=cp_cases())
def test_cp_shard_stays_in_bounds_under_inconsistent_metadata(c):
    check_cp(c, OPS.triton_cp_shard)


def test_cp_shard_cases_mix_consistent_and_inconsistent():
    """Fixed seeds through the same check: both kinds occur (compared with the CPU op, and refused by it)."""
    import random

    rng = random.Random(0)
    kinds = [check_cp(_fixed_case(rng), OPS.triton_cp_shard) for _ in range(40)]
    assert 5 < sum(kinds) < 35, kinds


def _fixed_case(rng):
    s = rng.randint(1, 3)
    lengths = [rng.randint(0, 4) for _ in range(s)]
    cu = [0] + [sum(lengths[:i + 1]) for i in range(s)]
    if rng.random() < 0.5:
        cu = [v + rng.randint(-3, 5) for v in cu]
    fused = rng.random() < 0.5
    return dict(num_src=12 if fused else max(cu[-1], 0), cu=cu, cup=cu, cp_size=1, cp_rank=0, zigzag=False,
                out_len=rng.randint(0, 10), seg_src=[rng.randint(-1, 8) for _ in range(s)] if fused else None,
                ids_dtype=i64, lab_dtype=i64, first=None)


# --- the control: the kernel as it was before the fix must fail this very check -----------------------------------
_FIXED = "        tok = seg_ok & (start >= 0) & (off >= 0) & (q >= 0) & (q < num_src)"
_OLD = "        tok = seg_ok & (start >= 0) & (q < num_src)"


def _old_cp_module(tmp_path):
    src = open(tcp.__file__).read()
    assert src.count(_FIXED) == 1, "the fixed line moved: update the control"
    path = tmp_path / "old_context_parallel.py"
    path.write_text(src.replace(_FIXED, _OLD).replace('"packkit::triton_cp_shard"', '"packkit_test::old_cp_shard"')
                    .replace("from .common import", "from packkit.triton_kernels.common import"))
    spec = importlib.util.spec_from_file_location("old_context_parallel", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


# cu_seqlens starting at 5: the old kernel reads input_ids[-5 .. -1] (the issue's case).
_START_AT_5 = dict(num_src=8, cu=[5, 9, 12], cup=[5, 9, 12], cp_size=1, cp_rank=0, zigzag=False, out_len=12,
                   seg_src=[0, 3], ids_dtype=i64, lab_dtype=i64, first=None)


def test_fixed_kernel_passes_the_issue_case():
    assert check_cp(_START_AT_5, OPS.triton_cp_shard)  # inconsistent (the CPU op refuses it), and in bounds


def test_control_old_kernel_reads_before_the_source(tmp_path, monkeypatch, isolated_launches):
    old = _old_cp_module(tmp_path)
    monkeypatch.setattr(old, "wrap_triton", isolated_launches)
    # The interpreter wraps the checker's MemoryViolation in its InterpreterError.
    with pytest.raises(Exception, match=r"MemoryViolation\('out-of-bounds load") as info:
        check_cp(_START_AT_5, old.cp_shard)
    assert isinstance(info.value, MemoryViolation) or isinstance(info.value.__cause__, MemoryViolation)


# --- tree_pack ------------------------------------------------------------------------------------------------------
@st.composite
def tree_cases(draw):
    num_src = draw(st.integers(0, 10))
    m = draw(st.integers(0, 4))
    num_rows = draw(st.integers(0, 3))
    row_len = draw(st.integers(0, 8))
    anyint = st.integers(-4, 14)
    nodes = [draw(st.lists(anyint, min_size=m, max_size=m)) for _ in range(5)]
    row_offsets = draw(st.lists(st.integers(-2, m + 2), min_size=num_rows + 1, max_size=num_rows + 1))
    if draw(st.booleans()):  # a consistent layout: one node per row at its start, in the source
        m = num_rows
        lengths = [draw(st.integers(0, min(row_len, 3))) for _ in range(m)]
        src = [draw(st.integers(0, max(num_src - k, 0))) for k in lengths]
        lengths = [min(k, num_src) for k in lengths]
        src = [min(s, num_src - k) for s, k in zip(src, lengths)]
        nodes = [src, [r * row_len for r in range(m)], lengths, [0] * m, [k for k in lengths]]
        row_offsets = list(range(num_rows + 1))
    return dict(num_src=num_src, nodes=nodes, row_offsets=row_offsets, num_rows=num_rows, row_len=row_len,
                ids_dtype=draw(st.sampled_from([i32, i64])), labels=draw(st.sampled_from([None, i32, i64])))


def check_tree(c):
    n = c["num_src"]
    ids = (torch.arange(n, dtype=i64) * 3 + 50).to(c["ids_dtype"])
    labels = None if c["labels"] is None else (torch.arange(n, dtype=i64) + 900).to(c["labels"])
    nodes = [torch.tensor(v, dtype=i64) for v in c["nodes"]]
    args = (ids, labels, *nodes, torch.tensor(c["row_offsets"], dtype=i64), c["num_rows"], c["row_len"], 5, -7)
    try:
        got = OPS.triton_tree_pack(*args)
    except ValueError:
        return False
    want = _cpu_or_none(lambda: OPS.tree_pack(*args))
    if want is not None:
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w), c
    return want is None


@SETTINGS
@given(c=tree_cases())
def test_tree_pack_stays_in_bounds_under_inconsistent_layouts(c):
    check_tree(c)


def test_every_op_family_launched_through_the_isolation(isolated_launches):
    before = isolated_launches.launches
    check_cp(_START_AT_5, OPS.triton_cp_shard)
    check_tree(dict(num_src=3, nodes=[[0], [0], [3], [0], [3]], row_offsets=[0, 1], num_rows=1, row_len=4,
                    ids_dtype=i64, labels=None))
    assert isolated_launches.launches == before + 2
