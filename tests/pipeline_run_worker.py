"""One process of the gloo pipeline run (tests/test_pipeline_run.py; not run by pytest).

usage: python pipeline_run_worker.py RANK WORLD_SIZE INIT_METHOD OUT   (schedule: env PACKKIT_PP_SCHEDULE, one of
1f1b, interleaved, zb; DP degree: env PACKKIT_PP_DP, default 1; PACKKIT_PP_FEED=batch-wide passes the PR 4098 form
instead: one batch-wide cu_seqlens for the schedule to chunk)

Mesh: WORLD_SIZE = dp x pp processes, rank = d * pp + p (DeviceMesh ("dp", "pp"), shape (dp, pp)): DP rank d's
pipeline is ranks d*pp .. d*pp + pp - 1 and runs ``plan.microbatches[d]``; stage s's DP group is the ranks with the
same p. Every rank builds the same seed-0 fp64 Llama and keeps its stages (1f1b: one per rank; interleaved and zb:
two, stage i on pipeline rank i % pp, the loop placement packkit's planner and simulator assume for both). It packs
its DP rank's micro-batches, divides the loss by the whole step's label-token count (an all-reduce of the DP ranks'
counts over the DP group) and runs one ``schedule.step``; then sums every gradient over its DP group. The step's
position_ids / cu_seq_lens go to every rank's step as kwargs (each stage checks its chunk); the first stage's rank
passes the tokens, the last stage's the labels. Each rank saves its parameters' gradients after and before the DP
all-reduce (full-model names), its counts and the last stage's losses to OUT.rank<R>.pt.
"""
from __future__ import annotations

import datetime
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B,
                                         ScheduleInterleavedZeroBubble)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import packkit  # noqa: E402
from packkit.pipeline import plan_pipeline  # noqa: E402
from packkit.training.pipeline import LlamaStage, pipeline_microbatches, split_layers  # noqa: E402
from pipeline_helpers import CAPACITY, LAYERS, LENGTHS, documents, tiny_llama  # noqa: E402

MICROBATCHES = 8  # per DP rank with dp = 1; 4 with dp = 2 (rows of 2-3 documents)
SCHEDULES = {"interleaved": ScheduleInterleaved1F1B, "zb": ScheduleInterleavedZeroBubble}


def batch_wide_cu_seqlens(batch) -> torch.Tensor:
    """One 1-D cu_seqlens over all the step's tokens, micro-batches laid end to end (what torchtitan passed)."""
    tokens, offsets = batch.input_ids.shape[1], [0]
    for i, row in enumerate(batch.cu_seq_lens.tolist()):
        offsets += [i * tokens + c for c, prev in zip(row[1:], row[:-1]) if c > prev]
    return torch.tensor(offsets, dtype=torch.int32)


def main() -> int:
    rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    schedule_name = os.environ.get("PACKKIT_PP_SCHEDULE", "1f1b")
    dp = int(os.environ.get("PACKKIT_PP_DP", "1"))
    pp = world // dp
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dp, pp), mesh_dim_names=("dp", "pp"))
    d, p = divmod(rank, pp)
    assert mesh["dp"].get_local_rank() == d and mesh["pp"].get_local_rank() == p
    pp_group, dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
    patch = pytest.MonkeyPatch()
    model = tiny_llama(packkit.register_varlen_attention(), patch)
    v = 1 if schedule_name == "1f1b" else 2
    m = MICROBATCHES // dp
    plan = plan_pipeline(LENGTHS, CAPACITY, pp_size=pp, dp_size=dp, num_microbatches=m, schedule=schedule_name,
                         virtual_stages=v)
    batch = pipeline_microbatches(plan.microbatches[d], documents())
    count = torch.tensor(batch.num_label_tokens)
    dist.all_reduce(count, group=dp_group)  # the whole step's label tokens, every DP rank's summed
    step_count = int(count)
    num_stages = pp * v
    ranges = split_layers(LAYERS, num_stages)
    mine = [p + k * pp for k in range(v)]
    modules = [LlamaStage(model, *ranges[i]) for i in mine]
    stages = [PipelineStage(mod, i, num_stages, torch.device("cpu"), group=pp_group) for mod, i in zip(modules, mine)]
    assert batch.num_microbatches == m
    loss_fn = batch.loss_fn(num_label_tokens=step_count)
    if v == 1:
        schedule = Schedule1F1B(stages[0], m, loss_fn=loss_fn, scale_grads=False)
    else:
        schedule = SCHEDULES[schedule_name](stages, m, loss_fn=loss_fn, scale_grads=False)
    first, last = 0 in mine, num_stages - 1 in mine
    losses = []
    args = (batch.input_ids,) if first else ()
    target = batch.labels if last else None
    kwargs = batch.model_kwargs()
    if os.environ.get("PACKKIT_PP_FEED") == "batch-wide":  # the PR 4098 form: the schedule chunks it along dim 0
        kwargs["cu_seq_lens"] = batch_wide_cu_seqlens(batch)
    schedule.step(*args, target=target, losses=losses if last else None, **kwargs)
    actions = getattr(schedule, "pipeline_order_with_comms", {}).get(p, [])  # the runtime's ops (multi-stage)
    named = [(n, prm) for mod in modules for n, prm in mod.named_full_parameters()]
    local = {n: prm.grad.detach().clone() for n, prm in named if prm.grad is not None}
    for _, prm in named:  # DP: sum each stage's gradients over the ranks holding the same stage
        if prm.grad is not None and dp > 1:
            dist.all_reduce(prm.grad, group=dp_group)
    grads = {n: prm.grad.detach().clone() for n, prm in named if prm.grad is not None}
    result = {"grads": grads, "local_grads": local, "params": [n for n, _ in named], "dp_rank": d, "pp_rank": p,
              "losses": [float(x.detach()) for x in losses], "loss": torch.stack(losses).detach().sum() if last else None,
              "microbatches": m, "num_label_tokens": batch.num_label_tokens, "step_label_tokens": step_count,
              "ops": dict(Counter(a.computation_type.name for a in actions if a is not None))}
    torch.save(result, f"{out}.rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    patch.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
