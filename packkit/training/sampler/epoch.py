"""Per-epoch planning: everything derived from (lengths, configuration, epoch), identical on every rank."""
from __future__ import annotations

import numpy as np

from ...planning import step_order
from ...planning.planner import Plan, plan as make_plan
from .ranks import deal_rows


class EpochPlan:
    """Everything derived from (lengths, config, epoch); identical on every rank."""

    def __init__(self, epoch: int, permutation: np.ndarray, plan: Plan, step_order: np.ndarray,
                 dropped_last: np.ndarray, world_size: int, rows_per_step: int):
        self.epoch = epoch
        self.permutation = permutation  # position in the planned order -> dataset index
        self.plan = plan  # indices in plan.bins are positions in ``permutation``
        self.step_order = step_order  # yielded step k is plan step step_order[k]
        self.dropped_last = dropped_last
        self.rows_per_step = rows_per_step
        # rank_rows[s, r, j]: position (in its plan step) of rank r's j-th row at plan step s
        self.rank_rows = deal_rows(plan.rank_costs, world_size, rows_per_step)
        per_rank = np.take_along_axis(plan.rank_costs, self.rank_rows.reshape(plan.num_steps, world_size * rows_per_step), axis=1)
        self.rank_costs = per_rank.reshape(plan.num_steps, world_size, rows_per_step).sum(axis=2)[step_order]

    def num_items(self) -> int:
        return len(self.step_order) * self.rows_per_step

    def row(self, item: int, rank: int) -> list[int]:
        """Dataset indices of ``rank``'s ``item``-th yielded row (row ``item % k`` of step ``item // k``)."""
        step, j = divmod(item, self.rows_per_step)
        plan_step = int(self.step_order[step])
        b = plan_step * self.plan.dp_size + int(self.rank_rows[plan_step, rank, j])
        return self.permutation[self.plan.bins[b]].tolist()


def epoch_time(plan: Plan, world_size: int, rows_per_step: int) -> float:
    """The epoch's time under the plan's cost model: over steps, the slowest rank's sum of its dealt rows."""
    dealt = deal_rows(plan.rank_costs, world_size, rows_per_step)
    per_rank = np.take_along_axis(plan.rank_costs, dealt.reshape(plan.num_steps, -1), axis=1)
    return float(per_rank.reshape(plan.num_steps, world_size, rows_per_step).sum(axis=2).max(axis=1, initial=0).sum())


def fewest_steps_plan(lengths: np.ndarray, capacity: int, *, algorithm: str, world_size: int, rows_per_step: int,
                      cost, overlong: str, pad_to_multiple_of=None, extra_cost=None, max_sequences=None) -> Plan:
    """The epoch's rows, ``world_size * rows_per_step`` per step.

    ogbfd balances every step by filling all of its rows, which sometimes costs one step more than a plain
    (obfd) plan's rows need (issue 42: 208 rows where 202 would do, at 8 rows per step). Then obfd's rows laid
    out in order, ``ceil(rows / per_step)`` steps, are used instead when they run the epoch no slower under the
    cost model (the slowest rank's sum per step, after dealing): always with one rank, where a step's time is
    the sum of its rows either way; with several ranks, when the fewer steps outweigh the looser balance.
    """
    per_step = world_size * rows_per_step
    common = dict(cost=cost, overlong=overlong, pad_to_multiple_of=pad_to_multiple_of, extra_cost=extra_cost,
                  max_sequences=max_sequences)
    plan = make_plan(lengths, capacity, algorithm=algorithm, dp_size=per_step, **common)
    if algorithm != "ogbfd" or per_step == 1:
        return plan
    plain = make_plan(lengths, capacity, algorithm="obfd", dp_size=per_step, **common)  # obfd's rows, in order
    if plain.num_steps >= plan.num_steps:
        return plan
    slack = 1e-9 * max(epoch_time(plan, world_size, rows_per_step), 1.0)  # the same documents' sums, reordered
    if epoch_time(plain, world_size, rows_per_step) <= epoch_time(plan, world_size, rows_per_step) + slack:
        return plain
    return plan


def plan_epoch(lengths: np.ndarray, capacity: int, *, epoch: int, seed: int, shuffle: bool, drop_last: bool,
               algorithm: str, cost, overlong: str, world_size: int, rows_per_step: int,
               pad_to_multiple_of=None, extra_cost=None, max_sequences=None) -> EpochPlan:
    """The epoch's plan: a seeded permutation of the dataset, planned with ``world_size * rows_per_step``
    rows per step, its steps shuffled (the incomplete last one kept last, or dropped with ``drop_last``).

    ``shuffle=False``: dataset order, and the steps in the dataset order of their longest sample
    (:mod:`packkit.planning.step_order`), not the planner's (which runs from the longest samples to the shortest).
    ``extra_cost``: per-sample costs in dataset order (``packkit.plan``'s), permuted with the lengths.
    ``max_sequences``: samples per row (the planner's bin constraint)."""
    n = len(lengths)
    rng = np.random.default_rng((seed, epoch))
    permutation = rng.permutation(n).astype(np.int64) if shuffle else np.arange(n, dtype=np.int64)
    plan = fewest_steps_plan(lengths[permutation], capacity, algorithm=algorithm, world_size=world_size,
                             rows_per_step=rows_per_step, cost=cost, overlong=overlong,
                             pad_to_multiple_of=pad_to_multiple_of, max_sequences=max_sequences,
                             extra_cost=None if extra_cost is None else extra_cost[permutation])
    if not np.isfinite(plan.rank_costs).all():  # finite item costs can still overflow when a row sums them
        raise ValueError("the cost model's row costs overflow float64 (each item's cost is finite, their sum per "
                         "row is not); scale the cost callable down")
    steps = plan.num_steps
    # The planner puts empty rows only in its last step; that step stays last.
    incomplete = steps > 0 and plan.empty_bins > 0
    full = steps - 1 if incomplete else steps
    keys = None
    if not shuffle:
        seg = plan.segments
        seg_bin = np.repeat(np.arange(len(seg.bin_offsets) - 1, dtype=np.int64), np.diff(seg.bin_offsets))
        keys = step_order.source_keys(seg_bin // plan.dp_size, seg.length, permutation[seg.seq_index], steps)[:full]
    order = step_order.order_steps(full, shuffle=shuffle, rng=rng, keys=keys)
    dropped_last = np.zeros(0, np.int64)
    if incomplete:
        if drop_last:
            last = plan.segments.seq_index[plan.segments.bin_offsets[full * plan.dp_size]:]
            dropped_last = np.sort(permutation[last])
        else:
            order = np.append(order, full)
    return EpochPlan(epoch, permutation, plan, order, dropped_last, world_size, rows_per_step)
