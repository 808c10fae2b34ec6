"""Per-document stand-ins for the recurrent-layer kernels transformers calls with ``cu_seqlens`` / ``seq_idx``.

transformers 5.x decorates its torch reference of each kernel function (causal conv1d, the gated delta rule, KDA, the
Mamba2 chunked scan) with ``use_kernel_func_from_hub_with_fallback(name, package)``: with the package installed the
layer calls the package's kernel, which keeps packed documents apart through ``cu_seqlens`` / ``seq_idx``; without
it the torch reference runs, and a packed call is refused ("can't keep packed sequences apart"). The decorated
function is a module-level name of the modeling module, looked up by the layer at call time, so a stand-in replaces
that name. What the name holds depends on the version (a closure up to transformers 5.24; from 5.25, with the
``kernels`` package, an ``nn.Module`` instance around it): packkit finds transformers' wrapper inside it by the
wrapper's code object, read off a probe the installed decorator wraps, not by one layout. From 5.25 the package's
kernel runs only on the devices it supports; elsewhere (the CPU) the stand-in runs per document.

A stand-in runs the module's own function once per document (the documents of ``cu_seqlens``, ``cu_seq_lens_q`` or
``seq_idx``), each from a zero state, and concatenates the outputs: exact against each document run alone by
construction (the same function on the same tokens). It is installed only where the torch reference is in use;
where the package's kernel is, the arguments reach it unchanged.
"""
from __future__ import annotations

import functools
import inspect
from typing import NamedTuple, Optional

import torch

from .documents import BOUNDARY_KEYS, document_spans


class KernelSpec(NamedTuple):
    tokens: dict  # argument name -> its sequence dimension (the batch is dimension 0)
    output_dim: int  # sequence dimension of the output tensor (the first output when it returns a tuple)
    state_in: tuple = ()  # arguments that carry a recurrent state in: must be None on a packed call
    state_out: tuple = ()  # flags that ask for the final state: must be false on a packed call


_DELTA = KernelSpec({"query": 1, "key": 1, "value": 1, "g": 1, "beta": 1}, 1, ("initial_state",),
                    ("output_final_state",))
SPECS = {
    "causal_conv1d_fn": KernelSpec({"hidden_states": 2}, 2, ("initial_states",), ("return_final_states",)),
    "chunk_gated_delta_rule": _DELTA,
    "fused_recurrent_gated_delta_rule": _DELTA,
    "chunk_kda": _DELTA,
    "fused_recurrent_kda": _DELTA,
    "mamba_chunk_scan_combined": KernelSpec({"hidden_states": 1, "dt": 1, "B": 1, "C": 1, "z": 1}, 1,
                                            ("initial_states",), ("return_final_states",)),
    # transformers' torch reference returns None (the layer then runs conv1d + the chunked scan itself)
    "mamba_split_conv1d_scan_combined": KernelSpec({"zxbcdt": 1}, 1, ("initial_states",), ("return_final_states",)),
}
# Kernels transformers calls without cu_seqlens, though the package's kernel takes it: their callers pass the
# batch's cu_seq_lens_q only (KDA layers), so on the package's kernel it is handed on as cu_seqlens.
CU_SEQLENS_FROM_BATCH = ("chunk_kda", "fused_recurrent_kda")


class HubKernel(NamedTuple):
    """A module-level name bound by transformers' ``use_kernel_func_from_hub_with_fallback``."""
    module: object
    attr: str
    function: object  # what the module name holds (a function, or the ``kernels`` package's Func module)
    name: str  # the kernel's name (causal_conv1d_fn, chunk_gated_delta_rule, ...)
    package: str
    real: bool  # the package's kernel is in use (not the torch reference)
    params: tuple  # the parameters the decorator passes on to the implementation
    devices: Optional[tuple] = None  # device types the package's kernel runs on (None: every one)
    wrapper: object = None  # transformers' own wrapper function (its signature is the torch reference's)


# transformers' decorator is recognised by what it is: the code object of the wrapper it builds, read off a probe
# function decorated by the installed transformers (whatever layers the decorator puts around that wrapper: a bare
# closure up to 5.24, the ``kernels`` package's Func module around it from 5.25).
_WRAPPER_CODES = None
_SEARCH_DEPTH = 4  # layers of closures / modules / __wrapped__ searched around a module-level name


def _inner_functions(value):
    """Every function reachable from ``value`` through __wrapped__, closure cells and an nn.Module's forward,
    breadth first, ``_SEARCH_DEPTH`` layers deep (bounded: a module attribute is any object)."""
    seen, found, layer = set(), [], [value]
    for _ in range(_SEARCH_DEPTH):
        nxt = []
        for item in layer:
            if id(item) in seen or isinstance(item, type):
                continue
            seen.add(id(item))
            if inspect.isfunction(item):
                found.append(item)
                nxt.extend(c.cell_contents for c in (item.__closure__ or ()) if _cell_filled(c))
                wrapped = item.__dict__.get("__wrapped__")
                if wrapped is not None:
                    nxt.append(wrapped)
            elif isinstance(item, torch.nn.Module):
                forward = getattr(type(item), "forward", None)
                if inspect.isfunction(forward):
                    nxt.append(forward)
        layer = nxt
    return found


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _wrapper_codes() -> frozenset:
    global _WRAPPER_CODES
    if _WRAPPER_CODES is None:
        try:
            from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback
        except Exception:  # no transformers, or one without hub-kernel functions: nothing is decorated by it
            _WRAPPER_CODES = frozenset()
            return _WRAPPER_CODES

        def probe(x):
            return x

        decorated = use_kernel_func_from_hub_with_fallback("packkit_probe", "packkit_no_such_package")(probe)
        _WRAPPER_CODES = frozenset(f.__code__ for f in _inner_functions(decorated)
                                   if f is not probe and f.__dict__.get("__wrapped__") is probe)
    return _WRAPPER_CODES


def _wrapper_of(value):
    codes = _wrapper_codes()
    if not codes or not callable(value):
        return None
    return next((f for f in _inner_functions(value) if f.__code__ in codes), None)


def hub_kernel(function) -> Optional[tuple]:
    """(name, package, real, params, devices, wrapper) when ``function`` is bound by transformers' hub-kernel
    decorator, else None. A wrapper whose closure lacks the names packkit reads gives name None (refused by
    :func:`check_spec`: never a kernel left unpatched in silence)."""
    wrapper = _wrapper_of(function)
    if wrapper is None:
        return None
    cells = {name: c.cell_contents for name, c in zip(wrapper.__code__.co_freevars, wrapper.__closure__ or ())
             if _cell_filled(c)}
    if not {"func_name", "package", "is_new_implementation", "applicable_params"} <= set(cells):
        return None, None, False, (), None, wrapper
    devices = cells.get("supported_devices")
    return (cells["func_name"], cells["package"], bool(cells["is_new_implementation"]),
            tuple(cells["applicable_params"]), None if devices is None else tuple(devices), wrapper)


def torch_reference(value):
    """The torch reference under a hub-kernel name (what transformers' wrapper falls back to), or None."""
    wrapper = _wrapper_of(getattr(value, "__packkit_original__", value))
    return None if wrapper is None else wrapper.__dict__.get("__wrapped__")


def hub_kernels(module) -> list:
    """Every hub-kernel name of a modeling module, as :class:`HubKernel` (stand-ins packkit installed included:
    ``__packkit_original__`` names what they replace)."""
    found = []
    for attr, value in sorted(vars(module).items()):
        if isinstance(value, type) or not callable(value):
            continue
        original = getattr(value, "__packkit_original__", value)
        info = hub_kernel(original)
        if info is not None:
            found.append(HubKernel(module, attr, original, *info))
    return found


def _first_device(args, kwargs) -> Optional[str]:
    return next((a.device.type for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)


def _split(value, dim: int, row: int, start: int, end: int):
    index = [slice(None)] * value.dim()
    index[0] = slice(row, row + 1)
    index[dim] = slice(start, end)
    return value[tuple(index)]


def per_document(kernel: HubKernel):
    """The stand-in of ``kernel.function`` (the torch reference): one call per document of a packed call."""
    spec = SPECS[kernel.name]
    function = kernel.function
    signature = inspect.signature(kernel.wrapper or function)
    where = f"{kernel.module.__name__.rsplit('.', 1)[-1]}.{kernel.attr} ({kernel.name}, packkit per-document)"
    first = next(iter(spec.tokens))

    @functools.wraps(kernel.wrapper or function)
    def run(*args, **given):
        if kernel.real and _first_device(args, given) in kernel.devices:  # the package's kernel runs here
            if kernel.name in CU_SEQLENS_FROM_BATCH and given.get("cu_seqlens") is None \
                    and given.get("cu_seq_lens_q") is not None:
                given = {**given, "cu_seqlens": given["cu_seq_lens_q"]}
            return function(*args, **given)
        kwargs = {k: v for k, v in given.items() if k not in BOUNDARY_KEYS}
        bound = signature.bind_partial(*args, **kwargs)
        main = bound.arguments.get(first)
        if not isinstance(main, torch.Tensor):
            return function(*args, **given)
        rows, length = main.shape[0], main.shape[spec.tokens[first]]
        spans = document_spans(given, rows, length, where)
        if spans is None:  # not packed: the function as it was
            return function(*args, **given)
        for name in spec.state_in:
            if bound.arguments.get(name) is not None:
                raise ValueError(f"{where}: a packed call with {name} is refused: each document starts from a zero "
                                 "state (call the model with use_cache=False)")
        for name in spec.state_out:
            if bound.arguments.get(name):
                raise ValueError(f"{where}: a packed call with {name}=True is refused: the final state of one "
                                 "packed row is no document's (call the model with use_cache=False)")
        per_token = {name: dim for name, dim in spec.tokens.items() if isinstance(bound.arguments.get(name), torch.Tensor)}
        outputs, rest = {}, None
        for row, start, end in spans:
            call = dict(bound.arguments)
            for name, dim in per_token.items():
                call[name] = _split(call[name], dim, row, start, end)
            extra = call.pop(next((p.name for p in signature.parameters.values()
                                   if p.kind is inspect.Parameter.VAR_KEYWORD), "\0"), {})
            result = function(**call, **extra)
            if result is None:  # transformers' torch reference of a fused kernel: the layer runs the parts itself
                return None
            tensor = result[0] if isinstance(result, tuple) else result
            if isinstance(result, tuple):
                rest = result[1:]
            outputs.setdefault(row, []).append(tensor)
        rows_out = [torch.cat(outputs[row], dim=spec.output_dim) if row in outputs
                    else None for row in range(rows)]
        missing = [row for row, out in enumerate(rows_out) if out is None or out.shape[spec.output_dim] != length]
        if missing:
            raise ValueError(f"{where}: the documents do not cover row {missing[0]} of the batch")
        out = torch.cat(rows_out, dim=0)
        return (out, *(None for _ in rest)) if rest is not None else out

    run.__packkit_original__ = function
    return run


def cu_seqlens_adapter(kernel: HubKernel):
    """For a real KDA kernel: hand the batch's ``cu_seq_lens_q`` on as ``cu_seqlens`` (its callers pass only the
    former, which the kernel does not take)."""
    function = kernel.function

    @functools.wraps(kernel.wrapper or function)
    def run(*args, **kwargs):
        if kwargs.get("cu_seqlens") is None and kwargs.get("cu_seq_lens_q") is not None:
            kwargs["cu_seqlens"] = kwargs["cu_seq_lens_q"]
        return function(*args, **kwargs)

    run.__packkit_original__ = function
    return run


def stand_in(kernel: HubKernel):
    """What prepare_model installs for ``kernel``, or None (nothing to do)."""
    if kernel.real and kernel.devices is not None and kernel.name in SPECS:
        return per_document(kernel)  # the package's kernel on its devices, per document on the others (the CPU)
    if kernel.real:
        if kernel.name in CU_SEQLENS_FROM_BATCH and "cu_seqlens" in kernel.params:
            return cu_seqlens_adapter(kernel)
        return None
    if kernel.name in SPECS:
        return per_document(kernel)
    return None


def check_spec(kernel: HubKernel) -> Optional[str]:
    """Why the stand-in cannot run ``kernel`` (its torch reference names its arguments otherwise), or None."""
    if kernel.name is None:
        return (f"{kernel.module.__name__}.{kernel.attr} is wrapped by transformers' hub-kernel decorator in a form "
                "packkit does not know (its closure lacks func_name / package): no per-document stand-in")
    if kernel.real and kernel.devices is None or kernel.name not in SPECS:
        return None
    params = inspect.signature(kernel.wrapper or kernel.function).parameters
    missing = [name for name in SPECS[kernel.name].tokens if name not in params]
    if next(iter(SPECS[kernel.name].tokens)) in missing:
        return (f"{kernel.module.__name__}.{kernel.attr} ({kernel.name}) has no argument "
                f"{next(iter(SPECS[kernel.name].tokens))!r}: packkit's per-document stand-in does not know this version")
    return None
