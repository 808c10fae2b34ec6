"""ms-swift 4.6.0's own packing (``swift sft --packing true``) vs packkit's (``packkit.integrations.swift``), as
ms-swift's trainer deals the rows to ranks. Runs in a venv with ms-swift (``PACKKIT_SWIFT_PYTHON``)::

    python benchmarks/trainers/swift.py --lengths L.npy --capacity 20000 --dp-size 8 --hidden 4096 --out out.json

* ms-swift own: ``PackingDataset.create_packed_idx`` (its worker's code: ``calculate_matched_group`` with the
  default ``binpack`` strategy, i.e. ``binpacking.to_constant_volume``, over ``PACKING_BATCH_SIZE`` = 1,000
  samples at a time, the last unfinished pack carried over), run in this process with ``packing_num_proc=1``
  (so its time leaves out the worker start-up and queue traffic ``PackingDataset`` adds); dealt by ms-swift's
  ``BatchSamplerShard(len, batch_size=1, shuffle=True, drop_last=False, data_seed=42)`` as each rank builds it.
* packkit: :func:`packkit.integrations.swift.plan_packed_idx` (what ``PlannedPackingDataset`` runs before step 1:
  one global ogbfd plan with ``dp_size`` and the issue's cost, rows step-major, no row empty), dealt by
  ``PlannedBatchSamplerShard`` with the same arguments.

``plan_seconds`` is the median of ``--repeats`` runs; rows are the contract's (``common.py``); ``trained_samples`` =
samples in the dealt steps (ms-swift's sampler keeps ``len // world`` rows per rank).
"""
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder is sys.path[0] and its name would shadow the ms-swift package.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))
from trainers.common import cost_pair, median_seconds, result_row, run  # noqa: E402

SEED = 42  # ms-swift's default data_seed


class _ListQueue:
    """What ``create_packed_idx`` puts its results into (a multiprocessing queue in ms-swift)."""

    def __init__(self):
        self.items = []

    def put(self, item):
        self.items.append(item)


def swift_packed_idx(lengths, capacity: int) -> list:
    """ms-swift's ``packed_idx`` for these lengths, by its own worker code (one worker)."""
    from swift.dataset.packing import PackingDataset

    queue = _ListQueue()
    PackingDataset.create_packed_idx(0, 0, lengths, queue, capacity, "binpack")
    return [[x[0] for x in seq] for _, sequences, n in queue.items if n != -1 for seq in sequences]


def dealt_steps(sampler_cls, n_rows: int, dp_size: int, **kwargs) -> list[list]:
    """Steps of ``dp_size`` rows as the sampler hands them to ranks 0..W-1 (batch_size 1)."""
    ranks = [list(type("OnRank", (sampler_cls,), {"rank": r, "world_size": dp_size})(
        n_rows, 1, True, False, SEED, **kwargs)) for r in range(dp_size)]
    if len({len(r) for r in ranks}) != 1:
        raise AssertionError(f"ranks got different step counts: {[len(r) for r in ranks]}")
    return [[ranks[r][s][0] for r in range(dp_size)] for s in range(len(ranks[0]))]


def swift_row(lengths, capacity, dp_size, hidden, repeats):
    from swift.dataloader import BatchSamplerShard

    values = lengths.tolist()  # ms-swift reads the dataset's ``lengths`` column as Python ints
    swift_packed_idx(values[:2000], capacity)  # import and warm-up outside the timing
    seconds, packed = median_seconds(lambda: swift_packed_idx(values, capacity), repeats)
    steps = [[packed[i] for i in step] for step in dealt_steps(BatchSamplerShard, len(packed), dp_size)]
    return result_row(trainer="swift", method="swift own", lengths=lengths, capacity=capacity, dp_size=dp_size,
                      hidden=hidden, rows=packed, steps=steps, plan_seconds=seconds,
                      trained_samples=sum(len(row) for step in steps for row in step))


def packkit_row(lengths, capacity, dp_size, hidden, repeats):
    from packkit.integrations.swift import PlannedBatchSamplerShard, plan_packed_idx

    values = lengths.tolist()
    seconds, packed = median_seconds(lambda: plan_packed_idx(values, capacity, dp_size=dp_size,
                                                             cost=cost_pair(hidden)), repeats)
    rows = packed.packed_idx
    steps = [[rows[i] for i in step] for step in dealt_steps(PlannedBatchSamplerShard, len(rows), dp_size,
                                                                 planned_dp_size=dp_size)]
    row = result_row(trainer="swift", method="packkit", lengths=lengths, capacity=capacity, dp_size=dp_size,
                     hidden=hidden, rows=rows, steps=steps, plan_seconds=seconds,
                     trained_samples=sum(len(row) for step in steps for row in step))
    if abs(row["balance"] - packed.balance) > 1e-9 * packed.balance:  # the shuffled, dealt steps are the plan's
        raise AssertionError(f"dealt balance {row['balance']} != the plan's {packed.balance}")
    return row


def main():
    run(__doc__.splitlines()[0], swift_row, packkit_row)


if __name__ == "__main__":
    main()
