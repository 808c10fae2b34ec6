"""CPU shims for torchtitan 0.3.0's trainer, used only by tests/test_torchtitan_entry.py and
tests/test_torchtitan_pp_entry.py (imported in the child by
tests/entry_site/sitecustomize.py when ``PACKKIT_TT_PROBE`` is set, before ``torchtitan.train`` runs).

``python -m torchtitan.train`` has no CPU device. Each shim replaces one GPU-only piece of torchtitan's runtime (or
a torch 2.13 gap); none touches packkit, the dataloader or the data path:

1. device: ``torchtitan.tools.utils`` picks ``"cuda"`` when no accelerator is found; here ``"cpu"``, with a
   ``torch.cuda``-like module (``set_device``, ``current_device`` -> 0 for gloo's barrier, ``synchronize``).
2. memory statistics: that module's ``memory_stats`` / ``get_device_properties`` / ``reset_peak_memory_stats``,
   which torchtitan's metrics read every step (``torch.cpu`` has none); they report nothing (0 bytes).
3. Flex backward: torch refuses FlexAttention's backward on CPU; attention runs as SDPA under the dense mask of the
   same ``BlockMask``'s ``mask_mod`` (torchtitan's causal + per-document mask from the batch's positions).
4. torchtitan compiles ``create_block_mask`` with inductor, a C++ build costing ~30 s of CPU here: it runs eagerly.
5. ``torch.distributed.set_timeout`` (torchtitan calls it after step 1) is missing in torch 2.13: set through
   ``distributed_c10d._set_pg_timeout``.
6. gloo has no ``ReduceOp.PREMUL_SUM``, which FSDP's reduce-scatter uses once torchtitan sets the gradient divide
   factor to 1 (it normalises by the global token count itself); with more than one rank, FSDP is told to reduce
   with a plain SUM, the same sum (a factor of 1 divides nothing).
7. torchtitan imports ``torch.utils.tensorboard`` unconditionally; where tensorboard is not installed (CI's venv) a
   stub whose ``SummaryWriter`` refuses use stands in (``metrics.enable_tensorboard`` stays False).
8. pre-split micro-batches (pipeline parallelism only, tests/test_torchtitan_pp_entry.py): torchtitan 0.3.0's
   ``Trainer.pp_forward_backward_step`` calls ``pp_schedule.step(arg_mbs=, kwarg_mbs=, target_mbs=, ...)``, an API
   torch 2.13.0's schedules lack (``PipelineScheduleSingle.step`` / ``PipelineScheduleMulti.step`` take a whole
   batch, ``*args, target=, **kwargs``, and chunk it; the three names would land in ``**kwargs``). With those
   names, ``step`` runs its own bookkeeping and hands the lists unchanged to the schedule's own
   ``_step_microbatches(arg_mbs, kwarg_mbs, target_mbs, ...)``, which torch 2.13.0 has: torch chunks nothing, each
   micro-batch reaches its stage as torchtitan built it. Without them, ``step`` is torch's.
9. varlen attention (``attn_backend="varlen"`` only): torch's ``varlen_attn`` runs FlashAttention's varlen kernel,
   which has no CPU implementation (``aten::_flash_attention_forward``: NotImplementedError on the CPU backend).
   Here it is causal SDPA over each ``[cu_seq_q[i], cu_seq_q[i + 1])`` slice of the packed ``(T, heads, dim)``
   tensors (keys from ``cu_seq_k``), in fp32 on torchtitan's bf16 inputs, returned in their dtype: the kernel's
   contract, reading the offsets as addresses as CUDA does. Only causal, full-window, no-lse calls are served.
"""
from __future__ import annotations

import sys
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F

try:
    import tensorboard  # noqa: F401
except ModuleNotFoundError:
    class _NoSummaryWriter:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("tensorboard is not installed (test stub of torchtitan_cpu_shims)")

    _stub = types.ModuleType("torch.utils.tensorboard")
    _stub.SummaryWriter = _NoSummaryWriter
    sys.modules["torch.utils.tensorboard"] = _stub

# 7 above; 1 + 2: before any torchtitan module binds ``device_type`` / ``device_module`` by name.
import torchtitan.tools.utils as _tt_utils  # noqa: E402

CPU_DEVICE = types.SimpleNamespace(
    is_available=lambda: True,
    device_count=lambda: 1,
    set_device=lambda device: None,
    current_device=lambda: 0,
    synchronize=lambda device=None: None,
    empty_cache=lambda: None,
    get_device_name=lambda device=None: "cpu",
    get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=1 << 30),
    reset_peak_memory_stats=lambda device=None: None,
    memory_stats=lambda device=None: {},
)
_tt_utils.device_type, _tt_utils.device_module = "cpu", CPU_DEVICE

# 3 + 4
from torch.nn.attention.flex_attention import AuxOutput, create_block_mask, create_mask  # noqa: E402

import torchtitan.models.common.attention as _tt_attention  # noqa: E402


def _flex_as_sdpa(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux, kernel_options):
    if score_mod is not None or return_aux.lse:
        raise NotImplementedError("torchtitan_cpu_shims: only mask-only FlexAttention without lse")
    mask = create_mask(block_mask.mask_mod, q.shape[0], 1, q.shape[-2], k.shape[-2], device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa), AuxOutput()


_tt_attention.FlexAttention._compiled_flex_attn = _flex_as_sdpa
_tt_attention._compiled_create_block_mask = create_block_mask

# 5
if not hasattr(dist, "set_timeout"):
    from torch.distributed import distributed_c10d as _c10d

    def _set_timeout(timeout, group=None):
        _c10d._set_pg_timeout(timeout, group)

    dist.set_timeout = _set_timeout

# 6
import torchtitan.distributed.fsdp as _tt_fsdp  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402

_disable_division = _tt_fsdp.disable_fsdp_gradient_division


def _disable_division_summing(model):
    _disable_division(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


_tt_fsdp.disable_fsdp_gradient_division = _disable_division_summing

# 8
from torch.distributed.pipelining import schedules as _schedules  # noqa: E402

_PRE_SPLIT = ("arg_mbs", "kwarg_mbs", "target_mbs")


def _accept_pre_split(cls):
    step = cls.step

    def pre_split_step(self, *args, target=None, losses=None, return_outputs=True, loss_kwargs=None, **kwargs):
        if not any(k in kwargs for k in _PRE_SPLIT):
            return step(self, *args, target=target, losses=losses, return_outputs=return_outputs,
                        loss_kwargs=loss_kwargs, **kwargs)
        arg_mbs, kwarg_mbs, target_mbs = (kwargs.pop(k, None) for k in _PRE_SPLIT)
        if args or kwargs or target is not None:
            raise TypeError("torchtitan_cpu_shims: pre-split micro-batches and whole-batch inputs together")
        n = self._n_microbatches
        run = self._step_microbatches
        self._split_inputs = lambda _a, _k: (arg_mbs if arg_mbs is not None else [()] * n,
                                             kwarg_mbs if kwarg_mbs is not None else [{}] * n)
        self._step_microbatches = lambda a, k, _t, l, r, loss_kwargs=None: run(a, k, target_mbs, l, r,
                                                                               loss_kwargs=loss_kwargs)
        try:
            return step(self, target=None, losses=losses, return_outputs=return_outputs, loss_kwargs=loss_kwargs)
        finally:
            del self._split_inputs, self._step_microbatches

    cls.step = pre_split_step


_accept_pre_split(_schedules.PipelineScheduleSingle)
_accept_pre_split(_schedules.PipelineScheduleMulti)

# 9
def _cpu_varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, 0),
                     enable_gqa=False, return_aux=None, **_kernel_options):
    if return_aux is not None or tuple(window_size) != (-1, 0):
        raise NotImplementedError("torchtitan_cpu_shims: only causal, full-window varlen attention without lse")
    out = []
    cq, ck = cu_seq_q.tolist(), cu_seq_k.tolist()
    for (qa, qb), (ka, kb) in zip(zip(cq[:-1], cq[1:]), zip(ck[:-1], ck[1:]), strict=True):
        qi, ki, vi = (t.transpose(0, 1).float() for t in (q[qa:qb], k[ka:kb], v[ka:kb]))  # (heads, len, dim)
        out.append(F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale,
                                                  enable_gqa=enable_gqa).transpose(0, 1).to(q.dtype))
    return torch.cat(out) if out else q.new_zeros(q.shape[:-1] + v.shape[-1:])


_tt_attention.varlen_attn = _cpu_varlen_attn
