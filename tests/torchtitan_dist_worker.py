"""One gloo rank of tests/test_torchtitan.py::test_two_dp_ranks_on_gloo: builds packkit's torchtitan dataloader
through its Config, as torchtitan's Trainer does, for this dp rank, gathers every rank's batches and (rank 0)
writes what the test checks: the documents and every rank's batches (inputs, positions, labels) per step."""
from __future__ import annotations

import datetime
import json
import sys

import torch
import torch.distributed as dist

from packkit.integrations.torchtitan import PackkitDataLoader

SEQ_LEN, BATCH = 96, 2


def documents():
    """Document i is i+1 repeated (ids tell documents apart in a packed row); lengths lognormal-ish."""
    g = torch.Generator().manual_seed(0)
    lengths = (torch.randn(300, generator=g) * 0.8 + 3.0).exp().long().clamp(2, SEQ_LEN + 1)
    return [[i + 1] * int(n) for i, n in enumerate(lengths)]


def main() -> int:
    rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    config = PackkitDataLoader.Config(source=documents(), infinite=False, buffer_size=128, cost=(96.0, 1.0))
    loader = config.build(dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=SEQ_LEN,
                          local_batch_size=BATCH, snapshot_every_n_steps=1)
    steps = [(inputs["input"].tolist(), inputs["positions"].tolist(), labels.tolist()) for inputs, labels in loader]
    gathered = [None] * world
    dist.all_gather_object(gathered, steps)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"docs": documents(), "ranks": gathered}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
