"""torchtitan's pipeline-parallel path with packkit's rows (issue 61 part 4; imports torchtitan).

Under ``parallelism.pipeline_parallel_degree > 1`` torchtitan 0.3.0's ``Trainer`` builds the dataloader with
``local_batch_size = pipeline_parallel_microbatch_size`` and fetches one loader batch per micro-batch
(``Trainer.train_step``); ``post_dataloading_process`` runs on each of them, so each micro-batch's ``positions`` and
attention masks (Flex ``BlockMask`` or varlen ``VarlenMetadata``, whose ``cu_seq_q`` torchtitan builds from that
micro-batch's positions) are its own, and ``pp_forward_backward_step`` hands them to ``schedule.step`` as
``kwarg_mbs`` (pre-split: torch chunks nothing). :class:`~packkit.integrations.torchtitan.PackkitDataLoader` needs
no change for it: every batch it yields is a packed micro-batch of whole documents, positions restarting per
document.

What can still go wrong is the torchtitan PR 4098 form: attention metadata built once for the whole local batch
and chunked along dim 0 by the schedule (micro-batch 1 gets offsets into micro-batch 0's tokens; CUDA's varlen
kernel reads them as addresses). :func:`guard_pipeline_stages` puts packkit's check on every stage module, before
attention reads its kwargs; :class:`~packkit.integrations.torchtitan.PackkitTrainer` (``trainer.py``) is torchtitan's
``Trainer`` with that guard on its model parts.
"""
from __future__ import annotations


import torch

from ...training.pipeline.guard import HINT, check_microbatch

try:
    from torch.nn.attention.flex_attention import BlockMask
    from torchtitan.models.common.attention import VarlenMetadata
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without torchtitan
    raise ModuleNotFoundError("packkit.integrations.torchtitan needs torchtitan (pip install 'packkit[torchtitan]')",
                              name=exc.name) from exc


def _masks(attention_masks):
    if attention_masks is None:
        return []
    if isinstance(attention_masks, (BlockMask, VarlenMetadata)):
        return [("attention_masks", attention_masks)]
    if isinstance(attention_masks, dict):  # per-layer-type masks (torchtitan's Mapping form)
        return [(f"attention_masks[{k!r}]", v) for k, v in attention_masks.items() if v is not None]
    raise TypeError(f"attention_masks of type {type(attention_masks).__name__} is not a BlockMask, VarlenMetadata or "
                    f"a dict of them")


def check_stage_kwargs(x: torch.Tensor, positions=None, attention_masks=None) -> None:
    """Check that a stage's ``positions`` / ``attention_masks`` belong to its input ``x`` (token ids ``(B, L)`` on
    the first stage, hidden states ``(B, L, ...)`` after): positions ``(B, L)`` restarting at 0 at every row start
    and rising by one inside a document; a ``VarlenMetadata``'s ``cu_seq_q`` / ``cu_seq_k`` from 0 to ``B * L``
    with every offset at a document start (:func:`packkit.training.pipeline.check_microbatch`); a ``BlockMask`` of
    batch 1 or ``B`` over ``(L, L)``. Anything else is a ValueError naming it (torchtitan PR 4098)."""
    if x.dim() < 2:
        raise ValueError(f"stage input of shape {tuple(x.shape)}: expected (batch, seq, ...)")
    rows, length = int(x.shape[0]), int(x.shape[1])
    if positions is not None:
        if tuple(positions.shape) != (rows, length):
            raise ValueError(f"positions of shape {tuple(positions.shape)} do not match this micro-batch's input "
                             f"({rows}, {length}): positions of another batch; {HINT}")
        pos = positions.detach().to("cpu", torch.int64)
        if (pos[:, 0] != 0).any():
            raise ValueError(f"positions of row {int((pos[:, 0] != 0).nonzero()[0, 0])} do not start at 0: a row of "
                             f"packed documents starts a document; {HINT}")
        step = pos[:, 1:] - pos[:, :-1]
        if ((step != 1) & (pos[:, 1:] != 0)).any():
            r, t = (int(v) for v in ((step != 1) & (pos[:, 1:] != 0)).nonzero()[0])
            raise ValueError(f"positions of row {r} jump from {int(pos[r, t])} to {int(pos[r, t + 1])} at token "
                             f"{t + 1}: not one document's positions; {HINT}")
    for name, mask in _masks(attention_masks):
        if isinstance(mask, VarlenMetadata):
            flat = None if positions is None else positions.reshape(-1)
            cu_q = check_microbatch(mask.cu_seq_q, rows * length, flat, name=f"{name}.cu_seq_q")
            if positions is not None:
                row_starts = set(range(0, rows * length, length))
                if not row_starts <= set(cu_q.tolist()):
                    raise ValueError(f"{name}.cu_seq_q lacks a row start (a document would span two rows); {HINT}")
            check_microbatch(mask.cu_seq_k, rows * length, flat, name=f"{name}.cu_seq_k")
        else:
            b, q_len, kv_len = int(mask.shape[0]), int(mask.shape[-2]), int(mask.shape[-1])
            if b not in (1, rows) or (q_len, kv_len) != (length, length):
                raise ValueError(f"{name} of shape {tuple(mask.shape)} is not a mask of this micro-batch "
                                 f"({rows} rows of {length} tokens); {HINT}")


def _stage_hook(module, args, kwargs):
    x = args[0] if args else kwargs.get("tokens", kwargs.get("h"))
    if isinstance(x, torch.Tensor):
        check_stage_kwargs(x, kwargs.get("positions"), kwargs.get("attention_masks"))


def guard_pipeline_stages(model_parts) -> list:
    """A forward pre-hook on each module of ``model_parts`` (torchtitan's ``Trainer.model_parts``: its pipeline
    stages' modules under PP, the whole model without) running :func:`check_stage_kwargs` on every call, before any
    attention reads the metadata. Returns the hook handles."""
    return [m.register_forward_pre_hook(_stage_hook, with_kwargs=True) for m in model_parts]
