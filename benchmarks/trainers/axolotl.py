"""axolotl 0.19.0's own ``MultipackBatchSampler`` vs packkit's (``packkit.integrations.axolotl``), as accelerate
deals their items to ranks in training. Runs in a venv with axolotl (``PACKKIT_AXOLOTL_PYTHON``)::

    python benchmarks/trainers/axolotl.py --lengths L.npy --capacity 8192 --dp-size 8 --hidden 4096 --out out.json

Both samplers are built as axolotl's trainer builds them (``_create_multipack_sampler``: ``RandomSampler`` over
the dataset, ``batch_size=1``, ``batch_max_len`` = the capacity, ``bin_size=200`` (``sample_packing_bin_size``'s
default), ``drop_last=True``); each rank's items are what accelerate's ``BatchSamplerShard`` yields for it
(``drop_last`` from the sampler, ``even_batches=False``, as axolotl sets them). axolotl packs in one process
(``num_processes=1``: its default process pool only adds start-up time on one 100k-sample group); its numba
compile is warmed up before timing. ``plan_seconds``: axolotl: one ``generate_batches()`` (one epoch's packing;
its ``len()`` repeats that ``num_count_samples`` times more); packkit: construction and one epoch's plan and items
(``len()``).
Rows are the contract's (``common.py``); ``trained_samples`` = samples in the dealt steps.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

# Run as a script, this file's folder is sys.path[0] and its name would shadow the axolotl package.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))
from trainers.common import cost_pair, median_seconds, result_row, run  # noqa: E402

BIN_SIZE = 200  # axolotl's sample_packing_bin_size default


def dealt_steps(sampler, dp_size: int) -> list[list]:
    """Steps of ``dp_size`` items, as accelerate's ``BatchSamplerShard`` hands them to ranks 0..W-1."""
    from accelerate.data_loader import BatchSamplerShard

    ranks = [list(BatchSamplerShard(sampler, num_processes=dp_size, process_index=r, even_batches=False))
             for r in range(dp_size)]
    if len({len(r) for r in ranks}) != 1:
        raise AssertionError(f"ranks got different step counts: {[len(r) for r in ranks]}")
    return [[ranks[r][s] for r in range(dp_size)] for s in range(len(ranks[0]))]


def axolotl_row(lengths, capacity, dp_size, hidden, repeats):
    from torch.utils.data import RandomSampler
    from axolotl.utils.samplers.multipack import MultipackBatchSampler

    def build():
        return MultipackBatchSampler(RandomSampler(range(len(lengths))), batch_size=1, batch_max_len=capacity,
                                     lengths=lengths, bin_size=BIN_SIZE, drop_last=True, num_processes=1)

    build().generate_batches()  # numba compile
    sampler = build()

    def one_epoch():
        sampler._batches = None
        return sampler.generate_batches()

    seconds, batches = median_seconds(one_epoch, repeats)
    sampler._batches, sampler._len_across_ranks = batches, len(batches)  # len() as one rank of the run agrees
    steps = dealt_steps(sampler, dp_size)
    rows = [row for item in batches for row in item]
    return result_row(trainer="axolotl", method="axolotl own", lengths=lengths, capacity=capacity, dp_size=dp_size,
                      hidden=hidden, rows=rows, steps=steps, plan_seconds=seconds,
                      trained_samples=sum(len(row) for step in steps for item in step for row in item))


def packkit_row(lengths, capacity, dp_size, hidden, repeats):
    from torch.utils.data import RandomSampler
    from packkit.integrations.axolotl import MultipackBatchSampler

    def one_epoch():  # construction + the epoch's plan and items (what len() computes, then cached)
        sampler = MultipackBatchSampler(RandomSampler(range(len(lengths))), batch_size=1, batch_max_len=capacity,
                                        lengths=lengths, bin_size=BIN_SIZE, drop_last=True, dp_size=dp_size,
                                        cost=cost_pair(hidden))
        len(sampler)
        return sampler

    seconds, sampler = median_seconds(one_epoch, repeats)
    steps = dealt_steps(sampler, dp_size)
    rows = [row for item in sampler.generate_batches() for row in item]
    row = result_row(trainer="axolotl", method="packkit", lengths=lengths, capacity=capacity, dp_size=dp_size,
                     hidden=hidden, rows=rows, steps=steps, plan_seconds=seconds,
                     trained_samples=sum(len(row) for step in steps for item in step for row in item))
    if abs(row["balance"] - sampler.balance) > 1e-9 * sampler.balance:
        raise AssertionError(f"dealt balance {row['balance']} != the sampler's planned {sampler.balance}")
    return row


def main():
    run(__doc__.splitlines()[0], axolotl_row, packkit_row)


if __name__ == "__main__":
    main()
