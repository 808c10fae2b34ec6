"""One context-parallel rank of the training-semantics test (run by tests/test_cp_training.py, not by pytest).

usage: python cp_dist_worker.py RANK WORLD_SIZE INIT_METHOD OUT_JSON

With WORLD_SIZE 4, ranks 0-1 first run cp 2 (a subgroup), then all four run cp 4: one launch covers both.

Every rank packs the same documents (flat), takes its shard with packkit.shard_context_parallel and runs a
tiny random-init fp64 Llama whose attention all-gathers K/V from every CP rank (autograd-aware: the backward
all-reduces the gathered gradient and keeps the rank's slice) and masks by document (seq_idx) and global
position. Its loss is the sum of its shard's token losses (cross-entropy against shift_labels) over the
global token count; gradients are all-reduced. For "zigzag" and "contiguous", and for a control that
shifts the unshifted labels after the split (as a model shifting its own labels would), rank 0 writes the
loss and gradients' relative errors against the unpacked per-sequence run to OUT_JSON.
"""
from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import packkit  # noqa: E402
from llama_helpers import sequences, tiny_llama, worst_rel_err  # noqa: E402

CTX: dict = {}


class _GatherSeq(torch.autograd.Function):
    """all_gather along the sequence dim (2) of [B, H, n, D]; backward: sum every rank's gradient of the
    gathered tensor (all_reduce) and keep this rank's slice."""

    @staticmethod
    def forward(ctx, x):
        group = CTX["group"]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.n = x.shape[2]
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=CTX["group"])
        r = dist.get_rank(CTX["group"])
        return grad[:, :, r * ctx.n:(r + 1) * ctx.n]


def cp_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """Causal attention of the local queries over every rank's keys, by document and global position."""
    k, v = _GatherSeq.apply(key), _GatherSeq.apply(value)
    heads = query.shape[1]
    if k.shape[1] != heads:
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    scores = torch.matmul(query, k.transpose(-1, -2)) * scaling
    allowed = (CTX["doc_q"][:, None] == CTX["doc_k"][None, :]) & (CTX["pos_k"][None, :] <= CTX["pos_q"][:, None])
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v)
    return out.transpose(1, 2).contiguous(), None


def gather_flat(t):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(CTX["group"]))]
    dist.all_gather(parts, t.contiguous(), group=CTX["group"])
    return torch.cat(parts)


def unpacked_reference(seqs):
    model = tiny_llama(seed=0, attn="sdpa", dtype=torch.float64)  # eager would softmax in fp32
    model.zero_grad(set_to_none=True)
    total, count = 0.0, 0
    for s in seqs:
        ids = torch.tensor([s])
        logits = model(input_ids=ids, use_cache=False).logits[0]
        total = total + torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
        count += len(s) - 1
    loss = total / count
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}, count


def cp_step(model, seqs, cp, rank, mode, count, control=False):
    batch = packkit.pack_sequences(seqs)
    shard = packkit.shard_context_parallel(batch, cp, rank, mode)
    CTX["doc_q"], CTX["pos_q"] = shard["seq_idx"][0], shard["position_ids"][0]
    CTX["doc_k"], CTX["pos_k"] = gather_flat(CTX["doc_q"]), gather_flat(CTX["pos_q"])
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=shard["input_ids"], position_ids=shard["position_ids"], use_cache=False).logits[0]
    if control:  # the bug the issue describes: shifting the split labels on the rank
        lab = shard["labels"][0]
        target = torch.cat([lab[1:], lab.new_full((1,), -100)])
    else:
        target = shard["shift_labels"][0]
    loss = torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, reduction="sum") / count
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total, group=CTX["group"])
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(g, group=CTX["group"])
        grads[n] = g
    return total, grads


def main() -> int:
    rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    from transformers import AttentionInterface

    AttentionInterface.register("packkit_cp_test", cp_attention)
    # transformers' fp32 casts (norms, rotary) made fp64 for the whole run: no result depends on the CPU's vector
    # unit, so this file needs no ATEN_CPU_CAPABILITY reruns (the exactness marker)
    import pytest
    from model_zoo import fp64_everywhere

    fp64_everywhere(tiny_llama(seed=0, dtype=torch.float64), pytest.MonkeyPatch())
    seqs = sequences(0)[:6]
    ref_loss, ref_grads, count = unpacked_reference(seqs)
    model = tiny_llama(seed=0, attn="packkit_cp_test", dtype=torch.float64)
    result = {}
    sizes = [2, world] if world == 4 else [world]
    groups = {cp: dist.new_group(list(range(cp))) if cp != world else dist.group.WORLD for cp in sizes}
    for cp in sizes:
        if rank >= cp:
            continue
        CTX["group"] = groups[cp]
        for mode, control in (("zigzag", False), ("contiguous", False), ("zigzag", True)):
            loss, grads = cp_step(model, seqs, cp, rank, mode, count, control)
            key = f"cp{cp}_{mode}" + ("_control" if control else "")
            result[key] = {"loss": float(loss), "ref_loss": float(ref_loss),
                           "loss_rel": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
                           "grad_rel": worst_rel_err(grads, ref_grads)}
    if rank == 0:
        Path(out_path).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
