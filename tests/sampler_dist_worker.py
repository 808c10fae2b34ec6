"""One process of the gloo test of ``PackedBatchSampler`` (run by tests/test_sampler.py, not by pytest).

usage: python sampler_dist_worker.py RANK WORLD_SIZE INIT_METHOD OUT_JSON

The sampler takes rank and world size from torch.distributed. Each rank iterates two epochs and the
ranks all_gather_object their rows; a small dataset whose last step leaves one rank an empty row then
runs through DataLoader + PackingCollator with one all_reduce per step (a training step's collective),
so a rank that skipped a step would hang here. A sampler with rows_per_step=3 checks the same
guarantees for several rows per rank per step, including a resume in the middle of a step. Rank 0 writes everything to OUT_JSON for the test to check.
"""
from __future__ import annotations

import datetime
import json
import sys

import numpy as np
import torch
import torch.distributed as dist

import packkit
from packkit.training.sampler import PackedBatchSampler

CAPACITY = 4096
ROWS_PER_STEP = 3
RESUME_AT = 7  # mid-step: row 1 of step 2


def workload() -> np.ndarray:
    rng = np.random.default_rng(7)
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(864), 0.932, 3000))), 1, CAPACITY).astype(np.int64)
    lengths[:3] = 0  # zero-length samples: never yielded
    lengths[3:8] = CAPACITY + 1  # over-long: dropped
    return lengths


def main() -> int:
    rank, world_size, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        lengths = workload()
        sampler = PackedBatchSampler(lengths, CAPACITY, seed=3, overlong="drop")  # rank/world from torch.distributed
        sampler.verify()
        epochs = []
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            rows = list(sampler)
            gathered = [None] * world_size
            dist.all_gather_object(gathered, {"rank": sampler.rank, "world_size": sampler.world_size,
                                              "len": len(sampler), "rows": rows})
            epochs.append({"gathered": gathered, "rank_costs": sampler.rank_costs.tolist(),
                           "balance": sampler.balance, "plan_balance": sampler.plan.balance,
                           "dropped": sampler.dropped.tolist(), "zero_length": sampler.zero_length.tolist()})

        # Three rows per rank per step (gradient accumulation): rows, costs and a resume mid-step.
        acc = PackedBatchSampler(lengths, CAPACITY, seed=5, overlong="drop", rows_per_step=ROWS_PER_STEP)
        acc.verify()
        acc_rows = list(acc)
        resumed = PackedBatchSampler(lengths, CAPACITY, seed=5, overlong="drop", rows_per_step=ROWS_PER_STEP)
        resumed.load_state_dict(acc.state_dict(steps_done=RESUME_AT))
        resumed.verify()
        gathered_acc = [None] * world_size
        dist.all_gather_object(gathered_acc, {"rows": acc_rows, "len": len(acc), "num_steps": acc.num_steps,
                                              "rank_costs": acc.rank_costs.tolist(), "balance": acc.balance,
                                              "resumed": list(resumed)})

        # Three full-capacity samples over two ranks: step 2 has one empty row.
        tokens = [list(range(1, CAPACITY + 1)), list(range(2, CAPACITY + 2)), list(range(3, CAPACITY + 3))]
        small = PackedBatchSampler([CAPACITY] * 3, CAPACITY, seed=0)
        loader = torch.utils.data.DataLoader(tokens, batch_sampler=small,
                                             collate_fn=packkit.PackingCollator(CAPACITY, layout="padded"))
        steps = []
        for step, batch in enumerate(loader):
            label_tokens = batch["labels"].ne(-100).sum()
            total = label_tokens.clone()
            dist.all_reduce(total)  # every rank must reach this once per step
            steps.append({"step": step, "shape": list(batch["input_ids"].shape),
                          "label_tokens": int(label_tokens), "global_label_tokens": int(total)})
        gathered_steps = [None] * world_size
        dist.all_gather_object(gathered_steps, steps)
        dist.barrier()
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump({"lengths": lengths.tolist(), "capacity": CAPACITY, "epochs": epochs,
                           "small_steps": gathered_steps,
                           "rows_per_step": {"k": ROWS_PER_STEP, "resume_at": RESUME_AT, "ranks": gathered_acc}}, f)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
