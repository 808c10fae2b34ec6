"""LLaMA-Factory 0.9.5's own packing (``greedy_knapsack`` per 1,000-example ``dataset.map`` chunk) vs packkit's global
plan (``packkit.integrations.llamafactory.plan_rows``), each dealt to ranks as LLaMA-Factory's trainer deals rows.
Runs in a venv with llamafactory (``PACKKIT_LLAMAFACTORY_PYTHON``)::

    python benchmarks/trainers/llamafactory.py --lengths L.npy --capacity 8192 --dp-size 8 --hidden 4096 --out o.json

LLaMA-Factory's side is its ``PackedSupervisedDatasetProcessor`` minus tokenization: the lengths in dataset order,
``preprocessing_batch_size`` (1,000) at a time, each chunk through its own ``greedy_knapsack`` with the rows mapped
back to examples as it maps them (``length2indexes``); its trainer then samples rows at random (``RandomSampler``,
seeded) and accelerate deals them round-robin, one row per rank (``per_device_train_batch_size: 1``, as
``neat_packing`` with FA2 requires), a partial last step completed with rows from the start (``even_batches``). packkit's side: one ``plan_rows`` (``ogbfd``, ``dp_size`` rows per step under
the contract's cost), read by the sequential sampler its ``install()`` sets. The knapsack capacity is the contract's
``capacity`` for both (LLaMA-Factory's ``cutoff_len`` after its own ``- 1``; its rows are one token longer, padding).
``plan_seconds``: one epoch's planning on the same lengths; ``trained_samples``: distinct examples in the dealt steps.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

# Run as a script, this file's folder is sys.path[0]; keep the package imports unambiguous.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))
from trainers.common import cost_pair, deal_round_robin, median_seconds, result_row, run  # noqa: E402

CHUNK = 1000  # DataArguments.preprocessing_batch_size's default: the examples one greedy_knapsack call sees
SEED = 42  # Seq2SeqTrainingArguments.seed's default (the RandomSampler's generator)


def llamafactory_rows(lengths: np.ndarray, capacity: int, greedy_knapsack) -> list[list[int]]:
    """LLaMA-Factory's rows of example indices, chunk by chunk, as its processor builds them."""
    rows = []
    for start in range(0, len(lengths), CHUNK):
        chunk = lengths[start:start + CHUNK].tolist()
        length2indexes = defaultdict(list)
        for i, n in enumerate(chunk):
            length2indexes[n].append(start + i)
        for knapsack in greedy_knapsack(chunk, capacity):  # sorts and empties ``chunk``
            rows.append([length2indexes[n].pop() for n in knapsack])
    return rows


def dealt(rows: list, dp_size: int) -> list[list]:
    """Steps as the HF Trainer's accelerate deals rows (``even_batches=True``, ``dataloader_drop_last=False``): round
    robin, a partial last step completed with rows from the start of the epoch's order."""
    short = -len(rows) % dp_size
    return deal_round_robin(rows + rows[:short], dp_size) if rows else []


def trained(steps: list) -> int:
    """Distinct examples in the dealt steps."""
    return len({i for step in steps for row in step for i in row})


def llamafactory_row(lengths, capacity, dp_size, hidden, repeats):
    from llamafactory.data.processor.processor_utils import greedy_knapsack  # imported once, outside the timing

    seconds, rows = median_seconds(lambda: llamafactory_rows(lengths, capacity, greedy_knapsack), repeats)
    order = np.random.default_rng(SEED).permutation(len(rows))  # its RandomSampler over the packed rows
    steps = dealt([rows[i] for i in order], dp_size)
    return result_row(trainer="llamafactory", method="llamafactory own", lengths=lengths, capacity=capacity,
                      dp_size=dp_size, hidden=hidden, rows=rows, steps=steps, plan_seconds=seconds,
                      trained_samples=trained(steps))


def packkit_row(lengths, capacity, dp_size, hidden, repeats):
    from packkit.integrations.llamafactory import plan_rows

    seconds, plan = median_seconds(lambda: plan_rows(lengths, capacity, dp_size=dp_size, cost=cost_pair(hidden),
                                                     seed=SEED), repeats)
    rows = [list(map(int, r)) for r in plan.rows]
    steps = dealt(rows, dp_size)  # the sequential sampler keeps the plan's order
    row = result_row(trainer="llamafactory", method="packkit", lengths=lengths, capacity=capacity, dp_size=dp_size,
                     hidden=hidden, rows=rows, steps=steps, plan_seconds=seconds,
                     trained_samples=trained(steps))
    if len(steps) == len(plan.rank_costs) and abs(row["balance"] - plan.balance) > 1e-9 * plan.balance:
        raise AssertionError(f"dealt balance {row['balance']} != the plan's {plan.balance}")
    return row


def main():
    run(__doc__.splitlines()[0], llamafactory_row, packkit_row)


if __name__ == "__main__":
    main()
