"""Argument rules of ``packkit.shared_prefix``: every public function validates its arguments here, whatever
the path (with or without ``capacity``), before anything is planned, allocated or launched.

Host data (lists, numpy, CPU tensors) is checked at once and refused with a ValueError / TypeError that names
the argument. Device data is never read back: what can only be known from its values (a negative token id in
a GPU tensor, a verl ``attention_mask`` holding 2, prompts of one uid that differ) sets a bit of a 0-d int32
``status`` tensor on the device (``info.status``; :func:`check_status` reads it at a point of your choosing),
as :func:`packkit.check_plan` does with ``sync=False``. The planner's own checks (``_as_count``,
``check_plan_choices``, ``_cost_model``) are reused, so a value is refused with the message the planner gives.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import numpy as np
import torch

from ..planning.planner import _as_count, _cost_model, check_plan_choices
from .tree import TOKEN_DTYPES, PrefixForest

# A row of capacity C costs C slots in every [R, C] output tensor whatever it holds; a call may allocate at most
# max(PAD_SLOTS_FLOOR, PAD_SLOTS_PER_TOKEN * tokens) slots (e.g. capacity=1e8 for 11 tokens is refused; 64 ranks
# of 65,536 still fit the floor; a real plan fills > 1/4 of its slots even with a last step of empty ranks).
PAD_SLOTS_FLOOR = 1 << 22
PAD_SLOTS_PER_TOKEN = 4
# Rows cost host work each (plan bins, layout); a non-empty row holds a token, so only dp_size's idle-rank rows can
# outnumber the tokens: at most max(ROWS_FLOOR, tokens) rows (dp_size=2**20 at capacity 4 took 6 s and 1 GB).
ROWS_FLOOR = 1 << 16
# logits / temperature must stay finite: below this, fp32 logits of ~1e3 overflow towards inf and give NaN.
MIN_TEMPERATURE = 1e-6
OVERLONG = ("error", "truncate")
INT64_MAX = (1 << 63) - 1

STATUS_ERRORS = {
    1: "rows of one group id have prompt tokens that differ from the group's first row (wrong uid?)",
    2: "attention_mask holds a value other than 0 and 1",
    4: "a packed token id is negative (token ids index the embedding: they must be >= 0)",
    8: "rows of one group id have vision inputs (pixel values, grids) that differ from the group's first row",
    16: "attention_mask is not the run the given layout recorded (a layout of another batch of the same shape?)",
}


def status_errors(status) -> list[str]:
    """The messages of the bits set in a shared-prefix status (int or 0-d tensor; one sync for a GPU tensor)."""
    if not isinstance(status, (numbers.Integral, torch.Tensor)) or isinstance(status, bool):
        raise TypeError(f"status must be an int or a 0-d tensor (info.status), got {type(status).__name__}")
    if isinstance(status, torch.Tensor) and (status.numel() != 1 or status.is_floating_point() or status.is_complex()
                                             or status.dtype == torch.bool):  # 3.5 was read as 3
        raise TypeError(f"status must be an integer 0-d tensor (info.status), got {status.dtype} {tuple(status.shape)}")
    code = int(status)
    return [message for bit, message in STATUS_ERRORS.items() if code & bit]


def check_status(info) -> None:
    """Raise ValueError naming every problem the device found (reads ``info.status``: one sync on a GPU).
    ``info``: a :class:`SharedPrefixInfo` or :class:`RolloutGroupsInfo`; a None status means all was checked
    on the host already."""
    status = getattr(info, "status", None)
    if status is not None and int(status):
        raise ValueError("shared-prefix batch refused: " + "; ".join(status_errors(status)))


def check_choice(value, name: str, allowed, note: str = "") -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(allowed)}{note}")


def check_overlong(overlong) -> None:
    check_choice(overlong, "overlong policy", OVERLONG, " (shared-prefix packing never drops a tree)")


def check_plan_args(capacity, *, algorithm, dp_size, cost, overlong) -> Optional[int]:
    """The planner arguments of ``pack_groups`` / ``pack_tree`` / ``plan_trees``, checked whether or not
    ``capacity`` is given (without it they would otherwise go unread). Returns capacity as an int or None."""
    if capacity is not None:
        capacity = _as_count(capacity, "capacity")
    dp_size = _as_count(dp_size, "dp_size")
    check_plan_choices(algorithm, "error")  # the planner's own check and message
    check_overlong(overlong)
    check_cost(cost)
    if capacity is None and dp_size != 1:
        raise ValueError(f"dp_size={dp_size} needs capacity: without it every tree goes in one row, for one rank")
    return capacity


def check_cost(cost) -> None:
    """``cost`` as the planner takes it ('tokens', 'attention', (a, b), a transformers config or a callable)."""
    if isinstance(cost, (np.ndarray, torch.Tensor)):  # `cost in (...)` / `cost != ...` would be elementwise
        raise TypeError(f"cost must be 'tokens', 'attention', a pair (a, b), a transformers config or a callable; "
                        f"got a {type(cost).__name__} (pass a tuple (a, b))")
    _cost_model(cost)


def check_allocation(slots: int, tokens: int, what: str, rows: int = 1) -> None:
    """Refuse a batch of ``slots`` token slots (rows x row_len), or of ``rows`` rows, out of proportion to its
    ``tokens``."""
    if rows > max(ROWS_FLOOR, int(tokens)):
        raise ValueError(f"{what} would make {rows:,} rows for {int(tokens):,} tokens; at most max({ROWS_FLOOR:,}, "
                         "tokens) are allowed (lower dp_size)")
    allowed = max(PAD_SLOTS_FLOOR, PAD_SLOTS_PER_TOKEN * int(tokens))
    if slots > allowed:
        raise ValueError(f"{what} would allocate {slots:,} token slots per batch tensor for {int(tokens):,} tokens; "
                         f"at most max({PAD_SLOTS_FLOOR:,}, {PAD_SLOTS_PER_TOKEN} x tokens) = {allowed:,} are "
                         "allowed (lower capacity or dp_size)")


def check_pad_id(pad_id, token_dtype: torch.dtype = torch.int64) -> int:
    if isinstance(pad_id, (bool, np.bool_)) or not isinstance(pad_id, numbers.Integral):
        raise TypeError(f"pad_id must be an int (a token id), got {type(pad_id).__name__} {pad_id!r}")
    top = INT64_MAX if token_dtype == torch.int64 else torch.iinfo(token_dtype).max
    if not 0 <= int(pad_id) <= top:
        raise ValueError(f"pad_id must be a token id in [0, {top}] (it is fed to the embedding like any "
                         f"token; {str(token_dtype).replace('torch.', '')} tokens), got {pad_id}")
    return int(pad_id)


def check_device(device, name: str = "device") -> Optional[torch.device]:
    """``device`` as a torch.device (None stays None); a CUDA device must exist here."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)) and not (isinstance(device, numbers.Integral)
                                                             and not isinstance(device, bool)):
        raise TypeError(f"{name} must be a torch.device, a string such as 'cuda:0' or a CUDA index, got "
                        f"{type(device).__name__} {device!r}")
    if isinstance(device, numbers.Integral) and not torch.cuda.is_available():  # torch.device(0) is CUDA's
        raise ValueError(f"{name}={device!r} (a CUDA index) but no CUDA device is available here")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{name}={device!r} is not a device ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}={device!r}: packkit packs on CPU or CUDA devices")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={device!r} but no CUDA device is available here (torch.cuda.is_available() "
                             "is False)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={device!r} but there are {torch.cuda.device_count()} CUDA devices")
    return dev


def check_real(value, name: str, *, low: float, low_open: bool = False, high: float = math.inf) -> float:
    """A finite real number (Python, numpy or a 0-d tensor on the host) in the given range; bools refused."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.device.type == "cpu" \
            and (value.is_floating_point() or value.dtype in (torch.int64, torch.int32)):
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < low or (low_open and v == low) or v > high:
        bound = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high != math.inf else "")
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")
    return v


def check_temperature(temperature) -> float:
    return check_real(temperature, "temperature", low=MIN_TEMPERATURE)


def check_float_tensor(value, name: str, shape_hint: str) -> torch.Tensor:
    """A real floating tensor (fp16 / bf16 / fp32 / fp64): no int, bool or complex values are cast silently."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {shape_hint}, got {type(value).__name__}"
                        + (" (use torch.from_numpy)" if isinstance(value, np.ndarray) else ""))
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor (float16, bfloat16, float32 or float64), got {value.dtype}")
    return value


def as_values(value, name: str, like: torch.Tensor) -> torch.Tensor:
    """A real per-sequence / per-token value (tensor, numpy or list of numbers) on ``like``'s device and dtype;
    int values are exact in float and accepted, bool / complex / object are refused."""
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, (np.ndarray, list, tuple)):
        try:
            arr = np.asarray(value)
        except ValueError as exc:
            raise ValueError(f"{name} must be a rectangular array of numbers ({exc})") from None
        if arr.dtype.kind not in "iuf":
            raise TypeError(f"{name} must hold real numbers, got numpy dtype {arr.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(arr, np.float64))
    else:
        raise TypeError(f"{name} must be a tensor, numpy array or list of numbers, got {type(value).__name__}")
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}")
    if t.device != like.device and t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device} but the log-probs are on {like.device}")
    return t.to(device=like.device, dtype=like.dtype)


def check_shape(t: torch.Tensor, name: str, allowed: list) -> None:
    """``t.shape`` must be one of ``allowed`` exactly (no broadcasting of a [1, W] or [W] into [N, W])."""
    if tuple(t.shape) not in [tuple(a) for a in allowed]:
        options = " or ".join(str(list(a)) for a in allowed)
        raise ValueError(f"{name} must have shape {options}, got {list(t.shape)}")


def check_forest(forest, name: str = "forest") -> None:
    """ValueError / TypeError unless ``forest`` is a consistent :class:`PrefixForest` (preorder parents, every node
    inside ``tokens``, every sequence's node and score start in range): a hand-made forest must not make the pack
    op read outside its tokens. Host arrays only (O(nodes + sequences), no device read)."""
    if not isinstance(forest, PrefixForest):
        raise TypeError(f"{name} must be a PrefixForest (from build_tree / groups_forest), got {type(forest).__name__}")
    arrays = {}
    for field in ("parent", "length", "src", "seq_node", "score_start", "seq_group"):
        a = getattr(forest, field)
        if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype.kind not in "iu":
            raise TypeError(f"{name}.{field} must be a 1-D integer numpy array, got "
                            f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")
        arrays[field] = a.astype(np.int64, copy=False)
    m, n = len(arrays["parent"]), len(arrays["seq_node"])
    for field, size in (("length", m), ("src", m), ("score_start", n), ("seq_group", n)):
        if len(arrays[field]) != size:
            raise ValueError(f"{name}.{field} has {len(arrays[field])} entries, expected {size}")
    tokens = forest.tokens
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.dtype not in TOKEN_DTYPES:
        raise TypeError(f"{name}.tokens must be a 1-D int64 or int32 tensor, got "
                        f"{getattr(tokens, 'dtype', type(tokens).__name__)} {tuple(getattr(tokens, 'shape', ()))}")
    if forest.labels is not None and (not isinstance(forest.labels, torch.Tensor)
                                      or tuple(forest.labels.shape) != tuple(tokens.shape)
                                      or forest.labels.is_floating_point() or forest.labels.dtype == torch.bool):
        raise ValueError(f"{name}.labels must be None or an integer tensor shaped like {name}.tokens")
    parent, length, src = arrays["parent"], arrays["length"], arrays["src"]
    bad = np.flatnonzero((parent < -1) | (parent >= np.arange(m)))
    if len(bad):
        raise ValueError(f"{name}.parent[{int(bad[0])}] = {int(parent[bad[0]])}: nodes must be in preorder "
                         "(-1 for a root, else an earlier node)")
    bad = np.flatnonzero((length < 0) | (src < 0) | (src + length > tokens.numel()))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{name} node {i} (src={int(src[i])}, length={int(length[i])}) is not inside its "
                         f"{tokens.numel()} tokens")
    seq_node = arrays["seq_node"]
    if n and (seq_node.min() < 0 or seq_node.max() >= m):
        raise ValueError(f"{name}.seq_node names a node outside [0, {m})")
    lens = forest.sequence_lengths() if n else np.zeros(0, np.int64)
    bad = np.flatnonzero((arrays["score_start"] < 0) | (arrays["score_start"] > lens))
    if len(bad):
        s = int(bad[0])
        raise ValueError(f"{name}.score_start[{s}] = {int(arrays['score_start'][s])} is outside sequence {s} of "
                         f"{int(lens[s])} tokens")
