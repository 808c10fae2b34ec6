"""One process of the pipeline x context-parallel run (tests/test_pipeline_cp_run.py; not run by pytest).

usage: python pipeline_cp_worker.py RANK WORLD_SIZE INIT_METHOD OUT

Mesh: WORLD_SIZE = pp 2 x cp 2 processes, rank = p * cp + c (DeviceMesh ("pp", "cp")): CP rank c's pipeline is
ranks c, cp + c (its own Schedule1F1B over its shards); stage p's CP group is ranks p * cp .. p * cp + cp - 1. Every
rank builds the same seed-0 fp64 Llama, keeps stage p's layers, and takes CP rank c's shards of plan_pipeline's
micro-batches (packkit.training.pipeline.pipeline_cp_microbatches). Inside each stage, attention all-gathers K/V
over the stage's CP group (autograd-aware, as tests/cp_dist_worker.py: the backward all-reduces the gathered
gradient and keeps the rank's slice) and masks by segment and global position, both read from the step's kwargs
(the key side, kv_seq_idx / kv_position_ids, comes with the batch: every rank knows the plan, nothing is gathered
for it). Three steps in one launch, each a fresh PipelineStage + Schedule1F1B: zigzag, contiguous, and the control
``zigzag-local``: positions that restart per local segment (a shard packed as if it were its own row: not the
global positions), the stage's check_cp_microbatch off so that it runs. After each step every gradient is summed over
the stage's CP group. Each rank saves, per step, its last-stage losses, its gradients before and after the CP
all-reduce (full-model names) and the step's label-token count to OUT.rank<R>.pt.
"""
from __future__ import annotations

import datetime
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

sys.path.insert(0, str(Path(__file__).resolve().parent))

from packkit.context_parallel import cp_padded_lengths  # noqa: E402
from packkit.pipeline import plan_pipeline  # noqa: E402
from packkit.training.pipeline import LlamaStage, check_cp_microbatch, pipeline_cp_microbatches, split_layers  # noqa: E402
from pipeline_helpers import LAYERS, LENGTHS, documents, tiny_llama  # noqa: E402

PP, CP, MICROBATCHES = 2, 2, 8
ROW = 40  # pre-shard row: the 16 documents zigzag-padded to multiples of 4 are 264 tokens, > 8 x 32; 20 per CP rank
RUNS = (("zigzag", "global"), ("contiguous", "global"), ("zigzag", "local"))


class _GatherSeq(torch.autograd.Function):
    """all_gather along the sequence dim (2) of [B, H, n, D] over ``group``; backward: sum every rank's gradient
    of the gathered tensor (all_reduce) and keep this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.n, ctx.group = x.shape[2], group
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        r = dist.get_rank(ctx.group)
        return grad[:, :, r * ctx.n:(r + 1) * ctx.n], None


def cp_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                 cp_allowed=None, cp_group=None, **kwargs):
    """Causal attention of the local queries over every CP rank's keys of the same micro-batch: ``cp_allowed``
    [L, cp * L] (same segment, key position <= query position) from the stage's kwargs."""
    k, v = _GatherSeq.apply(key, cp_group), _GatherSeq.apply(value, cp_group)
    heads = query.shape[1]
    if k.shape[1] != heads:
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    scores = torch.matmul(query, k.transpose(-1, -2)) * scaling
    out = torch.matmul(torch.softmax(scores.masked_fill(~cp_allowed, float("-inf")), dim=-1), v)
    return out.transpose(1, 2).contiguous(), None


class CPStage(LlamaStage):
    """LlamaStage whose attention spans the stage's CP group; the micro-batch's shard metadata comes as kwargs."""

    def __init__(self, model, start, stop, group, cp_rank):
        super().__init__(model, start, stop)
        self.group, self.cp_rank, self.mode, self.guard = group, cp_rank, "zigzag", True

    def forward(self, x, position_ids, seq_idx, cu_seq_lens, kv_position_ids, kv_seq_idx):
        h = self.embed_tokens(x) if self.first else x
        if self.guard:  # the chunk is this micro-batch's own shard: local boundaries 0 .. L, global positions
            check_cp_microbatch(cu_seq_lens, h.shape[1], position_ids, cp_size=CP, cp_rank=self.cp_rank,
                                mode=self.mode)
        allowed = (seq_idx[0][:, None] == kv_seq_idx[0][None, :]) & (kv_position_ids[0][None, :] <= position_ids[0][:, None])
        rotary = self.rotary_emb(h, position_ids=position_ids)
        for layer in self.layers:
            h = layer(h, attention_mask=None, position_ids=position_ids, position_embeddings=rotary, use_cache=False,
                      cp_allowed=allowed, cp_group=self.group)
        if self.last:
            h = self.lm_head(self.norm(h))
        return h


def local_positions(batch):
    """The control's positions: each shard's local segments counted from 0 (what packing the shard as its own row
    gives), for the queries and, rank by rank, for the keys."""
    def restart(cu, width):
        pos = np.zeros(width, np.int64)
        for a, b in zip(cu[:-1], cu[1:]):
            pos[a:b] = np.arange(b - a)
        return pos
    width = batch.input_ids.shape[1]
    q, kv = [], []
    for i in range(batch.num_microbatches):
        q.append(restart(batch.cu_seq_lens[i].tolist(), width))
        keys = []
        for r in range(CP):
            other = pipeline_cp_microbatches([MB[i]], documents(), CP, r, batch.mode, row_len=batch.row_len,
                                             max_sequences=batch.cu_seq_lens.shape[1] - 1)
            keys.append(restart(other.cu_seq_lens[0].tolist(), width))
        kv.append(np.concatenate(keys))
    return torch.tensor(np.stack(q)), torch.tensor(np.stack(kv))


MB: list = []


def main() -> int:
    rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    assert world == PP * CP
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (PP, CP), mesh_dim_names=("pp", "cp"))
    p, c = divmod(rank, CP)
    assert mesh["pp"].get_local_rank() == p and mesh["cp"].get_local_rank() == c
    pp_group, cp_group = mesh["pp"].get_group(), mesh["cp"].get_group()
    from transformers import AttentionInterface

    AttentionInterface.register("packkit_pp_cp_test", cp_attention)
    patch = pytest.MonkeyPatch()
    model = tiny_llama("packkit_pp_cp_test", patch)
    plan = plan_pipeline(cp_padded_lengths(LENGTHS, CP), ROW, pp_size=PP, num_microbatches=MICROBATCHES)
    MB[:] = plan.microbatches[0]
    module = CPStage(model, *split_layers(LAYERS, PP)[p], group=cp_group, cp_rank=c)
    first, last = p == 0, p == PP - 1
    named = module.named_full_parameters()
    result = {"params": [n for n, _ in named], "pp_rank": p, "cp_rank": c, "runs": {}}
    for mode, feed in RUNS:
        batch = pipeline_cp_microbatches(MB, documents(), CP, c, mode, row_len=ROW)
        assert batch.num_microbatches == MICROBATCHES and batch.input_ids.shape == (MICROBATCHES, ROW // CP)
        kwargs = batch.model_kwargs()
        module.mode, module.guard = mode, feed == "global"
        if feed == "local":
            kwargs["position_ids"], kwargs["kv_position_ids"] = local_positions(batch)
        model.zero_grad(set_to_none=True)
        stage = PipelineStage(module, p, PP, torch.device("cpu"), group=pp_group)
        schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=batch.loss_fn(), scale_grads=False)
        losses = []
        schedule.step(*((batch.input_ids,) if first else ()), target=batch.shift_labels if last else None,
                      losses=losses if last else None, **kwargs)
        local = {n: prm.grad.detach().clone() for n, prm in named if prm.grad is not None}
        for _, prm in named:  # CP: sum each stage's gradients over its CP group
            if prm.grad is not None:
                dist.all_reduce(prm.grad, group=cp_group)
        result["runs"][f"{mode}-{feed}"] = {
            "losses": [float(x.detach()) for x in losses], "local_grads": local,
            "grads": {n: prm.grad.detach().clone() for n, prm in named if prm.grad is not None},
            "num_label_tokens": batch.num_label_tokens}
    torch.save(result, f"{out}.rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    patch.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
