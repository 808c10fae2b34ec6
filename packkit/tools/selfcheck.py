"""The self-check behind ``packkit info``: every op once per backend on one small fixed example against
known answers, then error probes that must raise, not crash.

It runs as a worker process, ``python -m packkit.tools.selfcheck BACKEND``, writing one line per check
(``START name``, then ``PASS name<TAB>detail`` or ``FAIL name<TAB>detail``) and flushing each, so the parent
can name the check that killed it: a crash is reported, not suffered. The known answers come from the
plain-PyTorch reference, ``tests/pack_reference.py`` (``tests/test_info.py`` checks that they agree).
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
import traceback
from typing import Optional

BACKENDS = ("cpu", "cuda", "triton")

# Three sequences of 3, 2 and 4 tokens in rows of 5: the plan puts sequence 2 in row 0 and sequences 0
# and 1 in row 1, so row 0 has a padding tail and row 1 is full.
LENGTHS = [3, 2, 4]
IDS = [10, 11, 12, 20, 21, 30, 31, 32, 33]
OFFSETS = [0, 3, 5, 9]
CAPACITY, NUM_ROWS, ROW_LEN = 5, 2, 5
PLAN = ([2, 0, 1], [0, 0, 0], [4, 3, 2], [0, 1, 3])  # seg_seq, seg_start, seg_length, bin_offsets
LAYOUT = ([0, 4, 5, 8, 10], [0, -1, 1, 2])  # cu_seqlens, cu_seg
PACK = [[7, 31, 32, 33, -1], [7, 11, 12, 7, 21]]  # pad_value -1, first_value 7
PACK_BATCH = ([[30, 31, 32, 33, 0], [10, 11, 12, 20, 21]],  # input_ids (pad_id 0)
              [[-100, 31, 32, 33, -100], [-100, 11, 12, -100, 21]],  # labels (first label masked)
              [[0, 1, 2, 3, 0], [0, 1, 2, 0, 1]],  # position_ids
              [[0, 0, 0, 0, 1], [2, 2, 2, 3, 3]],  # seq_idx
              [0, 4, 5, 8, 10])  # cu_seqlens
PACKED = [[30, 31, 32, 33, -1], [10, 11, 12, 20, 21]]  # pack with pad_value -1, no first_value
UNPACK = IDS
UNPACK_PADDED = [[10, 11, 12, -1], [20, 21, -1, -1], [30, 31, 32, 33]]  # max_len 4, pad -1
# cp_shard: row 1 of PACK_BATCH (documents of 3 and 2 tokens), context-parallel rank 1 of 2, zigzag: each
# document padded to 4 tokens (cu_seqlens_padded), rank 1 keeps chunks 1 and 2 of each (tests/cp_reference.py).
CP_ROW = ([10, 11, 12, 20, 21], [0, 1, 2, 0, 1], [0, 3, 5], [0, 4, 8])  # ids (= labels), positions, cu, cu padded
CP_SHARD = ([11, 12, 21, 0], [11, 12, 21, -100], [12, -100, -100, -100], [1, 2, 1, 2], [1, 2, 4, -1], [0, 0, 1, 1])


def _same(name, got, want):
    got = got.cpu().tolist() if hasattr(got, "cpu") else got
    if got != want:
        raise AssertionError(f"{name}: got {got}, expected {want}")


def op_checks(backend: str):
    """(name, callable) for every op of ``backend``; each callable raises AssertionError on a wrong answer."""
    import torch

    from ..packing import ops as _ops  # noqa: F401  (loads the op libraries)

    if backend == "triton":
        from ..triton_kernels import context_parallel as _triton_cp  # noqa: F401  (packkit::triton_cp_shard)
        from ..triton_kernels import pack as _triton  # noqa: F401  (registers packkit::triton_*)
    device = "cpu" if backend == "cpu" else "cuda"
    prefix = "triton_" if backend == "triton" else ""
    ops = torch.ops.packkit

    def op(name):
        return getattr(ops, prefix + name)

    def t(values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=device)

    seg_seq, seg_start, seg_length, bin_offsets = (t(v) for v in PLAN)
    cu, cu_seg = t(LAYOUT[0], torch.int32), t(LAYOUT[1], torch.int32)
    ids, offsets, packed = t(IDS), t(OFFSETS), t(PACKED)
    plan_args = (seg_seq, seg_start, cu, cu_seg)
    checks = []
    if backend == "cpu":  # the planner is a host op
        checks.append(("plan", lambda: [_same(f"plan[{i}]", x, y) for i, x, y in
                                        zip(range(4), ops.plan(torch.tensor(LENGTHS), CAPACITY), PLAN)]))

    def layout():
        a, b = op("layout")(seg_length, bin_offsets, NUM_ROWS, ROW_LEN, False, len(LAYOUT[0]))
        _same("cu_seqlens", a, LAYOUT[0]), _same("cu_seg", b, LAYOUT[1])

    def layout_out():
        a, b = t([-9] * len(LAYOUT[0]), torch.int32), t([-9] * len(LAYOUT[1]), torch.int32)
        op("layout_out")(seg_length, bin_offsets, NUM_ROWS, ROW_LEN, False, a, b)
        _same("cu_seqlens", a, LAYOUT[0]), _same("cu_seg", b, LAYOUT[1])

    def pack_batch(out=False):
        if out:
            res = [torch.full((NUM_ROWS, ROW_LEN), -9, dtype=dt, device=device)
                   for dt in (torch.int64, torch.int64, torch.int64, torch.int32)]
            res += [t([-9] * len(LAYOUT[0]), torch.int32), t([-9] * len(LAYOUT[1]), torch.int32)]
            op("pack_batch_out")(ids, None, offsets, seg_seq, seg_start, seg_length, bin_offsets, False, *res)
        else:
            res = op("pack_batch")(ids, None, offsets, seg_seq, seg_start, seg_length, bin_offsets, NUM_ROWS, ROW_LEN,
                                   False, len(LAYOUT[0]))
        for name, got, want in zip(("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens"), res, PACK_BATCH):
            _same(name, got, want)

    def pack_out():
        out = torch.full((NUM_ROWS, ROW_LEN), -9, dtype=torch.int64, device=device)
        op("pack_out")(ids, offsets, *plan_args, False, out, -1.0, 7.0)
        _same("pack_out", out, PACK)

    def unpack_out():
        out = t([-9] * len(IDS))
        op("unpack_out")(packed, offsets, *plan_args, False, out, 0.0)
        _same("unpack_out", out, UNPACK)

    def unpack_padded_out():
        out = torch.full((3, 4), -9, dtype=torch.int64, device=device)
        op("unpack_padded_out")(packed, *plan_args, False, out, -1.0)
        _same("unpack_padded_out", out, UNPACK_PADDED)

    checks += [
        ("layout", layout),
        ("layout_out", layout_out),
        ("pack", lambda: _same("pack", op("pack")(ids, offsets, *plan_args, NUM_ROWS, ROW_LEN, False, -1.0, 7.0), PACK)),
        ("pack_out", pack_out),
        ("pack_batch", pack_batch),
        ("pack_batch_out", lambda: pack_batch(out=True)),
        ("unpack", lambda: _same("unpack", op("unpack")(packed, offsets, *plan_args, False, len(IDS), 0.0), UNPACK)),
        ("unpack_out", unpack_out),
        ("unpack_padded", lambda: _same("unpack_padded", op("unpack_padded")(packed, *plan_args, False, 3, 4, -1.0),
                                        UNPACK_PADDED)),
        ("unpack_padded_out", unpack_padded_out),
    ]

    def cp_shard():
        ids, pos, cu_cp, cu_padded = t(CP_ROW[0]), t(CP_ROW[1]), t(CP_ROW[2], torch.int32), t(CP_ROW[3], torch.int32)
        out = op("cp_shard")(ids, ids, pos, cu_cp, cu_padded, 2, 1, True, 4)
        for name, got, want in zip(("input_ids", "labels", "shift_labels", "position_ids", "src_index", "seq_idx"),
                                   out, CP_SHARD):
            _same(name, got, want)

    checks.append(("cp_shard", cp_shard))
    if device == "cuda":
        checks.append(("cuda synchronize", torch.cuda.synchronize))
    return checks


def error_probes(backend: str):
    """(name, callable, exception type) for calls that must raise that exception (ops of the C++ backends
    raise RuntimeError; the Triton ops check their arguments in Python and raise ValueError)."""
    import torch

    device = "cpu" if backend == "cpu" else "cuda"
    prefix = "triton_" if backend == "triton" else ""
    ops = torch.ops.packkit
    expected = ValueError if backend == "triton" else RuntimeError
    seg_seq, seg_start, seg_length, bin_offsets = (torch.tensor(v, device=device) for v in PLAN)
    cu = torch.tensor(LAYOUT[0], dtype=torch.int32, device=device)
    cu_seg = torch.tensor(LAYOUT[1], dtype=torch.int32, device=device)
    ids, offsets = torch.tensor(IDS, device=device), torch.tensor(OFFSETS, device=device)
    probes = []
    if backend == "cpu":
        probes.append(("error probe: plan of a sequence longer than capacity",
                       lambda: ops.plan(torch.tensor([30]), 8), RuntimeError))
    probes += [
        ("error probe: layout with num_cu_seqlens = 0",
         lambda: getattr(ops, prefix + "layout")(seg_length, bin_offsets, NUM_ROWS, ROW_LEN, False, 0), expected),
        ("error probe: pack with a pad value int64 cannot hold",
         lambda: getattr(ops, prefix + "pack")(ids, offsets, seg_seq, seg_start, cu, cu_seg, NUM_ROWS, ROW_LEN,
                                               False, 0.5), expected),
    ]
    return probes


def _message(e: Exception) -> str:
    """The first line of the error from packkit's own words on (C++ errors start with function, file:line)."""
    text = str(e).splitlines()[0] if str(e) else ""
    at = text.find("packkit")
    return text[max(at, 0):][:160]


def _say(line: str) -> None:
    sys.stdout.write(line.replace("\n", " ") + "\n")  # one check per line, whatever the message holds
    sys.stdout.flush()


PLANTS = ("segv", "wrong", "hang")


def _planted(checks, plant: str):
    """``checks`` with the fault ``plant`` ("KIND:CHECK", KIND one of PLANTS) put into the named check: the seam
    through which tests show a crash, a wrong answer and a hang are caught by the parent (packkit.packing.backend_check)."""
    kind, _, target = plant.partition(":")
    if kind not in PLANTS or target not in [name for name, _ in checks]:
        raise ValueError(f"--plant {plant!r}: KIND:CHECK with KIND in {PLANTS} and CHECK one of this backend's checks")

    def fault(fn):
        def run():
            if kind == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            if kind == "hang":
                time.sleep(3600)
            fn()
            raise AssertionError(f"{target}: planted wrong result")
        return run

    return [(name, fault(fn) if name == target else fn) for name, fn in checks]


def run(backend: str, crash_control: bool = False, device: Optional[int] = None, plant: Optional[str] = None) -> int:
    """Runs every check of ``backend`` in this process, one line each; returns the number that failed."""
    failures = 0
    try:
        if device is not None and backend != "cpu":
            import torch

            torch.cuda.set_device(device)
        checks = op_checks(backend)
        probes = error_probes(backend)
        if plant:
            checks = _planted(checks, plant)
    except Exception as e:  # the backend cannot even be set up: one failed check says why
        _say(f"START {backend} setup")
        _say(f"FAIL {backend} setup\t{type(e).__name__}: {e}")
        return 1
    for name, fn in checks:
        _say(f"START {name}")
        try:
            fn()
        except Exception as e:
            failures += 1
            _say(f"FAIL {name}\t{type(e).__name__}: {e}")
        else:
            _say(f"PASS {name}\tmatches the reference")
    if crash_control:  # the control: a probe that kills its process, to show crashes are caught
        probes.append(("control probe: SIGSEGV", lambda: os.kill(os.getpid(), signal.SIGSEGV), RuntimeError))
    for name, fn, expected in probes:
        _say(f"START {name}")
        try:
            fn()
        except expected as e:
            _say(f"PASS {name}\traises {type(e).__name__}: {_message(e)}")
        except Exception as e:
            failures += 1
            _say(f"FAIL {name}\traises {type(e).__name__}, expected {expected.__name__}: {e}")
        else:
            failures += 1
            _say(f"FAIL {name}\treturned normally, expected {expected.__name__}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packkit.tools.selfcheck")
    parser.add_argument("backend", choices=BACKENDS)
    parser.add_argument("--crash-control", action="store_true", help="end with a probe that kills this process")
    parser.add_argument("--device", type=int, help="the CUDA device index to check (default: the current one)")
    parser.add_argument("--plant", metavar="KIND:CHECK", help=f"tests: a fault in one check, KIND in {PLANTS}")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    faulthandler.enable()  # a native crash prints the Python stack to stderr, which the parent keeps
    try:
        return 1 if run(args.backend, crash_control=args.crash_control, device=args.device, plant=args.plant) else 0
    except BaseException:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
