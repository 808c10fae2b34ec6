"""ms-swift's ``BatchSamplerShard`` with the shuffle done per planned step, so a step's rows stay together.

ms-swift's sampler (``swift/dataloader/shard.py``) shuffles **rows** (``randperm(len)[rank::world]``): the rows a
balanced plan put in one step land in different steps. :class:`PlannedBatchSamplerShard` takes the same
arguments, and with ``shuffle=True`` permutes whole steps (seed ``data_seed + epoch``, as ms-swift's), then deals
exactly as ms-swift's unshuffled sampler: rank ``r`` reads rows ``s * world + r``, ``batch_size`` steps at a time.
So with a step-major ``packed_idx`` (:func:`~packkit.integrations.swift.layout.plan_packed_idx`) each optimizer
micro-step gives every rank its row of the same planned steps.
"""
from __future__ import annotations

import torch
from swift.dataloader import BatchSamplerShard


class PlannedBatchSamplerShard(BatchSamplerShard):
    """``BatchSamplerShard(total_samples, batch_size, shuffle, drop_last, data_seed, tp_size, ...)`` dealing
    whole planned steps. ``planned_dp_size`` (keyword): the ranks the dataset was planned for; it must equal the
    sampler's world size (``world_size // tp_size``), else ValueError (a plan for other ranks is not balanced)."""

    def __init__(self, total_samples: int, batch_size: int, shuffle: bool, drop_last: bool, data_seed, tp_size: int = 1,
                 group_by_length: bool = False, lengths=None, *, planned_dp_size: int):
        if group_by_length:
            raise ValueError("group_by_length must be False with packkit's planned packing: rows are already "
                             "grouped into balanced steps (ms-swift ignores it with packing too)")
        super().__init__(total_samples, batch_size, shuffle, drop_last, data_seed, tp_size=tp_size)
        world = self.world_size
        if planned_dp_size != world:
            raise ValueError(f"the packed dataset was planned for dp_size={planned_dp_size} ranks but the sampler "
                             f"deals to {world} (world size / tp_size); plan with dp_size={world}")
        if total_samples % world:
            raise ValueError(f"a planned dataset has whole steps of {world} rows; got {total_samples} rows")
        self.num_steps = total_samples // world

    def __iter__(self):
        world, rank = self.world_size, self.rank
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.curr_seed)
            steps = torch.randperm(self.num_steps, generator=generator).tolist()
        else:
            steps = range(self.num_steps)
        batch = []
        for s in steps:
            batch.append(s * world + rank)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch
