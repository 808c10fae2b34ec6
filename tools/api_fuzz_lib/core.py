"""The API fuzzer's model: an ``Api`` (a valid baseline call and its invariant checker), the cases drawn for it,
and how one case is judged (in the child process that runs it)."""
from __future__ import annotations

import inspect
import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional

from .values import Value, callback_draws, drawn_kind, draws

CLEAR = (ValueError, TypeError)


@dataclass
class Variant:
    """A hand-registered case of the classes the signature cannot tell (degenerate input, stale metadata,
    determinism): ``mutate(kwargs)`` returns the call's keyword arguments (or ``run(api, kwargs)`` does the whole
    call, e.g. twice with the executor's order perturbed, and returns its result)."""
    cls: str
    param: str
    label: str
    expect: str
    mutate: Optional[Callable[[dict], dict]] = None
    run: Optional[Callable] = None


@dataclass
class Api:
    name: str
    fn: Callable                      # whose signature is walked
    baseline: Callable[[], dict]      # a small valid call, as keyword arguments (built fresh in the child)
    check: Callable[[object, dict], None]  # raises (AssertionError) unless the result is right for those arguments
    call: Optional[Callable] = None   # call(**kwargs) -> result; default fn
    skip: tuple = ()                  # parameters not drawn (documented per API why)
    aliases: dict = field(default_factory=dict)  # param -> other words a clear message may name it by
    callbacks: tuple = ()             # parameters taking a user callback (a cost callable): fed bad returns
    variants: list = field(default_factory=list)

    def invoke(self, kwargs: dict):
        return (self.call or self.fn)(**kwargs)

    def params(self) -> list:
        try:
            sig = inspect.signature(self.fn)
        except (TypeError, ValueError):
            return []
        return [p for p in sig.parameters.values()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in self.skip and p.name != "self"]

    def cases(self) -> list:
        """[(param, cls, label, expect)], baseline first."""
        out = [("-", "baseline", "valid", "accept")]
        base = self.baseline()
        for p in self.params():
            value = base.get(p.name, p.default)
            out += [(p.name, cls, v.label, v.expect) for cls, v in draws(p, value)]
        out += [(name, cls, v.label, v.expect) for name in self.callbacks for cls, v in callback_draws()]
        out += [(v.param, v.cls, v.label, v.expect) for v in self.variants]
        return out

    def value(self, param: str, label: str) -> Value:
        if param in self.callbacks and label.startswith("returns "):
            return next(v for _, v in callback_draws() if v.label == label)
        base = self.baseline()
        for p in self.params():
            if p.name == param:
                for _, v in draws(p, base.get(p.name, p.default)):
                    if v.label == label:
                        return v
        raise KeyError(f"{self.name}: no value {label!r} for {param!r}")

    def variant(self, cls: str, param: str, label: str) -> Variant:
        for v in self.variants:
            if (v.cls, v.param, v.label) == (cls, param, label):
                return v
        raise KeyError(f"{self.name}: no variant {param}/{label}")


def _names(exc: BaseException, param: str, aliases: tuple) -> bool:
    text = str(exc)
    return any(word in text for word in (param, *aliases))


def judge(api: Api, param: str, cls: str, label: str, expect: str) -> dict:
    """Runs one case here (the child) and says what happened: ``outcome`` is ``clear`` (refused by name),
    ``checked`` (a result that passed the checker) or ``fail``, with ``detail``."""
    try:
        kwargs = api.baseline()
        run = None
        if cls == "baseline":
            pass
        elif any((v.cls, v.param, v.label) == (cls, param, label) for v in api.variants):
            variant = api.variant(cls, param, label)
            kwargs = variant.mutate(kwargs) if variant.mutate else kwargs
            run = variant.run
        else:
            kwargs[param] = api.value(param, label).make()
    except Exception as exc:  # noqa: BLE001 - a harness error is reported as such, never as a pass
        return {"outcome": "fail", "detail": f"harness: {type(exc).__name__}: {exc}"}
    words = (param, *api.aliases.get(param, ()))
    out = _judged(api, kwargs, run, words, expect)
    if out["outcome"] == "fail" and (api.name, param, label) in OPEN:  # found, reported, its fix not ours to make
        out = {"outcome": "checked", "detail": f"open: {OPEN[(api.name, param, label)]} (was: {out['detail']})"[:400]}
    # issue 57: over a few tokens, work and memory are bounded by the data, not a size argument
    if _sized(api, param, cls, label) and (api.name, param) not in SIZES_OPEN:
        cpu, grown = out.pop("_cpu", 0.0), out.pop("_grown_mb", 0.0)
        if cpu > SIZES_CPU_S and grown <= SIZES_MB:  # CPU once more after a warm-up call (a first call's lazy
            try:                                      # imports are not the size argument's); memory is the first
                api.invoke(api.baseline())            # call's: the peak RSS it measures cannot be reset
            except Exception:  # noqa: BLE001 - the baseline case reports it
                pass
            kwargs = api.baseline()
            kwargs[param] = api.value(param, label).make()
            out = _judged(api, kwargs, run, words, expect)
            cpu = out.pop("_cpu", 0.0)
        if cpu > SIZES_CPU_S or grown > SIZES_MB:
            return {"outcome": "fail", "detail": f"out of proportion to the data: {cpu:.2f} s CPU, +{grown:.0f} MB "
                    f"for {param}={label} (allowed: < {SIZES_CPU_S} s, < {SIZES_MB} MB); was {out['detail']}"[:400]}
    out.pop("_cpu", None), out.pop("_grown_mb", None)
    return out


SIZES_CPU_S, SIZES_MB = 0.5, 200  # the "sizes" oracle: per call over the baseline's few tokens
# The numeric class's huge ints, when drawn for a count (a size argument), are held to the same bound.
HUGE = {"2**31-1", "2**31+1", "2**53+1", "2**62+1", "2**63-1", "2**64"}
# Sizes the oracle finds whose fix is still open (none: packed_seq_params' cp_size is bounded at 2**16 now).
SIZES_OPEN: set = set()
# Failures found and reported whose fix lies in a file another change owns (docs/reliability.md lists each).
OPEN: dict = {}


def _sized(api: Api, param: str, cls: str, label: str) -> bool:
    if cls == "sizes":
        return True
    if cls != "numeric" or label not in HUGE:
        return False
    base = api.baseline()
    return any(p.name == param and drawn_kind(p, base.get(p.name, p.default)) == "count" for p in api.params())


def _judged(api: Api, kwargs: dict, run, words: tuple, expect: str) -> dict:
    import resource
    import time

    rss0, cpu0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
    out = _judge_call(api, kwargs, run, words, expect)
    out["_cpu"] = time.process_time() - cpu0
    out["_grown_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    return out


def _judge_call(api: Api, kwargs: dict, run, words: tuple, expect: str) -> dict:
    try:
        result = run(api, kwargs) if run else api.invoke(kwargs)
    except CLEAR as exc:
        text = f"{type(exc).__name__}: {exc}"[:400]
        if expect == "accept":
            return {"outcome": "fail", "detail": f"refused a valid call: {text}"}
        if not _names(exc, words[0], words[1:]):
            return {"outcome": "fail", "detail": f"message does not name {words[0]!r}: {text}"}
        return {"outcome": "clear", "detail": text}
    except MemoryError:
        return {"outcome": "fail", "detail": "MemoryError: allocation out of proportion to the input"}
    except Exception as exc:  # noqa: BLE001 - any other type is the finding
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"outcome": "fail", "detail": f"{type(exc).__name__} (not a clear error) at "
                f"{where.filename.rsplit('/', 1)[-1]}:{where.lineno}: {exc}"[:400]}
    if expect == "refuse":
        return {"outcome": "fail", "detail": f"accepted silently: {type(result).__name__}"}
    try:
        api.check(result, kwargs)
    except Exception as exc:  # noqa: BLE001
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"outcome": "fail", "detail": f"wrong result ({type(exc).__name__} at line {where.lineno}: "
                f"{exc})"[:400]}
    return {"outcome": "checked", "detail": "ok"}
