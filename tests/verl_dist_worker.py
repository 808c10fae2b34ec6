"""One process of the gloo test of packkit's verl drop-in (run by tests/test_rl_verl_dist.py, not by pytest).

usage: python verl_dist_worker.py RANK WORLD_SIZE INIT_METHOD OUT_JSON

Each case calls packkit's ``rearrange_micro_batches`` on every rank with ``dp_group=WORLD`` (synced counts) on
batches that differ between the ranks, records what each rank got (the micro-batch count, each micro-batch's
rows, or the exception's type and message), then runs one all_reduce: a rank that raised while its peer returned
would leave the peer waiting in verl's next collective, so every case ends with one. Rank 0 writes every rank's
records (all_gather_object) to OUT_JSON.
"""
from __future__ import annotations

import datetime
import json
import sys

import torch
import torch.distributed as dist
from tensordict import TensorDict

from packkit.integrations import verl as pv


def batch_of(lengths, width, *, mask=True, odd=False):
    n = len(lengths)
    cols = torch.arange(width)
    m = (cols[None, :] < torch.tensor(lengths, dtype=torch.long).reshape(n, 1)).long()
    if odd:
        m[0, 0] = 2
    fields = {"input_ids": (torch.arange(n * width).reshape(n, width) % 97 + 1) * m}
    if mask:
        fields["attention_mask"] = m
    return TensorDict(fields, batch_size=[n])


def cases(rank):
    """name -> (batch, kwargs) on this rank."""
    short = [40] * 3 if rank == 1 else [90, 80, 70, 95, 60, 85, 75, 65]  # rank 1: fewer rows than rank 0's count
    return {
        # rank 0 needs 6 micro-batches of <= 100 tokens; rank 1 has 3 rows: 3 empty micro-batches there (verl raises)
        "short_rank": (batch_of(short, 100), {"max_token_len": 100}),
        # more micro-batches than rows, asked for on both ranks
        "min_above_rows": (batch_of([30, 20] if rank else [10, 10, 10], 50), {"max_token_len": 50,
                                                                              "min_num_micro_batch": 5}),
        # rank 1's batch has no attention_mask: both ranks raise the same ValueError
        "no_mask_on_one_rank": (batch_of([10, 20], 30, mask=rank == 0), {"max_token_len": 60}),
        # rank 1's rows are wider than max_token_len: both raise verl's ValueError with the group's width
        "wide_on_one_rank": (batch_of([10, 20], 30 if rank == 0 else 80), {"max_token_len": 60}),
        # rank 0's mask holds a 2
        "odd_mask_on_one_rank": (batch_of([10, 20], 30, odd=rank == 0), {"max_token_len": 60}),
        # rank 1's batch (3 rows) is not divisible by force_group_size=2
        "indivisible_on_one_rank": (batch_of([10, 20, 30, 40] if rank == 0 else [10, 20, 30], 40),
                                    {"max_token_len": 80, "force_group_size": 2}),
        # verl's own distributed case, rewritten: ranks of 20 + 5 * rank rows, 300-token cap, the largest count
        "verl_uneven": (batch_of([(37 * i + 11 * rank) % 45 + 45 for i in range(20 + 5 * rank)], 100),
                        {"max_token_len": 300}),
        # a float and a 0-d tensor cap, synced
        "float_cap": (batch_of([50] * (6 + rank), 60), {"max_token_len": 100.5}),
        "tensor_cap": (batch_of([50] * (6 + rank), 60), {"max_token_len": torch.tensor(100)}),
    }


def synced_differential(rank, batches=40):
    """Synced counts of packkit's drop-in and of verl's own function (its collectives moved to the CPU for gloo) on
    the same random batches, different on each rank: [packkit count, verl count or None where verl raised]."""
    import numpy as np
    from verl.utils import seqlen_balancing as sb

    sb.get_device_name = lambda: "cpu"  # verl puts its count tensor on its accelerator; gloo reduces host tensors
    out = []
    for seed in range(batches):
        rng = np.random.default_rng([seed, rank])
        n = int(rng.integers(4, 40))
        lengths = np.minimum(rng.integers(20, 200, n) + np.exp(rng.normal(4.5, 0.8, n)).astype(int), 400).tolist()
        cap = int(rng.choice([400, 500, 800]))
        batch = batch_of(lengths, 400)
        ours = len(pv.rearrange_micro_batches(batch, cap, dp_group=dist.group.WORLD)[0])
        try:
            theirs = len(sb.rearrange_micro_batches(batch, cap, dp_group=dist.group.WORLD)[0])
        except ValueError:  # a rank with fewer rows than the agreed count: verl raises on every rank
            theirs = None
        out.append([ours, theirs])
    return out


def main() -> int:
    rank, world_size, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        records = {}
        for name, (batch, kwargs) in cases(rank).items():
            try:
                micro, idx = pv.rearrange_micro_batches(batch, dp_group=dist.group.WORLD, **kwargs)
                rows = [int(m.batch_size[0]) for m in micro]
                ok = all(torch.equal(m["input_ids"], batch["input_ids"][torch.tensor(i, dtype=torch.long)])
                         for m, i in zip(micro, idx))
                tokens = [int(batch["attention_mask"][torch.tensor(i, dtype=torch.long)].sum()) for i in idx]
                records[name] = {"count": len(micro), "rows": rows, "index_lists": idx, "equal": ok,
                                 "tokens": tokens, "n": int(batch.batch_size[0])}
            except Exception as exc:  # noqa: BLE001 - recorded for the test to compare across ranks
                records[name] = {"error": type(exc).__name__, "message": str(exc)}
            alive = torch.ones(1)
            dist.all_reduce(alive)  # the training step's next collective: reached by every rank
            records[name]["after"] = int(alive.item())
        records["synced_differential"] = synced_differential(rank)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, records)
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(gathered, f)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
