"""Wall time of a real CPU pipeline step (torch.distributed.pipelining, gloo), packkit's packed micro-batches
against pad-to-longest micro-batches (issue 61 part 5).

Two processes, two stages (Schedule1F1B), one thread each, a small random Llama in fp32 (hidden 64, 4 layers,
intermediate 256, vocab 100: compute dominates over the schedule's messages). One long-tail batch: ``--docs``
lengths lognormal (median ``--median``, sigma 1.0), clipped to [8, ``--longest``], the longest set to
``--longest``. Both feedings run ``--microbatches`` micro-batches per step:

- ``packkit``: ``plan_pipeline(lengths, capacity=longest, pp_size=2, num_microbatches=m, padding_cost=1.0)``'s rows
  (padded to one shape, so a light row costs a full one), packed by
  ``pipeline_microbatches`` ((m, capacity) tokens, (m, N + 1) cu_seq_lens), attention ``packkit_varlen``
  (per-document on the CPU);
- ``pad-to-longest``: the documents in input order, ``docs / m`` per micro-batch, every row padded to the step's
  longest document (NeMo-RL-style padding; one shape per step: schedule.step chunks whole-batch tensors),
  attention SDPA, causal (right padding is never seen by a real token; its labels are ignored).

``--warmup`` steps are discarded, then ``--repeats`` steps are timed (barrier, step, barrier, on rank 0); the
table gives medians and the ratio of medians. Writes benchmarks/results/pipeline_run_cpu.json.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402

MODEL = dict(vocab_size=100, hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=4096, use_cache=False)


def workload(docs: int, median: int, longest: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(median), 1.0, docs))), 8, longest).astype(int)
    lengths[int(np.argmax(lengths))] = longest
    return lengths.tolist()


def feed(mode: str, lengths: list, m: int, seed: int):
    """(args tensor, labels, kwargs, loss_fn, padded tokens) of one step."""
    from packkit.training.pipeline import pipeline_microbatches
    from packkit.training.pipeline.microbatches import IGNORE, PackedLoss

    rng = np.random.default_rng(seed + 1)
    seqs = [rng.integers(1, MODEL["vocab_size"], n).tolist() for n in lengths]
    longest = max(lengths)
    if mode == "packkit":
        from packkit.pipeline import plan_pipeline

        # every micro-batch is padded to `longest` (one shape per step): a padding token costs what a token does
        plan = plan_pipeline(lengths, longest, pp_size=2, num_microbatches=m, padding_cost=1.0)
        batch = pipeline_microbatches(plan.microbatches[0], seqs, row_len=longest)
        return batch.input_ids, batch.labels, batch.model_kwargs(), batch.loss_fn(), int(batch.input_ids.numel())
    per = -(-len(seqs) // m)
    rows = per * m
    ids = torch.zeros(rows, longest, dtype=torch.int64)
    labels = torch.full((rows, longest), IGNORE, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        labels[i, 1:len(s)] = torch.tensor(s[1:])
    positions = torch.arange(longest).expand(rows, longest).contiguous()
    count = int((labels[:, 1:] != IGNORE).sum())
    return ids, labels, {"position_ids": positions}, PackedLoss(count), int(ids.numel())


def worker(rank: int, world: int, init: str, mode: str, lengths: list, m: int, warmup: int, repeats: int,
           out: str) -> None:
    import torch.distributed as dist
    import transformers
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    import packkit
    from packkit.training.pipeline import LlamaStage, split_layers

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    attn = packkit.register_varlen_attention() if mode == "packkit" else "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**MODEL), attn_implementation=attn)
    module = LlamaStage(model, *split_layers(MODEL["num_hidden_layers"], world)[rank])
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    ids, labels, kwargs, loss_fn, tokens = feed(mode, lengths, m, 0)
    schedule = Schedule1F1B(stage, m, loss_fn=loss_fn, scale_grads=False)
    optim = torch.optim.SGD(module.parameters(), lr=1e-3)
    times = []
    for step in range(warmup + repeats):
        optim.zero_grad(set_to_none=True)
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            schedule.step(ids, **kwargs)
        else:
            schedule.step(target=labels, **kwargs)
        optim.step()
        dist.barrier()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        torch.save({"times": times, "tokens": tokens}, out)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--median", type=int, default=128)
    parser.add_argument("--longest", type=int, default=1024)
    parser.add_argument("--microbatches", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["OMP_NUM_THREADS"] = "1"
    lengths = workload(args.docs, args.median, args.longest, args.seed)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("packkit", "pad-to-longest"):
            out = str(Path(tmp) / f"{mode}.pt")
            mp.spawn(worker, args=(2, f"tcp://127.0.0.1:{free_port()}", mode, lengths, args.microbatches,
                                   args.warmup, args.repeats, out), nprocs=2, join=True)
            r = torch.load(out)
            rows[mode] = {"median_s": statistics.median(r["times"]), "times_s": r["times"], "tokens": r["tokens"]}
    ratio = rows["pad-to-longest"]["median_s"] / rows["packkit"]["median_s"]
    print(f"{len(lengths)} documents, {sum(lengths)} tokens (median {int(np.median(lengths))}, longest "
          f"{max(lengths)}), 2 stages x {args.microbatches} micro-batches, Schedule1F1B, gloo, 1 thread per rank")
    print(f"{'feeding':<16}{'tokens/step':>12}{'median s/step':>15}")
    for mode, row in rows.items():
        print(f"{mode:<16}{row['tokens']:>12}{row['median_s']:>15.3f}")
    print(f"pad-to-longest / packkit (ratio of medians): {ratio:.2f}x")
    doc = {"machine": _results.machine_info(), "lengths": lengths, "model": MODEL, "microbatches": args.microbatches,
           "warmup": args.warmup, "repeats": args.repeats, "schedule": "1f1b", "processes": 2, "rows": rows,
           "ratio_of_medians": ratio}
    _results.write_results(doc, "pipeline_run_cpu.json", Path(args.out) if args.out else None,
                           quick=args.repeats < 5)


if __name__ == "__main__":
    main()
