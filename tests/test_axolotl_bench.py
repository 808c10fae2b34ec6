"""benchmarks/trainers/common.py, the contract the three trainer benchmarks share: its dealing is accelerate's, its
balance and efficiency are the definitions (hand-computed case), and packkit's row is the plan's own figures."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from trainers import common  # noqa: E402

pytestmark = pytest.mark.full

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")


def test_deal_round_robin_is_accelerates_batch_sampler_shard():
    items = [[[i]] for i in range(11)]  # 11 items of one row: 3 whole steps of 3 ranks, 2 items dropped
    class Sampler(list):  # axolotl's sampler says drop_last=True: accelerate then drops the partial last step
        drop_last = True
        batch_size = 1

    shards = [list(accelerate_data_loader.BatchSamplerShard(Sampler(items), num_processes=3, process_index=r,
                                                           even_batches=False)) for r in range(3)]
    steps = common.deal_round_robin(items, 3)
    assert [[shards[r][s] for r in range(3)] for s in range(len(shards[0]))] == steps and len(steps) == 3


def test_result_row_by_hand():
    lengths = np.array([4, 2, 3, 1], dtype=np.int64)
    rows = [[0], [1, 3], [2], []]
    steps = common.deal_round_robin([[r] for r in rows], 2)
    row = common.result_row(trainer="t", method="m", lengths=lengths, capacity=4, dp_size=2, hidden=1, rows=rows,
                            steps=steps, plan_seconds=0.5)
    a, b = common.cost_pair(1)
    cost = lambda ls: a * sum(ls) + b * sum(x * x for x in ls)  # noqa: E731
    step_costs = [[cost([4]), cost([2, 1])], [cost([3]), 0.0]]
    expected = sum(max(s) for s in step_costs) / sum(np.mean(s) for s in step_costs)
    assert row["rows"] == 3 and row["steps"] == 2 and row["efficiency"] == 10 / 12
    assert row["balance"] == pytest.approx(expected, rel=1e-12)
    assert set(common.ROW_KEYS) <= set(row)


def test_packkit_row_is_the_plans_figures():
    lengths = common.Workload("t", 300, common.SIGMA, 2048, n=3000).lengths()
    row = common.packkit_row("t", lengths, 2048, 4, 2048, repeats=1)
    import packkit

    plan = packkit.plan(lengths, 2048, algorithm="ogbfd", dp_size=4, cost=common.cost_pair(2048))
    assert row["steps"] == plan.num_steps and row["balance"] == pytest.approx(plan.balance, rel=1e-12)
    assert row["rows"] == plan.num_bins - plan.empty_bins
