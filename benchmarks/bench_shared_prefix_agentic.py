"""Agent-RL rows of the shared-prefix benchmark (issue 49): ``python benchmarks/bench_shared_prefix.py --agentic``.

1. Host side, at 256 / 2,048 / 8,192 trajectories of the agent workload (``agentic_workload.py``: a 2,000-token
   system prompt, 6 turns of 150-600 tokens, 4 branches per turn, assistant turns labelled, tool output -100):
   ``pack_tree(trajectories, labels=...)`` (the C++ radix build), the Python reference build
   (``build_tree_reference``, what ``pack_tree`` ran before) and ``pack_sequences`` on the same lists. Each in its own
   process: seconds (one run after the lists exist) and peak RSS above the process with its lists built.
2. One training step (forward + backward, CPU fp32) of the tiny Llama of ``bench_shared_prefix.py`` on a scaled
   copy of the workload (16 trajectories, system 256, 6 turns of 24-96 tokens, 4 branches), three ways, each in its
   own process, the loss (mean NLL of the labelled tokens) checked equal first: ``tree`` (pack_tree, labels),
   ``flat`` (every trajectory its own document in one row: the same attention code) and ``padded`` (one row per
   trajectory, HF SDPA with an attention mask).
"""
from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import resource
import statistics
import time

import numpy as np
import torch

from agentic_workload import agentic_trajectories

SIZES = (256, 2048, 8192)
QUICK_SIZES = (64,)
HOST_SYSTEMS = ("pack_tree", "reference_build", "pack_sequences")
STEP = dict(n=16, system=256, turns=6, branches=4, lo=24, hi=96, vocab=4096)
QUICK_STEP = dict(n=6, system=32, turns=3, branches=2, lo=4, hi=12, vocab=4096)
STEP_SYSTEMS = ("tree", "flat", "padded")


def _host(system, n, queue):
    trajs, labels = agentic_trajectories(n, labels=True)
    import packkit
    from packkit import shared_prefix as sp
    from packkit.shared_prefix.radix import build_tree_reference

    score = [next((j for j, v in enumerate(lab) if v != -100), len(lab)) for lab in labels]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if system == "pack_tree":
        batch, info = sp.pack_tree(trajs, labels=labels)
        extra = {"tokens_forwarded": info.tokens_forwarded, "tokens_unshared": info.tokens_unshared,
                 "nodes": info.forest.num_nodes}
    elif system == "reference_build":
        forest = build_tree_reference(trajs, score_from=score)
        extra = {"tokens_forwarded": int(forest.length.sum())}
    else:
        batch = packkit.pack_sequences(trajs)
        extra = {}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put({"system": system, "trajectories": n, "seconds": seconds, "extra_mb": (peak - base) / 1024,
               "lists_mb": base / 1024, "tokens": sum(map(len, trajs)), **extra})


def _step(system, spec, repeats, queue):
    import bench_shared_prefix as b
    from packkit import shared_prefix as sp

    torch.set_num_threads(1)
    model = b.tiny_model()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spec = dict(spec)
    n = spec.pop("n")
    trajs, labels = agentic_trajectories(n, labels=True, **spec)
    if system in ("tree", "flat"):
        model.set_attn_implementation(sp.register_attention())
        if system == "tree":
            batch, info = sp.pack_tree(trajs, labels=labels)
        else:
            forest = sp.sequences_forest(trajs)
            forest = forest._replace(labels=torch.tensor([v for lab in labels for v in lab]),
                                     score_start=np.array([next((j for j, v in enumerate(lab) if v != -100), len(lab))
                                                           for lab in labels], np.int64))
            batch, info = sp.pack_tree(forest)
        tokens = int(batch["input_ids"].numel())

        def loss_fn():
            result = sp.completion_logprobs(model(**batch, use_cache=False).logits, info)
            return -(result.padded * result.mask).sum() / result.mask.sum()
    else:
        width = max(map(len, trajs))
        ids = torch.zeros(len(trajs), width, dtype=torch.long)
        mask = torch.zeros(len(trajs), width, dtype=torch.long)
        lab = torch.full((len(trajs), width), -100, dtype=torch.long)
        for i, (t, l) in enumerate(zip(trajs, labels)):
            ids[i, :len(t)], mask[i, :len(t)], lab[i, :len(t)] = torch.tensor(t), 1, torch.tensor(l)
        tokens = int(ids.numel())

        def loss_fn():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
            target = lab[:, 1:]
            keep = target != -100
            logp = torch.log_softmax(logits[keep], -1).gather(1, target[keep][:, None])[:, 0]
            return -logp.mean()

    def step():
        model.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        return float(loss.detach())

    loss = step()
    times, cpu = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put({"system": system, "tokens": tokens, "loss": loss, "seconds": statistics.median(times),
               "cpu_seconds": statistics.median(cpu), "all_seconds": times, "extra_mb": (peak - base) / 1024})


def _in_process(target, *args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, q))
    proc.start()
    while True:
        try:
            out = q.get(timeout=1.0)
            break
        except queue_module.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"{args[0]}: its process died (exit code {proc.exitcode})")
    proc.join()
    return out


def main_agentic(args, machine_info, write_results):
    sizes = QUICK_SIZES if args.quick else SIZES
    host = []
    print(f"{'trajectories':>12s} {'system':16s} {'tokens':>10s} {'forwarded':>10s} {'seconds':>8s} {'+MB':>7s} "
          f"{'lists MB':>8s}")
    for n in sizes:
        for system in HOST_SYSTEMS:
            r = _in_process(_host, system, n)
            host.append(r)
            print(f"{n:12d} {system:16s} {r['tokens']:10d} {r.get('tokens_forwarded', r['tokens']):10d} "
                  f"{r['seconds']:8.3f} {r['extra_mb']:7.0f} {r['lists_mb']:8.0f}")
    spec = QUICK_STEP if args.quick else STEP
    steps = {s: _in_process(_step, s, spec, 1 if args.quick else args.repeats) for s in STEP_SYSTEMS}
    ref = steps["tree"]["loss"]
    print(f"\n{'step':8s} {'tokens':>7s} {'s/step':>8s} {'cpu s':>8s} {'+MB':>7s} {'vs tree':>8s}")
    for name, r in steps.items():
        r["loss_agrees"] = abs(r["loss"] - ref) <= 1e-4 * abs(ref)
        r["time_vs_tree"] = r["seconds"] / steps["tree"]["seconds"]
        print(f"{name:8s} {r['tokens']:7d} {r['seconds']:8.3f} {r['cpu_seconds']:8.3f} {r['extra_mb']:7.0f} "
              f"{r['time_vs_tree']:7.2f}x{'' if r['loss_agrees'] else '  LOSS DIFFERS'}")
    doc = {"machine": machine_info(), "host": host, "step": steps, "step_workload": spec,
           "notes": "host: one run per system and size, each in its own process after the lists are built; +MB = peak "
                    "RSS minus the RSS with the lists built. step: CPU fp32 forward+backward, one torch thread per "
                    "process, median of repeats after a warm-up."}
    write_results(doc, "shared_prefix_agentic_cpu.json", args.out, args.quick)
    return doc
