"""Argument checks of the packing entry points: scalar options, token ids, labels, plan coverage and
allocation size. Each raises ValueError/TypeError naming the argument, what was wrong and what is allowed
(the rules are listed in docs/reliability.md).

Token ids and labels on the host (lists, numpy arrays, CPU tensors) are checked on the host before anything
is copied. Tensors already on a GPU are checked on the device with ``torch._assert_async``: no host sync, the
failure surfaces at the next synchronisation. It trashes the CUDA context, but so would the embedding lookup
a negative id reaches next (a device-side index assert); the check only makes it fail earlier, named.
"""
from __future__ import annotations

import numbers
from typing import Optional

import numpy as np
import torch

# Padding a call may add beyond its real tokens: up to this many tokens, or up to PADDING_RATIO times the
# real tokens if that is more. A batch of 10 tokens padded to 10**9 (a typo'd num_rows, row_len, capacity
# or pad_to_multiple_of) would otherwise allocate gigabytes (or be killed for memory) before any error.
MAX_PADDING_TOKENS = 2**24
PADDING_RATIO = 8
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32)


def check_int(value, name: str, minimum: Optional[int] = None) -> int:
    """``value`` as a Python int (numpy ints accepted); TypeError for bools, floats, strings; ValueError
    below ``minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def as_device(device, name: str = "device") -> torch.device:
    """``torch.device(device)`` with a ValueError naming the argument (torch raises a RuntimeError)."""
    if not isinstance(device, (str, int, torch.device)) or isinstance(device, bool):
        raise TypeError(f"{name} must be a torch.device, a str like 'cuda:0' or an int, got {type(device).__name__}")
    try:
        dev = device if isinstance(device, torch.device) else torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"{name}={device!r} is not a device: {exc}") from None
    if dev.type == "meta":
        raise ValueError(f"{name}={device!r}: a meta tensor holds no data, and packing moves token values")
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"{name}={device!r} but this machine has {torch.cuda.device_count()} usable CUDA devices "
                         f"(torch {torch.__version__}, CUDA {'available' if torch.cuda.is_available() else 'not available'})")
    return dev


# The pack ops carry fill values (pad_token_id, ignore_index) as float64: exact up to 2^53. 2**53 + 1 came back as
# 2**53 and 2**63 - 1 as torch's "cannot be converted" RuntimeError (found by tools/api_fuzz.py).
MAX_FILL = 2**53
# Positions count up from position_ids_start inside a batch of < 2^31 tokens: int64 must not wrap.
MAX_POSITION_START = 2**62


def check_pack_scalars(pad_token_id, ignore_index, position_ids_start, mask_first_label=True) -> tuple:
    """(pad_token_id, ignore_index, position_ids_start, mask_first_label) checked: the padding id is an
    embedding index (>= 0), positions start at >= 0 (learned position embeddings index with them)."""
    out = (check_int(pad_token_id, "pad_token_id", 0), check_int(ignore_index, "ignore_index"),
           check_int(position_ids_start, "position_ids_start", 0), check_bool(mask_first_label, "mask_first_label"))
    for name, value, high in (("pad_token_id", out[0], MAX_FILL), ("ignore_index", out[1], MAX_FILL),
                              ("position_ids_start", out[2], MAX_POSITION_START)):
        if abs(value) > high:
            raise ValueError(f"{name} must be in [-{high}, {high}] (the pack ops carry it exactly only there), "
                             f"got {value}")
    return out


def check_separator(separator_id, ignore_index: int) -> int:
    """A first-label value: a token id (>= 0) or ``ignore_index``."""
    separator_id = check_int(separator_id, "separator_id")
    if separator_id < 0 and separator_id != ignore_index:
        raise ValueError(f"separator_id must be >= 0 (a token id) or ignore_index={ignore_index}, got {separator_id} "
                         f"(its default is -100: with another ignore_index pass separator_id=ignore_index, or None)")
    return separator_id


INT64_MAX = 2**63 - 1


def refuse_meta(value, name: str) -> None:
    """A meta tensor has a shape and a dtype but no values: name it here (torch's own error, at the first copy,
    is a NotImplementedError that names nothing)."""
    if isinstance(value, torch.Tensor) and value.is_meta:
        raise ValueError(f"{name} is a meta tensor: meta tensors carry no data (shape and dtype only), and packing "
                         f"reads token values; pass a CPU or CUDA tensor")


def refuse_meta_batch(batch, name: str) -> None:
    """:func:`refuse_meta` for every tensor of a dict batch (``batch['input_ids']`` named), O(number of keys)."""
    if isinstance(batch, dict):
        for key, value in batch.items():
            refuse_meta(value, f"{name}[{key!r}]")
    elif isinstance(batch, (list, tuple)):
        for i, value in enumerate(batch):
            refuse_meta(value, f"{name}[{i}]")
    else:
        refuse_meta(batch, name)


def outside_int64(sequences) -> Optional[tuple]:
    """On the error path only: ``(i, k, value, note)`` of the first token id beyond int64 (a uint64 id or a Python
    int >= 2**63, which array('q') refuses as "int too big" and a cast would wrap to a negative id), else None."""
    for i, s in enumerate(sequences):
        if isinstance(s, np.ndarray) and s.dtype == np.uint64:
            big = np.flatnonzero(s.reshape(-1) > INT64_MAX)
            if len(big):
                return i, int(big[0]), int(s.reshape(-1)[big[0]]), " (dtype uint64)"
            continue
        if isinstance(s, (str, bytes, torch.Tensor)) or not hasattr(s, "__iter__"):
            continue
        for k, v in enumerate(s):
            if isinstance(v, (numbers.Integral, np.integer)) and not -2**63 <= int(v) <= INT64_MAX:
                return i, k, int(v), ""
    return None


def int64_message(where: str, value: int, note: str = "") -> str:
    return f"{where} is {value}{note}, outside int64: token ids must be in [0, 2**63 - 1]"


def check_uint64_ids(flat: np.ndarray, name: str) -> np.ndarray:
    """A flat uint64 array of token ids as int64, refusing (naming it) an id above int64's range: a plain cast
    wrapped 2**64 - 1 to -1, then refused as a negative id."""
    if flat.dtype == np.uint64 and flat.size and int(flat.max()) > INT64_MAX:
        at = int(np.argmax(flat > INT64_MAX))
        raise ValueError(int64_message(f"{name}[{at}]", int(flat[at]), " (dtype uint64)"))
    return flat


def integer_tokens(flat: torch.Tensor, name: str) -> torch.Tensor:
    """``flat`` as int64/int32 token values; TypeError for float, bool and complex tensors (a silent
    conversion would truncate 1.7 to 1 or read a mask as ids)."""
    if flat.dtype in (torch.int64, torch.int32):
        return flat
    if flat.dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must be an integer tensor of token ids (int64, int32 or a narrower integer "
                        f"dtype), got {flat.dtype}")
    return flat.to(torch.int64)


def _first_bad(bad: torch.Tensor, lengths: Optional[np.ndarray]) -> str:
    i = int(torch.nonzero(bad)[0, 0])
    if lengths is None or not len(lengths):
        return f"flat position {i}"
    seq = int(np.searchsorted(np.cumsum(lengths), i, side="right"))
    start = int(np.sum(lengths[:seq]))
    return f"sequence {seq}, token {i - start}"


def check_token_ids(flat: torch.Tensor, name: str, lengths: Optional[np.ndarray] = None) -> None:
    """Token ids index the embedding: ValueError (host) or a device assert (GPU) for a negative one."""
    if flat.numel() == 0 or flat.dtype == torch.uint8:
        return
    if flat.device.type != "cpu":
        torch._assert_async(flat.min() >= 0, f"{name}: a token id is negative; token ids must be >= 0")
        return
    if int(flat.min()) < 0:  # one reduction, no temporary; the details only on failure
        bad = flat < 0
        raise ValueError(f"{name} has a negative token id ({_first_bad(bad, lengths)}: {int(flat[bad][0])}); "
                         f"token ids index the embedding and must be >= 0")


def check_fill(value, dtype: torch.dtype, name: str) -> None:  # noqa: C901 - one rule per dtype kind
    """ValueError unless ``value`` (a padding / ignore / separator value) is exactly representable in ``dtype``:
    an int32 batch cannot hold pad_token_id=2**40, an integer field not 1.5 (a cast would silently change it)."""
    if dtype.is_floating_point or dtype.is_complex:
        return
    if dtype == torch.bool:
        low, high = 0, 1
    else:
        info = torch.iinfo(dtype)
        low, high = info.min, info.max
    v = float(value)
    if not (v == v and abs(v) != float("inf") and v == int(v) and low <= int(value) <= high):
        raise ValueError(f"{name}={value!r} cannot be stored in the batch's {dtype} tensor (allowed: integers in "
                         f"[{low}, {high}])")


def check_padding(out_tokens: int, real_tokens: int, what: str) -> None:
    """ValueError when a call would allocate far more padding than it has tokens (see MAX_PADDING_TOKENS)."""
    padding = out_tokens - real_tokens
    if padding > max(MAX_PADDING_TOKENS, PADDING_RATIO * real_tokens):
        raise ValueError(f"{what} holds {out_tokens} tokens for {real_tokens} real ones; packkit refuses more than "
                         f"max({MAX_PADDING_TOKENS}, {PADDING_RATIO} x the real tokens) of padding (a num_rows, "
                         f"row_len, capacity, max_len or pad_to_multiple_of far larger than the data)")


def check_static_shape(rows: int, row_len: int, what: str) -> None:
    """A fixed ``[rows, row_len]`` shape a loader pads every batch to must pass :func:`check_padding` even for a
    nearly empty batch (an epoch's last one): refuse it at construction, not hours into training."""
    if rows * row_len > MAX_PADDING_TOKENS:
        raise ValueError(f"{what} = {rows} x {row_len} = {rows * row_len} tokens per batch; a batch with few real "
                         f"tokens (the last of an epoch) would be refused as padding out of proportion: at most "
                         f"{MAX_PADDING_TOKENS} tokens")


def check_plan_covers(plan, lengths: np.ndarray) -> None:
    """ValueError unless ``plan`` was made for these ``lengths``: every segment lies inside its sequence, a
    sequence's segments do not overlap, and together they cover what the plan says it keeps of it (all of
    it; nothing if it was dropped; the first ``capacity`` tokens if truncated). Host-side, vectorised."""
    seg = plan.segments
    seq, start, length = seg.seq_index, seg.start, seg.length
    n = len(lengths)
    if len(seq) and (seq.min() < 0 or seq.max() >= n):
        raise ValueError(f"the plan names sequence {int(seq.max() if seq.max() >= n else seq.min())} but there "
                         f"are {n} sequences")
    expect = lengths.astype(np.int64, copy=True)
    for name, idx in (("dropped", plan.dropped), ("truncated", plan.truncated)):
        idx = np.asarray(idx, np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"the plan's {name} list names a sequence outside [0, {n})")
        short = idx[lengths[idx] <= plan.capacity] if len(idx) else idx
        if len(short):
            i = int(short[0])
            raise ValueError(f"the plan {name} sequence {i} as longer than capacity={plan.capacity}, but it has "
                             f"{int(lengths[i])} tokens: the plan was made for other lengths")
        expect[idx] = 0 if name == "dropped" else plan.capacity
    bad = np.flatnonzero((start < 0) | (length < 1) | (start + length > expect[seq])) if len(seq) else seq
    if len(bad):
        j = int(bad[0])
        raise ValueError(f"plan segment {j} covers tokens [{int(start[j])}, {int(start[j] + length[j])}) of "
                         f"sequence {int(seq[j])}, which has {int(lengths[seq[j]])} (the plan keeps "
                         f"{int(expect[seq[j]])}): the plan was made for other lengths")
    covered = np.bincount(seq, weights=length, minlength=n).astype(np.int64) if len(seq) else np.zeros(n, np.int64)
    # Overlap is only possible between segments of one sequence (split plans): sort just those.
    multi = np.flatnonzero(np.bincount(seq, minlength=n)[seq] > 1) if len(seq) > 1 else seq[:0]
    if len(multi):
        order = multi[np.lexsort((start[multi], seq[multi]))]
        s, b, e = seq[order], start[order], start[order] + length[order]
        overlap = np.flatnonzero((s[1:] == s[:-1]) & (b[1:] < e[:-1]))
        if len(overlap):
            i = int(s[overlap[0]])
            raise ValueError(f"the plan's segments of sequence {i} overlap: it would pack some of its tokens twice")
    missing = np.flatnonzero(covered != expect)
    if len(missing):
        i = int(missing[0])
        raise ValueError(f"the plan packs {int(covered[i])} tokens of sequence {i}, which has {int(lengths[i])} "
                         f"(the plan should keep {int(expect[i])}): the plan was made for other lengths; make it "
                         f"from these lengths")
