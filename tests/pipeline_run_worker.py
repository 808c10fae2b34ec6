"""One process of the gloo pipeline run (tests/test_pipeline_run.py; not run by pytest).

usage: python pipeline_run_worker.py RANK WORLD_SIZE INIT_METHOD OUT   (schedule: env PACKKIT_PP_SCHEDULE;
PACKKIT_PP_FEED=batch-wide passes the PR 4098 form instead: one batch-wide cu_seqlens for the schedule to chunk)

Every rank builds the same seed-0 fp64 Llama, keeps its stages (1f1b: one per rank; interleaved: two, stage i on
rank i % world), packs the step's micro-batches from plan_pipeline and runs one ``schedule.step``. The step's
position_ids / cu_seq_lens go to every rank's step as kwargs (each stage checks its chunk); the first stage's rank
passes the tokens, the last stage's the labels. Each rank saves its parameters' gradients (full-model names) and
the last stage's losses to OUT.rank<R>.pt.
"""
from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

sys.path.insert(0, str(Path(__file__).resolve().parent))

import packkit  # noqa: E402
from packkit.pipeline import plan_pipeline  # noqa: E402
from packkit.training.pipeline import LlamaStage, pipeline_microbatches, split_layers  # noqa: E402
from pipeline_helpers import CAPACITY, LAYERS, LENGTHS, documents, tiny_llama  # noqa: E402

MICROBATCHES = 8


def batch_wide_cu_seqlens(batch) -> torch.Tensor:
    """One 1-D cu_seqlens over all the step's tokens, micro-batches laid end to end (what torchtitan passed)."""
    tokens, offsets = batch.input_ids.shape[1], [0]
    for i, row in enumerate(batch.cu_seq_lens.tolist()):
        offsets += [i * tokens + c for c, prev in zip(row[1:], row[:-1]) if c > prev]
    return torch.tensor(offsets, dtype=torch.int32)


def main() -> int:
    rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    schedule_name = os.environ.get("PACKKIT_PP_SCHEDULE", "1f1b")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    patch = pytest.MonkeyPatch()
    model = tiny_llama(packkit.register_varlen_attention(), patch)
    v = 2 if schedule_name == "interleaved" else 1
    plan = plan_pipeline(LENGTHS, CAPACITY, pp_size=world, num_microbatches=MICROBATCHES, schedule=schedule_name,
                         virtual_stages=v)
    batch = pipeline_microbatches(plan.microbatches[0], documents())
    num_stages = world * v
    ranges = split_layers(LAYERS, num_stages)
    mine = [rank + k * world for k in range(v)]
    modules = [LlamaStage(model, *ranges[i]) for i in mine]
    stages = [PipelineStage(m, i, num_stages, torch.device("cpu")) for m, i in zip(modules, mine)]
    m = batch.num_microbatches
    if v == 1:
        schedule = Schedule1F1B(stages[0], m, loss_fn=batch.loss_fn(), scale_grads=False)
    else:
        schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=batch.loss_fn(), scale_grads=False)
    first, last = 0 in mine, num_stages - 1 in mine
    losses = []
    args = (batch.input_ids,) if first else ()
    target = batch.labels if last else None
    kwargs = batch.model_kwargs()
    if os.environ.get("PACKKIT_PP_FEED") == "batch-wide":  # the PR 4098 form: the schedule chunks it along dim 0
        kwargs["cu_seq_lens"] = batch_wide_cu_seqlens(batch)
    schedule.step(*args, target=target, losses=losses if last else None, **kwargs)
    grads = {n: p.grad.detach().clone() for mod in modules for n, p in mod.named_full_parameters()
             if p.grad is not None}
    result = {"grads": grads, "params": [n for mod in modules for n, _ in mod.named_full_parameters()],
              "losses": [float(x.detach()) for x in losses], "loss": torch.stack(losses).detach().sum() if last else None,
              "microbatches": m}
    torch.save(result, f"{out}.rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    patch.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
