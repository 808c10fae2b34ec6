"""verl 0.9.1 drop-in: ``rearrange_micro_batches`` planned by packkit, and a global balancing step that plans the
micro-batches of every data-parallel rank at once.

* :func:`rearrange_micro_batches`: verl's signature and return types (micro-batch TensorDicts equal to
  ``batch[idx]`` and the index lists). The token cap holds by construction (no re-partition loop), the
  count is ``ceil(tokens / max_token_len)`` or one more, balanced under verl's ``calculate_workload``.
* :func:`balance_batch`: replaces the trainer's ``_balance_batch`` (Karmarkar-Karp with equal counts per
  rank). It plans all ranks' micro-batches together (:func:`packkit.rl.micro_batches` with
  ``equal_count=True``), reorders the batch so verl's equal-chunk dispatch hands each rank its
  sequences, and records each sequence's micro-batch in the tensor field ``packkit_micro_batch``;
  :func:`rearrange_micro_batches` then uses that plan, so micro-batch ``k`` is balanced across ranks.
* :func:`install`: points verl's module-level ``rearrange_micro_batches`` at this one.

verl stays optional: it is imported only when these functions run (``pip install packkit[verl]``).
"""
from __future__ import annotations

import numbers

import numpy as np
import torch

from ..rl.micro_batches import micro_batches

PLAN_KEY = "packkit_micro_batch"


def _verl():
    try:
        from verl.utils import seqlen_balancing, tensordict_utils
    except ImportError as exc:  # pragma: no cover - exercised only without verl
        raise ImportError("packkit.integrations.verl needs verl (pip install 'packkit[verl]')") from exc
    return seqlen_balancing, tensordict_utils


def _sync_count(count: int, dp_group, op) -> int:
    from torch import distributed as dist
    from verl.utils.device import get_device_name

    value = torch.tensor([count], device=get_device_name())
    dist.all_reduce(value, op=op, group=dp_group)
    return int(value.cpu().item())


def _from_plan(ids: np.ndarray):
    """The micro-batches recorded by :func:`balance_batch`, if this batch holds all of them."""
    if len(ids) == 0 or ids.min() < 0:
        return None
    k = int(ids.max()) + 1
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=k)
    if (counts == 0).any():
        return None
    return [np.sort(part) for part in np.split(order, np.cumsum(counts)[:-1])]


def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None, use_dynamic_bsz_balance=True,
                            force_group_size=1):
    """verl 0.9.1's ``rearrange_micro_batches``, planned by packkit (same arguments, same return types).

    Returns ``(micro_batches, index_lists)``: ``micro_batches[i]`` equals ``batch[index_lists[i]]``.
    """
    seqlen_balancing, tu = _verl()
    from torch import distributed as dist

    for name, value in (("max_token_len", max_token_len), ("force_group_size", force_group_size)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    input_ids = batch["input_ids"]
    odd = None
    if input_ids.is_nested:
        lengths_t = input_ids.offsets().diff()
        max_seq_len = int(lengths_t.max())
    else:
        mask = batch["attention_mask"]
        max_seq_len = mask.shape[-1]
        lengths_t = mask.sum(dim=1)
        if mask.dtype != torch.bool:  # a 2 would count a token twice; read with the lengths, in the one copy
            odd = ((mask != 0) & (mask != 1)).sum().reshape(1).to(lengths_t.dtype)
    if max_token_len < max_seq_len:
        raise ValueError(f"max_token_len must be greater than the sequence length. Got max_token_len={max_token_len} "
                         f"and max_seq_len={max_seq_len}")
    host = (lengths_t if odd is None else torch.cat((lengths_t, odd))).long().cpu().numpy()  # the one copy
    lengths = host[:len(lengths_t)]
    if odd is not None and host[-1]:
        raise ValueError(f"attention_mask holds {int(host[-1])} values other than 0 and 1; a verl attention_mask is "
                         "1 at valid tokens and 0 at padding")
    n = len(lengths)
    if force_group_size < 1 or n % force_group_size:
        raise ValueError(f"Batch size {n} must be divisible by force_group_size {force_group_size}")
    workload = seqlen_balancing.calculate_workload
    sync = dist.is_initialized() and same_micro_num_in_dp and dp_group is not None

    parts = None
    if PLAN_KEY in batch.keys() and force_group_size == 1 and not sync:
        recorded = batch[PLAN_KEY]
        if recorded.dtype != torch.int64 or recorded.shape != (n,):
            raise ValueError(f"batch[{PLAN_KEY!r}] must be the int64 [{n}] field balance_batch wrote, got "
                             f"{recorded.dtype} {tuple(recorded.shape)}")
        parts = _from_plan(recorded.cpu().numpy())
        if parts is not None and (len(parts) < (min_num_micro_batch or 1)
                                  or (num_batches_divided_by and len(parts) % num_batches_divided_by)
                                  or max(int(lengths[p].sum()) for p in parts) > max_token_len):  # another cap
            parts = None
    if parts is None:
        g = force_group_size
        if g > 1:  # plan whole groups: their tokens and summed workloads
            group_lengths = lengths.reshape(-1, g).sum(1)
            group_costs = np.asarray(workload(torch.from_numpy(lengths)).double().numpy()).reshape(-1, g).sum(1)
            cost = group_costs
        else:
            group_lengths, cost = lengths, workload
        if g > 1 and len(group_lengths) and group_lengths.max() > max_token_len:
            raise ValueError("A forced group exceeds max_token_len and cannot be split. Got max_group_token_len="
                             f"{int(group_lengths.max())} and max_token_len={max_token_len}.")
        minimum = min_num_micro_batch
        plan = micro_batches(group_lengths, max_token_len, cost=cost, min_micro_batches=minimum,
                             divisible_by=num_batches_divided_by)
        if sync:  # the same count on every rank: agree on the largest, re-plan to it until all agree
            while True:
                count = _sync_count(plan.num_micro_batches, dp_group, dist.ReduceOp.MAX)
                if count != plan.num_micro_batches:
                    plan = micro_batches(group_lengths, max_token_len, cost=cost, min_micro_batches=count,
                                         divisible_by=num_batches_divided_by)
                if _sync_count(int(plan.num_micro_batches == count), dp_group, dist.ReduceOp.MIN):
                    break
        parts = plan.indices[0]
        if g > 1:
            parts = [(part[:, None] * g + np.arange(g)).reshape(-1) for part in parts]
    costs = np.asarray(workload(torch.from_numpy(lengths)).double().numpy())
    index_lists = [[int(i) for i in part] for part in parts]
    if use_dynamic_bsz_balance:  # verl's order: costliest in the middle, cheap ones at both ends
        index_lists.sort(key=lambda p: (float(costs[p].sum()) if p else 0.0, p[0] if p else 0), reverse=True)
        index_lists = index_lists[::2][::-1] + index_lists[1::2]
    micro = [tu.index_select_tensor_dict(batch, idx) for idx in index_lists]
    return micro, index_lists


def balance_batch(batch, dp_size: int, max_token_len: int, *, cost=None, metrics=None,
                  logging_prefix: str = "global_seqlen"):
    """Replacement for ``RayPPOTrainer._balance_batch``: plan every rank's micro-batches at once.

    ``batch`` is a verl ``DataProto``; it is reordered in place (rank ``r`` gets chunk ``r`` of equal size,
    as verl dispatches) and gets the int64 tensor field ``packkit_micro_batch``, each sequence's micro-batch
    on its rank, which :func:`rearrange_micro_batches` follows. ``cost`` defaults to verl's
    ``calculate_workload``. Returns the :class:`packkit.rl.MicroBatches` plan.
    """
    seqlen_balancing, _ = _verl()
    mask = batch.batch["attention_mask"]
    lengths_t = mask.view(mask.shape[0], -1).sum(-1).long()
    odd = ((mask != 0) & (mask != 1)).sum().reshape(1).long() if mask.dtype != torch.bool else lengths_t[:0]
    host = torch.cat((lengths_t, odd)).cpu().numpy()  # one device-to-host copy
    lengths = host[:len(lengths_t)]
    if len(host) > len(lengths) and host[-1]:
        raise ValueError(f"attention_mask holds {int(host[-1])} values other than 0 and 1; a verl attention_mask is "
                         "1 at valid tokens and 0 at padding")
    plan = micro_batches(lengths, max_token_len, dp_size, cost=seqlen_balancing.calculate_workload if cost is None
                         else cost, equal_count=True)
    order, step = [], []
    for rank in plan.indices:
        for k, part in enumerate(rank):
            order.extend(int(i) for i in part)
            step.extend([k] * len(part))
    batch.reorder(torch.tensor(order, dtype=torch.long))
    batch.batch[PLAN_KEY] = torch.tensor(step, dtype=torch.int64)
    if metrics is not None:
        parts = [[i for part in rank for i in part] for rank in plan.indices]
        metrics.update(seqlen_balancing.log_seqlen_unbalance(seqlen_list=lengths.tolist(), partitions=parts,
                                                             prefix=logging_prefix))
        metrics[f"{logging_prefix}/packkit_step_balance"] = plan.balance
    return plan


def install() -> None:
    """Point verl's ``rearrange_micro_batches`` (in ``verl.utils.seqlen_balancing`` and the modules that import
    it by name) at packkit's."""
    seqlen_balancing, _ = _verl()
    seqlen_balancing.rearrange_micro_batches = rearrange_micro_batches
    try:
        from verl.workers.engine import utils as engine_utils
    except Exception:  # noqa: BLE001 - optional engine module (heavy deps)
        return
    engine_utils.rearrange_micro_batches = rearrange_micro_batches
