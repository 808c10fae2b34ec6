"""verl 0.9.1 drop-in: ``rearrange_micro_batches`` planned by packkit, and a global balancing step that plans the
micro-batches of every data-parallel rank at once.

* :func:`rearrange_micro_batches`: verl's signature and return types (micro-batch TensorDicts equal to
  ``batch[idx]`` and the index lists), balanced under verl's ``calculate_workload``. Counts from the token bound
  up, at each count packkit's plan, else verl's own Karmarkar-Karp partition at that count: never more
  micro-batches than verl. Synced, one reduced check gives every rank the same count or the same ValueError.
* :func:`balance_batch`: replaces the trainer's ``_balance_batch`` (Karmarkar-Karp with equal counts per
  rank). It plans all ranks' micro-batches together (:func:`packkit.rl.micro_batches` with
  ``equal_count=True``), reorders the batch so verl's equal-chunk dispatch hands each rank its
  sequences, and records each sequence's micro-batch in the tensor field ``packkit_micro_batch``;
  :func:`rearrange_micro_batches` then uses that plan, so micro-batch ``k`` is balanced across ranks.
* :func:`install`: points verl's module-level ``rearrange_micro_batches`` at this one.

verl stays optional: it is imported only when these functions run (``pip install packkit[verl]``).
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from ..planning.arg_rules import MAX_INT, Bool, check_args
from ..rl.micro_batches import micro_batches

PLAN_KEY = "packkit_micro_batch"


def _verl():
    try:
        from verl.utils import seqlen_balancing, tensordict_utils
    except ImportError as exc:  # pragma: no cover - exercised only without verl
        raise ImportError("packkit.integrations.verl needs verl (pip install 'packkit[verl]')") from exc
    return seqlen_balancing, tensordict_utils


def _all_reduce(values, dp_group, op):
    """``values`` (ints) reduced with ``op`` over ``dp_group`` in one collective (None: this rank alone)."""
    if dp_group is None:
        return [int(v) for v in values]
    from torch import distributed as dist
    from verl.utils.device import get_device_name

    device = "cpu" if dist.get_backend(dp_group) == "gloo" else get_device_name()  # gloo reduces host tensors
    tensor = torch.tensor([int(v) for v in values], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=op, group=dp_group)
    return [int(v) for v in tensor.cpu().tolist()]


def _token_cap(max_token_len) -> int:
    """verl's ``max_token_len`` as an int cap: an int, a float (tokens are whole, so a micro-batch fits under
    ``x`` iff it fits under ``floor(x)``) or a 0-d tensor of either."""
    value = max_token_len
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"max_token_len must be an int, a float or a 0-d real tensor, got a {value.dtype} tensor "
                            f"of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"max_token_len must be an int, a float or a 0-d real tensor, got {type(value).__name__} "
                        f"{value!r}")
    if isinstance(value, numbers.Integral):
        cap = int(value)
    else:
        if not math.isfinite(float(value)):
            raise ValueError(f"max_token_len must be finite, got {value!r}")
        cap = math.floor(float(value))
    if not 1 <= cap <= MAX_INT:
        raise ValueError(f"max_token_len must be at least 1 token and at most 2**63 - 1, got {max_token_len!r}")
    return cap


def _optional_count(value, name):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__} {value!r}")
    return int(value)


# The checks every rank makes before planning, reduced with MAX in one collective so that every rank of a synced
# call raises the same ValueError (or none): a rank that raised alone would leave its peers waiting in the next
# collective. Slots of the reduced vector:
_COUNT, _NO_MASK, _SEQ_LEN, _ODD_MASK, _INDIVISIBLE, _GROUP_TOKENS, _NEG_GROUPS, _NESTED, _FAILED = range(9)


def _verdict(red, max_token_len, force_group_size):
    """The ValueError (or None) every rank derives from the reduced checks (the same message on every rank)."""
    if red[_NO_MASK]:
        return ValueError("rearrange_micro_batches needs batch['attention_mask'] (a [batch, seq] tensor, 1 at valid "
                          "tokens) unless batch['input_ids'] is a nested tensor; a batch of this data-parallel group "
                          "has neither")
    if red[_SEQ_LEN] > max_token_len:
        return ValueError(f"max_token_len must be greater than the sequence length. Got max_token_len={max_token_len} "
                          f"and max_seq_len={red[_SEQ_LEN]}")
    if red[_ODD_MASK]:
        return ValueError(f"attention_mask holds {red[_ODD_MASK]} values other than 0 and 1; a verl attention_mask is "
                          "1 at valid tokens and 0 at padding")
    if red[_INDIVISIBLE]:
        return ValueError(f"Batch size {red[_INDIVISIBLE]} must be divisible by force_group_size {force_group_size}")
    if red[_GROUP_TOKENS] > max_token_len:
        return ValueError("A forced group exceeds max_token_len and cannot be split. Got max_group_token_len="
                          f"{red[_GROUP_TOKENS]} and max_token_len={max_token_len}.")
    if red[_FAILED]:
        return ValueError("rearrange_micro_batches failed to plan on a rank of this data-parallel group (that rank's "
                          "error is chained there)")
    return None


class _LocalPlanner:
    """One rank's micro-batches at a given count: packkit's plan, else verl's own Karmarkar-Karp at that count (as
    verl runs it), so a count at which verl's partition fits the cap never fails here."""

    def __init__(self, seqlen_balancing, group_lengths, cost, workload_list, cap):
        self.sb, self.lengths, self.cost, self.workloads, self.cap = seqlen_balancing, group_lengths, cost, workload_list, cap

    def at(self, count):
        """Exactly ``count`` micro-batches within the cap (index arrays into the groups), or None."""
        n = len(self.lengths)
        plan = micro_batches(self.lengths, self.cap, cost=self.cost, min_micro_batches=count)
        if plan.num_micro_batches == count:
            return plan.indices[0]
        if count >= n:  # pragma: no cover - one group per micro-batch always fits (every group is within the cap)
            return None
        workloads = self.workloads()
        parts = self.sb.karmarkar_karp(seqlen_list=workloads, k_partitions=count, equal_size=False)
        parts = [np.asarray(sorted(p), np.int64) for p in parts]
        if all(int(self.lengths[p].sum()) <= self.cap for p in parts):
            return parts
        return None


def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None, use_dynamic_bsz_balance=True,
                            force_group_size=1):
    """verl 0.9.1's ``rearrange_micro_batches``, planned by packkit (same arguments, same return types).

    Returns ``(micro_batches, index_lists)``: ``micro_batches[i]`` equals ``batch[index_lists[i]]``. Never more
    micro-batches than verl's on the same batch: where packkit's plan at a count breaks the cap, verl's own
    partition at that count is tried before the next count. Synced (``dp_group`` with ``same_micro_num_in_dp``),
    every rank returns the same count or raises the same ValueError; a rank with fewer rows than the agreed count
    gets empty micro-batches (0 rows) where verl raises.
    """
    seqlen_balancing, tu = _verl()
    from torch import distributed as dist

    cap = _token_cap(max_token_len)
    same_micro_num_in_dp, use_dynamic_bsz_balance = check_args(
        Bool("same_micro_num_in_dp"), Bool("use_dynamic_bsz_balance"), values=(same_micro_num_in_dp,
                                                                               use_dynamic_bsz_balance))
    if isinstance(force_group_size, (bool, np.bool_)) or not isinstance(force_group_size, numbers.Integral):
        raise TypeError(f"force_group_size must be an int, got {type(force_group_size).__name__} {force_group_size!r}")
    g = int(force_group_size)
    if g < 1:
        raise ValueError(f"force_group_size must be >= 1, got {g}")
    minimum = _optional_count(min_num_micro_batch, "min_num_micro_batch")
    divisor = _optional_count(num_batches_divided_by, "num_batches_divided_by")
    if divisor is not None and divisor < 1:
        raise ValueError(f"num_batches_divided_by must be >= 1, got {divisor}")
    step = divisor or 1
    sync = dist.is_initialized() and same_micro_num_in_dp and dp_group is not None
    group = dp_group if sync else None

    checks = [0] * 9
    input_ids = batch["input_ids"]
    nested = bool(getattr(input_ids, "is_nested", False))
    lengths = None
    if nested:
        lengths_t = input_ids.offsets().diff()
        lengths = lengths_t.long().cpu().numpy()
        checks[_SEQ_LEN] = int(lengths.max()) if len(lengths) else 0
    elif "attention_mask" not in batch.keys():
        checks[_NO_MASK] = 1
    else:
        mask = batch["attention_mask"]
        checks[_SEQ_LEN] = mask.shape[-1]
        lengths_t = mask.sum(dim=1)
        odd = None
        if mask.dtype != torch.bool:  # a 2 would count a token twice; read with the lengths, in the one copy
            odd = ((mask != 0) & (mask != 1)).sum().reshape(1).to(lengths_t.dtype)
        host = (lengths_t if odd is None else torch.cat((lengths_t, odd))).long().cpu().numpy()  # the one copy
        lengths = host[:len(lengths_t)]
        checks[_ODD_MASK] = int(host[-1]) if odd is not None else 0
    checks[_NESTED] = int(nested)
    n = len(lengths) if lengths is not None else 0
    if lengths is not None and n % g:
        checks[_INDIVISIBLE] = n
    checks[_NEG_GROUPS] = -(n // g)
    workload = seqlen_balancing.calculate_workload
    error = _verdict(checks, cap, g) if not sync else None  # alone: no need to plan before raising

    parts = planner = None
    if error is None and not any(checks[i] for i in (_NO_MASK, _ODD_MASK, _INDIVISIBLE)) and checks[_SEQ_LEN] <= cap:
        if g > 1:  # plan whole groups: their tokens and summed workloads
            per_item = workload(torch.from_numpy(lengths))
            group_lengths = lengths.reshape(-1, g).sum(1)
            group_costs = np.asarray(per_item.double().numpy()).reshape(-1, g).sum(1)
            cost = group_costs

            def workload_list():  # verl's group workloads, ints as verl sums them
                return per_item.view(-1, g).sum(dim=1).tolist()
        else:
            group_lengths, cost = lengths, workload

            def workload_list():
                return workload(torch.from_numpy(lengths)).tolist()
        checks[_GROUP_TOKENS] = int(group_lengths.max()) if len(group_lengths) else 0
        if checks[_GROUP_TOKENS] <= cap:
            if PLAN_KEY in batch.keys() and g == 1 and not sync:
                parts = _recorded_parts(batch, lengths, cap, minimum, divisor)
            planner = _LocalPlanner(seqlen_balancing, group_lengths, cost, workload_list, cap)
            token_bound = -(-int(group_lengths.sum()) // cap)
            count = max(token_bound, minimum or 0, 1)
            count = -(-count // step) * step
            if parts is not None:
                count = len(parts)
            try:
                while parts is None:  # the first count (from the bound up) at which a plan fits the cap
                    parts = planner.at(count)
                    if parts is None:
                        count += step
            except ValueError as exc:  # an error of this rank alone: every rank raises (below)
                if not sync:
                    raise
                checks[_FAILED], local_error = 1, exc
            checks[_COUNT] = count
    if error is None:
        red = _all_reduce(checks, group, dist.ReduceOp.MAX)
        error = _verdict(red, cap, g)
    if error is not None:
        if sync and checks[_FAILED]:
            raise error from local_error
        raise error
    count = red[_COUNT]
    if sync:  # the same count on every rank: the largest one, re-planned to it until every rank fits
        while True:
            status = 1
            if len(parts) != count:
                try:
                    found = planner.at(count)
                    status = int(found is not None)
                    parts = found if found is not None else parts
                except ValueError as exc:
                    status, local_error = -1, exc
            agreed = _all_reduce([status], group, dist.ReduceOp.MIN)[0]
            if agreed < 0:
                err = ValueError(f"rearrange_micro_batches failed to plan {count} micro-batches on a rank of this "
                                 "data-parallel group (that rank's error is chained there)")
                raise err from (local_error if status < 0 else None)
            if agreed == 1:
                break
            count += step
            parts = []  # every rank re-plans at the next count
        if nested and count > -red[_NEG_GROUPS]:
            raise ValueError(f"the data-parallel group agreed on {count} micro-batches but a rank has only "
                             f"{-red[_NEG_GROUPS]} rows of nested input_ids, which cannot form an empty micro-batch")
    elif nested and len(parts) and min(len(p) for p in parts) == 0:
        raise ValueError(f"{len(parts)} micro-batches for {n} rows of nested input_ids: an empty micro-batch cannot "
                         "be formed from nested tensors (lower min_num_micro_batch)")
    if g > 1:
        parts = [(np.asarray(part, np.int64)[:, None] * g + np.arange(g)).reshape(-1) for part in parts]
    costs = np.asarray(workload(torch.from_numpy(lengths)).double().numpy())
    index_lists = [[int(i) for i in part] for part in parts]
    if use_dynamic_bsz_balance:  # verl's order: costliest in the middle, cheap ones at both ends
        index_lists.sort(key=lambda p: (float(costs[p].sum()) if p else 0.0, p[0] if p else 0), reverse=True)
        index_lists = index_lists[::2][::-1] + index_lists[1::2]
    empty = torch.zeros(0, dtype=torch.long)
    micro = [tu.index_select_tensor_dict(batch, idx if idx else empty) for idx in index_lists]
    return micro, index_lists


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


def _recorded_parts(batch, lengths, cap, minimum, divisor):
    """The micro-batches :func:`balance_batch` recorded, if this batch holds all of them and they fit this call."""
    n = len(lengths)
    recorded = batch[PLAN_KEY]
    if recorded.dtype != torch.int64 or recorded.shape != (n,):
        raise ValueError(f"batch[{PLAN_KEY!r}] must be the int64 [{n}] field balance_batch wrote, got "
                         f"{recorded.dtype} {tuple(recorded.shape)}")
    parts = _from_plan(recorded.cpu().numpy())
    if parts is not None and (len(parts) < (minimum or 1) or (divisor and len(parts) % divisor)
                              or max(int(lengths[p].sum()) for p in parts) > cap):  # another cap
        parts = None
    return parts


def _balance_mask(batch) -> torch.Tensor:
    """batch.batch['attention_mask'] of a DataProto, checked before any work (a missing key was a KeyError)."""
    td = getattr(batch, "batch", None)
    if td is None or not hasattr(td, "keys"):
        raise TypeError(f"batch must be a verl DataProto with a .batch TensorDict, got {type(batch).__name__}")
    if "attention_mask" not in td.keys():
        raise ValueError(f"balance_batch needs batch.batch['attention_mask'] (a [batch, seq] tensor, 1 at valid "
                         f"tokens) to count each sequence's tokens; the batch has {sorted(td.keys())}")
    mask = td["attention_mask"]
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2:
        raise ValueError(f"batch.batch['attention_mask'] must be a [batch, seq] tensor, got "
                         f"{tuple(getattr(mask, 'shape', ()))}")
    if mask.is_meta:
        raise ValueError("batch.batch['attention_mask'] is a meta tensor: meta tensors carry no data")
    if mask.is_complex():
        raise TypeError(f"batch.batch['attention_mask'] must be a real tensor (1 at valid tokens), got {mask.dtype}")
    return mask


def balance_batch(batch, dp_size: int, max_token_len, *, cost=None, metrics=None,
                  logging_prefix: str = "global_seqlen"):
    """Replacement for ``RayPPOTrainer._balance_batch``: plan every rank's micro-batches at once.

    ``batch`` is a verl ``DataProto``; it is reordered in place (rank ``r`` gets chunk ``r`` of equal size,
    as verl dispatches) and gets the int64 tensor field ``packkit_micro_batch``, each sequence's micro-batch
    on its rank, which :func:`rearrange_micro_batches` follows. ``cost`` defaults to verl's
    ``calculate_workload``. Returns the :class:`packkit.rl.MicroBatches` plan.
    """
    seqlen_balancing, _ = _verl()
    max_token_len = _token_cap(max_token_len)  # an int, a float or a 0-d tensor, as rearrange_micro_batches takes
    mask = _balance_mask(batch)
    if metrics is not None and not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict (verl's metrics) or None, got {type(metrics).__name__}")
    if not isinstance(logging_prefix, str):
        raise TypeError(f"logging_prefix must be a str, got {type(logging_prefix).__name__} {logging_prefix!r}")
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
