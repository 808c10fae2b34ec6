"""The six classes of bad (or odd) values the API fuzzer draws for a parameter, chosen by its annotation, default
and name (issue 46). Every value has a label and is rebuilt from it, so a case is reproducible from
``(api, param, cls, label)`` alone (the corpus stores nothing else).

Each value carries what must happen: ``refuse`` (a ``ValueError`` / ``TypeError`` naming the parameter) or
``either`` (refused like that, or a result that passes the API's invariant checker)."""
from __future__ import annotations

import inspect
import math
import re
from typing import Callable, NamedTuple

import numpy as np
import torch

CLASSES = ("sizes", "numeric", "device", "degenerate", "stale", "determinism", "callback")

# Names of counts whose work and memory must stay bounded by the data whatever their value.
_COUNT = re.compile(r"(size|capacity|num_|rows|_len$|len_|length$|max_|buffer|workers|steps|micro|world|dp_|cp_|"
                    r"tp_|chunk|multiple|window|group|budget|limit|seq_length|count|min_|take)")
_REAL = re.compile(r"(temperature|scal|eps|beta|softcap|dropout|ratio|coef|alpha|weight)")


class Value(NamedTuple):
    label: str
    make: Callable[[], object]
    expect: str  # "refuse" or "either"


def _annotation(param: inspect.Parameter) -> str:
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        return ""
    return ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))


def kind_of(param: inspect.Parameter) -> str:
    """count / int / real / bool / device / choice / data."""
    name, ann, default = param.name, _annotation(param), param.default
    if name in ("device", "target_device") or name.endswith("_device"):
        return "device"
    if isinstance(default, bool) or re.fullmatch(r"(Optional\[)?bool\]?", ann):
        return "bool"
    if (isinstance(default, int) and not isinstance(default, bool)) or re.search(r"\bint\b", ann):
        return "count" if _COUNT.search(name) else "int"
    if isinstance(default, float) or re.search(r"\bfloat\b", ann) or _REAL.search(name):
        return "real"
    if isinstance(default, str) or re.fullmatch(r"(Optional\[)?str\]?", ann):
        return "choice"
    return "data"


def _ints(base: int) -> list:
    return [Value("0", lambda: 0, "either"), Value("-1", lambda: -1, "either"),
            Value("2**31-1", lambda: 2**31 - 1, "either"), Value("2**31+1", lambda: 2**31 + 1, "either"),
            Value("2**53+1", lambda: 2**53 + 1, "either"), Value("2**62+1", lambda: 2**62 + 1, "either"),
            Value("2**63-1", lambda: 2**63 - 1, "either"), Value("2**64", lambda: 2**64, "either"),
            Value("nan", lambda: math.nan, "refuse"), Value("inf", lambda: math.inf, "refuse"),
            Value("-inf", lambda: -math.inf, "refuse"), Value("complex", lambda: complex(base, 0), "refuse"),
            Value("True", lambda: True, "refuse"), Value("False", lambda: False, "refuse"),
            Value("np.bool_", lambda: np.bool_(True), "refuse"),
            Value("np.int64(base)", lambda: np.int64(base), "either"),
            Value("np.float64(base+0.5)", lambda: np.float64(base + 0.5), "refuse"),
            Value("float(base)+0.5", lambda: base + 0.5, "refuse"),
            Value("tensor0d(base)", lambda: torch.tensor(base), "either"),
            Value("tensor0d(base+0.5)", lambda: torch.tensor(base + 0.5), "refuse"),
            Value("str(base)", lambda: str(base), "refuse")]


def _reals(base: float, nan: str = "refuse") -> list:
    return [Value("0.0", lambda: 0.0, "either"), Value("-1.0", lambda: -1.0, "either"),
            Value("1e-310", lambda: 1e-310, "either"), Value("1e308", lambda: 1e308, "either"),
            Value("nan", lambda: math.nan, nan), Value("inf", lambda: math.inf, "either"),
            Value("-inf", lambda: -math.inf, "either"), Value("complex", lambda: complex(base, 1), "refuse"),
            Value("True", lambda: True, "refuse"), Value("False", lambda: False, "refuse"),
            Value("np.float64(base)", lambda: np.float64(base), "either"),
            Value("tensor0d(base)", lambda: torch.tensor(base), "either"),
            Value("tensor1d", lambda: torch.tensor([base, base]), "refuse"),
            Value("str(base)", lambda: str(base), "refuse")]


def _bools() -> list:
    return [Value("1", lambda: 1, "refuse"), Value("0", lambda: 0, "refuse"), Value("'no'", lambda: "no", "refuse"),
            Value("np.bool_", lambda: np.bool_(True), "either"), Value("tensor(True)", lambda: torch.tensor(True),
                                                                         "either"),
            Value("2.0", lambda: 2.0, "refuse")]


def _devices() -> list:
    out = [Value("'meta'", lambda: "meta", "refuse"), Value("'bogus'", lambda: "bogus", "refuse"),
           Value("'cuda:99'", lambda: "cuda:99", "refuse"), Value("True", lambda: True, "refuse"),
           Value("1.5", lambda: 1.5, "refuse")]
    if not torch.cuda.is_available():
        out += [Value("'cuda'", lambda: "cuda", "refuse"), Value("0", lambda: 0, "refuse")]
    return out


def _choices(key: bool = False) -> list:
    """A choice among names refuses an unknown one; a key name (``input_key``) is any str, so only non-str fail."""
    named = "either" if key else "refuse"
    return [Value("'bogus'", lambda: "bogus", named), Value("''", lambda: "", named),
            Value("3", lambda: 3, "refuse"), Value("True", lambda: True, "refuse")]


def _numeric_strings() -> list:
    """Command-line numbers: what a shell can pass."""
    return [Value(t, (lambda t=t: t), "either") for t in ("0", "-1", str(2**40), str(2**63), "1e400")] + \
        [Value(t, (lambda t=t: t), "refuse") for t in ("nan", "inf", "1.5x", "", "0x10")]


def drawn_kind(param: inspect.Parameter, base) -> str:
    """kind_of, refined by the baseline value of an unannotated parameter."""
    kind = kind_of(param)
    if kind == "data" and isinstance(base, bool):
        kind = "bool"
    elif kind == "data" and isinstance(base, (int, np.integer)):
        kind = "count" if _COUNT.search(param.name) else "int"
    elif kind == "data" and isinstance(base, float):
        kind = "real"
    return kind


def _to_meta(x):
    """``x`` with every tensor in it (a dict's values, a list's items) on the meta device: shapes, no data."""
    if isinstance(x, torch.Tensor):
        return x.to("meta")
    if isinstance(x, dict):
        return {k: _to_meta(v) for k, v in x.items()}
    if type(x) in (list, tuple):  # not a NamedTuple of metadata (a stale info is the stale class's)
        return type(x)(_to_meta(v) for v in x)
    return x


def _has_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.numel() > 0
    if isinstance(x, dict):
        return any(_has_tensor(v) for v in x.values())
    if type(x) in (list, tuple):
        return len(x) < 64 and any(_has_tensor(v) for v in x)
    return False


def draws(param: inspect.Parameter, base) -> list:
    """[(cls, Value)] for one parameter whose baseline value is ``base``."""
    kind = drawn_kind(param, base)
    if _has_tensor(base):  # issue 57: a meta tensor carries no data; refused by name, never NotImplementedError
        return [("device", Value("meta tensors", lambda b=base: _to_meta(b), "refuse"))]
    num = base if isinstance(base, (int, float)) and not isinstance(base, bool) else 1
    out = []
    if kind == "choice" and isinstance(base, str) and re.fullmatch(r"-?[0-9.]+", base):
        return [("sizes" if v.label == "2**40" else "numeric", v) for v in _numeric_strings()]
    if kind == "count":
        out += [("sizes", Value(f"2**{e}", (lambda e=e: 2**e), "either")) for e in (18, 31, 40)]
    if kind in ("count", "int"):
        out += [("numeric", v) for v in _ints(int(num))]
    elif kind == "real":
        # a NaN fill / pad value is a marker some users want (docs/reliability.md): accepted, and then checked
        nan = "either" if param.name in ("fill", "pad_value") else "refuse"
        out += [("numeric", v) for v in _reals(float(num), nan)]
    elif kind == "bool":
        out += [("numeric", v) for v in _bools()]
    elif kind == "device":
        out += [("device", v) for v in _devices()]
    elif kind == "choice":
        free = re.search(r"(_key|_prefix)$", param.name) is not None  # any str names a key or a metric prefix
        out += [("device" if "dtype" in param.name else "numeric", v) for v in _choices(free)]
    if "dtype" in param.name:
        out += [("device", Value("torch.complex64", lambda: torch.complex64, "refuse")),
                ("device", Value("'bogus'", lambda: "bogus", "refuse"))]
    return out


def _real(x) -> np.ndarray:
    return np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, np.float64).reshape(-1)


# What a user callback (a cost callable on an array of lengths) may return wrongly (issue 57): each must be refused,
# naming the callback's parameter. Built from the input so the length is right unless the label says otherwise.
_RETURNS = {
    "complex": lambda x: _real(x) + 1j,
    "nan": lambda x: np.full(len(_real(x)), np.nan),
    "inf": lambda x: np.full(len(_real(x)), np.inf),
    "negative": lambda x: -1.0 - _real(x),
    "short": lambda x: _real(x)[:-1] if len(_real(x)) else np.ones(1),
    "long": lambda x: np.concatenate([_real(x), [1.0]]),
    "bool": lambda x: _real(x) > 0,
    "str": lambda x: _real(x).astype(str),
    "None": lambda x: None,
    "tensor complex": lambda x: torch.from_numpy(_real(x)) + 1j,
    "tensor nan": lambda x: torch.full((len(_real(x)),), float("nan")),
    "overflow": lambda x: np.full(len(_real(x)), 1.7e308),
}


def callback_draws() -> list:
    """[(cls, Value)] of the bad returns: ``make()`` gives the callable. An overflowing sum (1.7e308 each) may also be
    a result (one sequence: no sum), so it is "either"."""
    return [("callback", Value(f"returns {label}", (lambda f=f: (lambda x, *a, **k: f(x))),
                               "either" if label == "overflow" else "refuse")) for label, f in _RETURNS.items()]
