"""Fuzz targets: each takes raw bytes, decodes them into a call of packkit's public or raw API and checks
the property of docs/reliability.md:

* the call returns a correct result (every kept token in the output exactly once), or
* raises ValueError / TypeError / OverflowError (AnalyzeError is a ValueError), or, for the raw
  ``torch.ops.packkit.*`` ops only, a RuntimeError from one of packkit's own argument checks
  (message naming ``packkit::``; a RuntimeError from anywhere else is a finding);
* nothing else: another exception fails the target, a crash or sanitizer report kills the process.

The byte decoding is ours (no atheris needed), so the committed corpus replays in plain pytest
(tests/fuzz/test_corpus.py); tests/fuzz/fuzz_one.py drives a target with atheris.
"""
from __future__ import annotations

import gzip
import os
import tempfile

import numpy as np
import torch

import packkit
from packkit.packing import pack_layout
from packkit.analyze import read_lengths
from packkit.analyze.lengths import LengthSpec

ALLOWED = (ValueError, TypeError, OverflowError)
OPS = torch.ops.packkit


class Bytes:
    """Consumes fuzz bytes as small integers; runs out into zeros (libFuzzer's FuzzedDataProvider style)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def int(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        span = hi - lo + 1
        value = 0
        for _ in range((span.bit_length() + 7) // 8):
            value = (value << 8) | self.byte()
        return lo + value % span

    def pick(self, options):
        return options[self.int(0, len(options) - 1)]

    def edgy(self) -> int:
        """An integer, often at a boundary (0, -1, 2**31, 2**63 - 1, ...).

        Valid but huge sizes (2**24 .. 2**31 - 1 rows, tokens or split pieces) are left out on purpose:
        they are a request for that much memory, not bad input (docs/reliability.md).
        """
        kind = self.int(0, 7)
        if kind == 0:
            return self.pick([0, 1, -1, 2**31, 2**32, 2**62, 2**63 - 1, -(2**63), 2**63, 2**64])
        if kind == 1:
            return -self.int(0, 1000)
        return self.int(0, 300)

    def rest(self) -> bytes:
        out = self.data[self.pos:]
        self.pos = len(self.data)
        return out


def _expect_allowed(e: BaseException, raw_op: bool = False) -> None:
    if isinstance(e, ALLOWED):
        return
    if raw_op and isinstance(e, RuntimeError) and "packkit::" in str(e):
        return
    raise AssertionError(f"{type(e).__name__} is outside the contract: {e}") from e


def _check_plan(plan, lengths, capacity, overlong) -> None:
    """Every kept token of every sequence in exactly one segment; no row over capacity."""
    seq, start, length, offsets = (np.asarray(a) for a in plan.segments)
    assert offsets[0] == 0 and offsets[-1] == len(seq) and np.all(np.diff(offsets) >= 0)
    covered = np.zeros(len(lengths), dtype=np.int64)
    for k in np.lexsort((start, seq)):
        assert start[k] == covered[seq[k]], "gap or overlap"
        covered[seq[k]] += length[k]
    for i, n in enumerate(lengths):
        kept = n if n <= capacity else {"drop": 0, "truncate": capacity, "split": n}[overlong]
        assert covered[i] == kept, (i, n, covered[i], kept)
    ends = np.concatenate(([0], np.cumsum(length)))
    assert np.all(ends[offsets[1:]] - ends[offsets[:-1]] <= capacity)


def _split_pieces(lengths, capacity) -> int:
    if not isinstance(capacity, int) or capacity <= 0:
        return 0
    return sum(-(-n // capacity) for n in lengths if isinstance(n, int) and n > 0)


# --- planner -----------------------------------------------------------------------------------


def fuzz_plan(data: bytes) -> None:
    b = Bytes(data)
    n = b.int(0, 40)
    big = b.int(0, 3) == 0
    lengths = [b.edgy() if big else b.int(0, 200) for _ in range(n)]
    capacity = b.edgy() if b.int(0, 3) == 0 else b.int(1, 256)
    algorithm = b.pick(["nf", "ffd", "bfd", "obfd", "ogbfd", "bogus"])
    overlong = b.pick(["error", "drop", "truncate", "split", "bogus"])
    dp_size = b.edgy() if b.int(0, 5) == 0 else b.int(1, 8)
    cost = b.pick(["tokens", "attention", (1.0, 0.5), (-1.0, 0.0), (float("nan"), 1.0), "bogus",
                   lambda x: np.asarray(x, dtype=np.float64)])
    if overlong == "split" and _split_pieces(lengths, capacity) > 1 << 20:
        overlong = "drop"  # a billion split pieces is a valid request for gigabytes, not bad input
    # Read last, so inputs from before extra_cost existed decode as before (no bytes left: None).
    extra = None
    if b.int(0, 1):
        size = n if b.int(0, 7) else b.int(0, 41)  # mostly the right length
        extra = [b.pick([0.0, 1.0, 1e300, -1.0, float("nan"), float("inf"), 0.5, 7.0]) for _ in range(size)]
    try:
        plan = packkit.plan(lengths, capacity, algorithm=algorithm, dp_size=dp_size, cost=cost, overlong=overlong,
                            extra_cost=extra)
    except BaseException as e:
        _expect_allowed(e)
        return
    _check_plan(plan, lengths, capacity, overlong)


def fuzz_from_bins(data: bytes) -> None:
    b = Bytes(data)
    n = b.int(0, 24)
    lengths = [b.int(0, 50) if b.int(0, 7) else b.edgy() for _ in range(n)]
    capacity = b.int(1, 200) if b.int(0, 7) else b.edgy()
    bins = [[b.int(-2, n + 1) for _ in range(b.int(0, 6))] for _ in range(b.int(0, 8))]
    try:
        plan = packkit.Plan.from_bins(lengths, bins, capacity)
    except BaseException as e:
        _expect_allowed(e)
        return
    _check_plan(plan, lengths, capacity, "error")  # every sequence whole, in exactly one row


# --- raw ops -----------------------------------------------------------------------------------


def _fit(value: int, dtype: torch.dtype) -> int:
    info = torch.iinfo(dtype) if not dtype.is_floating_point else None
    return value if info is None else max(info.min, min(info.max, value))


def _index_tensor(b: Bytes, values):
    dtype = b.pick([torch.int64, torch.int64, torch.int32, torch.float32])
    return torch.tensor([_fit(v, dtype) for v in values], dtype=dtype)


def _perturb(b: Bytes, t: torch.Tensor) -> torch.Tensor:
    """The tensor with one entry changed (often), cut short, in another dtype, or as is."""
    how = b.int(0, 6)
    if t.numel() and how <= 2:
        t = t.clone()
        t.view(-1)[b.int(0, t.numel() - 1)] = _fit(b.edgy(), t.dtype)
    elif how == 3 and t.numel():
        t = t[: b.int(0, t.numel() - 1)]
    elif how == 4:
        t = t.to(b.pick([torch.int32, torch.int64, torch.float32, torch.uint8]))
    return t


def fuzz_ops(data: bytes) -> None:
    """A valid plan from the planner, then every op with its tensors and sizes perturbed by the fuzzer."""
    b = Bytes(data)
    lengths = [b.int(0, 12) for _ in range(b.int(0, 10))]
    capacity = b.int(1, 16)
    try:
        plan = packkit.plan(lengths, capacity, overlong="split")
    except ValueError:
        return
    seq, start, length, offsets = (torch.from_numpy(np.array(a)) for a in plan.segments)
    src_offsets = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))))
    total = int(src_offsets[-1])
    src = torch.arange(total, dtype=torch.int64) + 1  # token values 1..T: each one traceable
    flat = bool(b.int(0, 1))
    shape = pack_layout(plan.segments, flat=flat, row_len=None if flat else capacity + b.int(0, 3),
                        num_rows=None if flat else plan.num_bins + b.int(0, 2))
    num_rows, row_len, num_cu = shape.num_rows, shape.row_len, shape.num_cu_seqlens
    clean = b.int(0, 3) == 0  # leave the plan alone: the result must then be exactly right
    p = (lambda t: t) if clean else (lambda t: _perturb(b, t))
    sizes = (lambda v: v) if clean else (lambda v: b.edgy() if b.int(0, 4) == 0 else v)
    # unpack's output sizes are not bound to int32: 2**31 source tokens is a valid 16 GB request, so only
    # invalid or small values here
    out_sizes = (lambda v: v) if clean else (lambda v: b.pick([-1, -(2**63), 0, 1, v + 1]) if b.int(0, 4) == 0 else v)
    op = b.pick(["layout", "pack", "pack_batch", "unpack", "unpack_padded", "plan"])
    if op == "plan":  # the planner op on arbitrary lengths and arguments
        values, cap = [b.edgy() for _ in range(b.int(0, 8))], b.edgy()
        overlong = b.pick(["error", "split", "x"])
        if overlong == "split" and _split_pieces(values, cap) > 1 << 20:
            overlong = "error"  # see fuzz_plan
        try:
            OPS.plan(_index_tensor(b, values), cap, b.pick(["obfd", "nf", "zz"]), overlong, b.edgy())
        except BaseException as e:
            _expect_allowed(e, raw_op=True)
        return
    try:
        cu, cu_seg = OPS.layout(p(length), p(offsets), sizes(num_rows), sizes(row_len), flat, sizes(num_cu))
        if op == "layout":
            return
        if op == "pack_batch":
            out = OPS.pack_batch(p(src), None, p(src_offsets), p(seq), p(start), p(length), p(offsets),
                                 sizes(num_rows), sizes(row_len), flat, sizes(num_cu), 0, -100, True, 0)
            if clean:
                ids = out[0].reshape(-1)
                kept = ids[ids > 0]  # tokens are 1..T, padding 0
                assert sorted(kept.tolist()) == list(range(1, total + 1)), "pack_batch lost or repeated a token"
            return
        packed = OPS.pack(p(src), p(src_offsets), p(seq), p(start), p(cu), p(cu_seg), sizes(num_rows),
                          sizes(row_len), flat, 0.0, None)
        if clean:
            kept = packed.reshape(-1)
            assert sorted(kept[kept > 0].tolist()) == list(range(1, total + 1)), "pack lost or repeated a token"
        if op == "unpack":
            back = OPS.unpack(p(packed), p(src_offsets), p(seq), p(start), p(cu), p(cu_seg), flat,
                              out_sizes(total), 0.0)
            if clean:
                assert torch.equal(back, src), "unpack(pack(x)) != x"
        elif op == "unpack_padded":
            OPS.unpack_padded(p(packed), p(seq), p(start), p(cu), p(cu_seg), flat, out_sizes(len(lengths)),
                              out_sizes(max(lengths, default=0)), 0.0)
    except BaseException as e:
        assert not clean or not isinstance(e, RuntimeError), f"a valid plan was refused: {e}"
        _expect_allowed(e, raw_op=True)


# --- pack_sequences / unpack_sequences and the collator ------------------------------------------


def _sequences(b: Bytes):
    n = b.int(0, 8)
    seqs, next_token = [], 1
    for _ in range(n):
        k = b.int(0, 20)
        seqs.append(list(range(next_token, next_token + k)))
        next_token += k
    return seqs


def fuzz_pack_sequences(data: bytes) -> None:
    b = Bytes(data)
    seqs = _sequences(b)
    capacity = b.int(1, 24) if b.int(0, 7) else b.edgy()
    layout = b.pick(["flat", "padded", "bogus"])
    overlong = b.pick(["error", "drop", "truncate", "split"])
    num_rows = None if b.int(0, 2) else b.edgy()
    kind = b.int(0, 2)
    payload = [torch.tensor(s, dtype=torch.int64) for s in seqs] if kind == 0 else (
        seqs if kind == 1 else [np.asarray(s, dtype=np.int32) for s in seqs])
    try:
        batch, info = packkit.pack_sequences(payload, capacity=capacity, layout=layout, overlong=overlong,
                                             num_rows=num_rows, return_info=True)
    except BaseException as e:
        _expect_allowed(e)
        return
    ids = batch["input_ids"].reshape(-1)
    kept = sorted(ids[ids > 0].tolist())
    expect = sorted(t for s in seqs for t in (s if len(s) <= capacity else
                                             {"drop": [], "truncate": s[:capacity], "split": s,
                                              "error": None}[overlong]))
    assert kept == expect, "a kept token is missing or repeated"
    # unpack: source order, flat; tokens the policy did not keep come back as pad_value 0
    back = packkit.unpack_sequences(batch["input_ids"], info).tolist()
    want = []
    for s in seqs:
        keep = len(s) if len(s) <= capacity or overlong == "split" else (capacity if overlong == "truncate" else 0)
        want += s[:keep] + [0] * (len(s) - keep)
    assert back == want, "unpack_sequences(pack_sequences(x)) differs from x"


def fuzz_collator(data: bytes) -> None:
    b = Bytes(data)
    seqs = _sequences(b)
    capacity = b.int(1, 24) if b.int(0, 7) else b.edgy()
    features = []
    for s in seqs:
        kind = b.int(0, 9)
        value = {0: s, 1: torch.tensor(s), 2: np.asarray(s), 3: "text", 4: None, 5: [[1, 2]], 6: [1.5],
                 7: torch.tensor(s).reshape(1, -1) if s else torch.zeros(0), 8: s, 9: s}[kind]
        f = {"input_ids": value}
        extra = b.int(0, 5)
        if extra == 1:
            f["labels"] = list(s)
        elif extra == 2:
            f["labels"] = list(s)[:-1]
        elif extra == 3:
            f["attention_mask"] = [1] * len(s)
        elif extra == 4:
            f["mystery"] = 7
        features.append(f)
    if b.int(0, 15) == 0:
        features = "not a list" if b.int(0, 1) else [{}]
    try:
        collate = packkit.PackingCollator(capacity, layout=b.pick(["flat", "padded"]),
                                          overlong=b.pick(["error", "drop", "truncate", "split"]),
                                          pad_to_multiple_of=b.pick([None, None, 8, 0, -1]))
        batch = collate(features)
    except BaseException as e:
        _expect_allowed(e)
        return
    ids = batch["input_ids"].reshape(-1)
    kept = ids[ids > 0].tolist()
    assert len(kept) == len(set(kept)), "a token appears twice"
    assert set(kept) <= {t for s in seqs for t in s}


# --- analyze readers ---------------------------------------------------------------------------

_SUFFIXES = [".jsonl", ".jsonl.gz", ".json", ".parquet", ".arrow", ".txt", ".npy", ""]


def fuzz_analyze(data: bytes) -> None:
    """The first byte picks the format (file suffix) and the length field; the rest is the file."""
    b = Bytes(data)
    suffix = _SUFFIXES[b.int(0, len(_SUFFIXES) - 1)]
    field = b.pick([None, "n", "ids", "a.b"])
    cut = b.int(0, 3) == 0
    content = b.rest()
    if suffix.endswith(".gz") and content[:2] != b"\x1f\x8b":  # compress plain bytes, sometimes cut short
        content = gzip.compress(content)
        content = content[: len(content) // 2] if cut else content
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "input" + suffix)
        with open(path, "wb") as f:
            f.write(content)
        spec = None if field is None or suffix in (".txt", ".npy") else (
            LengthSpec(ids_fields=(field,)) if field == "ids" else LengthSpec(count_fields=(field,)))
        try:
            read = read_lengths(path, spec, progress=False)
        except BaseException as e:
            _expect_allowed(e)
            return
    lengths = read.lengths
    assert lengths.dtype == np.int64 and lengths.ndim == 1 and lengths.size >= 1 and (lengths >= 0).all()


TARGETS = {f.__name__[len("fuzz_"):]: f for f in (fuzz_plan, fuzz_from_bins, fuzz_ops, fuzz_pack_sequences,
                                                   fuzz_collator, fuzz_analyze)}
