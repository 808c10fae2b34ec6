"""Shared-prefix packing benchmark (issue 30): one training step (forward + backward, fp32) of a small
Llama-shaped model on GRPO-like groups and DPO pairs, three ways, in one run:

* ``shared``: ``packkit.shared_prefix.pack_groups`` (each prompt once) + its registered attention (the
  two-pass math on the CPU, FlashAttention varlen on a GPU), loss from ``completion_logprobs``;
* ``unshared``: the same sequences packed without sharing (one document per prompt + completion, the same
  per-document attention code: pass 1 of the two-pass path alone), the same loss;
* ``prefix_grouper``: PrefixGrouper 0.0.1.post1 on the same groups (padded group rows; its two attention
  calls through a padded SDPA adapter with bottom-right-aligned causal masking, as flash-attn would mask;
  suffix positions continue from the prefix), loss from ``split_output(logits, include_prefix_last=1)``.

Reported per workload and system: tokens forwarded (padding included for PrefixGrouper's padded rows), median
seconds per step, peak resident memory of a fresh process (each system runs in its own process; baseline = the
same process after loading the model), and ratios of medians (unshared / shared, prefix_grouper / shared).
Every system's loss is checked equal to the shared one (fp32, rel 1e-4) before timing.

    python benchmarks/bench_shared_prefix.py            # writes benchmarks/results/shared_prefix_cpu.json
    python benchmarks/bench_shared_prefix.py --quick    # smoke run, small groups, writes nothing
    python benchmarks/bench_shared_prefix.py --device cuda --dtype bf16   # GPU rows: shared_prefix_<gpu>.json
    python benchmarks/bench_shared_prefix.py --vlm      # vision-language rows (bench_shared_prefix_vlm.py):
                                                        # shared_prefix_vlm_cpu.json
    python benchmarks/bench_shared_prefix.py --agentic  # agent trajectories (bench_shared_prefix_agentic.py):
                                                        # shared_prefix_agentic_cpu.json

On a GPU (``--device cuda``) the systems are ``shared`` (the FlashAttention-varlen two-pass path),
``shared_flex`` (FlexAttention with the tree BlockMask), ``unshared`` (varlen, pass 1 only) and
``prefix_grouper`` (its padded SDPA adapter), timed with ``torch.cuda.synchronize`` and peak memory from
``torch.cuda.max_memory_allocated`` (model loaded first, then the peak reset).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import queue as queue_module
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_info, results_name, write_results  # noqa: E402

VOCAB = 4096
MODEL = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=8192)

# (name, prompt range, G, completion median, number of groups); DPO: G = 2.
WORKLOADS = [
    ("grpo-p512-g8-c128", (512, 512), 8, 128, 2),
    ("grpo-p1024-g16-c256", (1024, 1024), 16, 256, 1),
    ("grpo-p2048-g8-c512", (2048, 2048), 8, 512, 1),
    ("grpo-p512..2048-g16-c128", (512, 2048), 16, 128, 2),
    ("dpo-p512..1024-c256", (512, 1024), 2, 256, 8),
]
QUICK = [("grpo-quick", (64, 64), 4, 16, 2), ("dpo-quick", (32, 64), 2, 16, 3)]


def make_groups(spec, seed=0):
    _, (plo, phi), g, median, n = spec
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for _ in range(n):
        prompts.append(rng.integers(1, VOCAB, int(rng.integers(plo, phi + 1))).tolist())
        lens = np.clip(np.exp(rng.normal(np.log(median), 0.5, g)).astype(int), 1, 4 * median)
        completions.append([rng.integers(1, VOCAB, int(c)).tolist() for c in lens])
    return prompts, completions


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def tiny_model(device="cpu", dtype="fp32"):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**MODEL, use_cache=False, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=DTYPES[dtype])


# --- the three systems: each returns a function running one training step and returning its loss -------------
def step_shared(model, prompts, completions, share=True, attention="varlen"):
    from packkit import shared_prefix as sp

    model.set_attn_implementation(sp.register_attention())
    device = model.device
    if share:
        batch, info = sp.pack_groups(prompts, completions, attention=attention, device=device)
    else:  # every prompt + completion its own document (a one-node tree), scored from the prompt's end
        seqs = [p + c for p, cs in zip(prompts, completions) for c in cs]
        score = [len(p) for p, cs in zip(prompts, completions) for _ in cs]
        batch, info = sp.pack_tree(sp.sequences_forest(seqs, score), attention=attention, device=device)

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(**batch, use_cache=False).logits
        result = sp.completion_logprobs(logits, info)
        loss = -(result.padded * result.mask).sum() / result.mask.sum()
        loss.backward()
        return float(loss.detach())
    return step, int(batch["input_ids"].numel())


def _pg_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """PrefixGrouper's attention calls on the CPU, masked as transformers' flash_attention_2 does with a 2-D mask:
    queries are the mask's last ``lq`` columns, valid tokens are unpadded, and causal masking is aligned
    bottom-right (valid query t sees valid keys up to t + n_keys - n_queries)."""
    lq = query.shape[-2]
    valid = attention_mask.bool()
    q_valid = valid[:, -lq:]
    key_rank = valid.long().cumsum(-1) - 1
    q_rank = q_valid.long().cumsum(-1) - 1
    shift = (valid.sum(-1) - q_valid.sum(-1))[:, None, None]
    mask = valid[:, None, :] & (key_rank[:, None, :] <= q_rank[:, :, None] + shift) & q_valid[:, :, None]
    mask = mask | ~mask.any(-1, keepdim=True)  # padded queries: attend to something (discarded) instead of NaN
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask[:, None], scale=scaling,
                                                           enable_gqa=True)
    return out.transpose(1, 2), None


def step_prefix_grouper(model, prompts, completions):
    from prefix_grouper import PrefixGrouper
    from prefix_grouper.utils.register_transformers import register_attention
    from transformers import AttentionInterface

    register_attention()
    AttentionInterface.register("pk_pg_sdpa", _pg_sdpa)
    model.set_attn_implementation("prefix_grouper_attention")
    group_info = [[len(p), *map(len, cs)] for p, cs in zip(prompts, completions)]
    pg = PrefixGrouper(group_info, padding_mode="right")
    width = max(sum(g) for g in group_info)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    pos = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, (p, cs) in enumerate(zip(prompts, completions)):
        row, at = list(p), len(p)
        pos[b, :at] = torch.arange(at)
        for c in cs:
            pos[b, at:at + len(c)] = torch.arange(len(p), len(p) + len(c))
            row += c
            at += len(c)
        ids[b, :len(row)] = torch.tensor(row)
    ids, pos = ids.to(model.device), pos.to(model.device)

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, position_ids=pos, prefix_grouper=pg, prefix_grouper_attn_func="pk_pg_sdpa",
                       use_cache=False).logits
        _, _, suffix, suffix_mask = pg.split_output(logits, include_prefix_last=1)
        _, _, suffix_ids, _ = pg.split_output(ids.unsqueeze(-1).float(), include_prefix_last=0)
        logp = torch.log_softmax(suffix[:, :-1], -1).gather(-1, suffix_ids.long())[..., 0]
        mask = suffix_mask[:, 1:].bool()
        loss = -(logp * mask).sum() / mask.sum()
        loss.backward()
        return float(loss.detach())
    return step, int(ids.numel())


SYSTEMS = {"shared": lambda m, p, c: step_shared(m, p, c, True), "unshared": lambda m, p, c: step_shared(m, p, c, False),
           "prefix_grouper": step_prefix_grouper}
GPU_SYSTEMS = {**SYSTEMS, "shared_flex": lambda m, p, c: step_shared(m, p, c, True, "flex")}
GPU_ORDER = ("shared", "shared_flex", "unshared", "prefix_grouper")


def _run(system, spec, repeats, queue, device="cpu", dtype="fp32", vlm=False):
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cuda = device == "cuda"
    if vlm:
        import bench_shared_prefix_vlm as v

        # One thread per process: on a shared, loaded CPU idle intra-op threads spin and inflate CPU time unevenly.
        torch.set_num_threads(1)
        model = v.tiny_vlm(device, DTYPES[dtype])
    else:
        model = tiny_model(device, dtype)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if cuda:
        torch.cuda.synchronize()
        base_gpu = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    prompts, completions = v.make_groups(spec) if vlm else make_groups(spec)
    step, tokens = (v.SYSTEMS if vlm else GPU_SYSTEMS if cuda else SYSTEMS)[system](model, prompts, completions)
    counts = tokens if vlm else {"tokens": tokens}
    loss = step()  # warm-up (and the loss every system must agree on)
    times, cpu_times = [], []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"system": system, **counts, "seconds": statistics.median(times), "all_seconds": times,
           "cpu_seconds": statistics.median(cpu_times), "all_cpu_seconds": cpu_times,
           "loss": loss, "peak_rss_mb": peak / 1024, "model_rss_mb": base / 1024}
    if cuda:  # the device's memory is what a GPU step is limited by: report it in the same columns
        out.update(peak_rss_mb=torch.cuda.max_memory_allocated() / 2**20, model_rss_mb=base_gpu / 2**20,
                   host_peak_rss_mb=peak / 1024)
    queue.put(out)


def run_one(system, spec, repeats, device="cpu", dtype="fp32", vlm=False):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_run, args=(system, spec, repeats, queue, device, dtype, vlm))
    proc.start()
    while True:  # a child that dies (an exception, OOM) must fail the run, not leave it waiting forever
        try:
            out = queue.get(timeout=1.0)
            break
        except queue_module.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"{system} on {spec[0]}: its process died (exit code {proc.exitcode}); "
                                   "the traceback is above")
    proc.join()
    return out


def available_systems(systems):
    """PrefixGrouper is an optional peer (``pip install prefix-grouper==0.0.1.post1``): without it, its rows are
    left out and the run says so."""
    if "prefix_grouper" in systems and importlib.util.find_spec("prefix_grouper") is None:
        print("prefix-grouper is not installed (pip install --no-deps prefix-grouper==0.0.1.post1): its rows are "
              "left out")
        return tuple(s for s in systems if s != "prefix_grouper")
    return systems


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--vlm", action="store_true", help="the vision-language rows (CPU)")
    parser.add_argument("--agentic", action="store_true", help="agent trajectories: host build + one step (CPU)")
    args = parser.parse_args(argv)
    if args.vlm:
        return main_vlm(args)
    if args.agentic:
        from bench_shared_prefix_agentic import main_agentic

        return main_agentic(args, machine_info, write_results)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    workloads = QUICK if args.quick else WORKLOADS
    systems = available_systems(GPU_ORDER if cuda else tuple(SYSTEMS))
    # fp32 losses agree to 1e-4; bf16 / fp16 sum rounding differs with the layout
    tolerance = 1e-4 if args.dtype == "fp32" else 2e-2
    rows = []
    head = (f"{'workload':26s} {'system':15s} {'tokens':>7s} {'unique':>7s} {'s/step':>8s} "
            f"{'peak MB' if not cuda else 'GPU MB':>8s} {'+MB':>7s} {'vs shared':>9s}")
    print(head)
    for spec in workloads:
        prompts, completions = make_groups(spec)
        unique = sum(len(p) + sum(map(len, cs)) for p, cs in zip(prompts, completions))
        runs = {s: run_one(s, spec, 1 if args.quick else args.repeats, args.device, args.dtype) for s in systems}
        ref = runs["shared"]["loss"]
        for name, r in runs.items():
            agree = abs(r["loss"] - ref) <= tolerance * abs(ref)
            ratio = r["seconds"] / runs["shared"]["seconds"]
            row = {"workload": spec[0], **r, "unique_tokens": unique, "time_vs_shared": ratio,
                   "extra_mb": r["peak_rss_mb"] - r["model_rss_mb"], "loss_agrees": agree}
            rows.append(row)
            print(f"{spec[0]:26s} {name:15s} {r['tokens']:7d} {unique:7d} {r['seconds']:8.3f} {r['peak_rss_mb']:8.0f} "
                  f"{row['extra_mb']:7.0f} {ratio:8.2f}x{'' if agree else '  LOSS DIFFERS'}")
    doc = {"machine": machine_info(), "model": MODEL, "device": args.device, "dtype": args.dtype, "rows": rows,
           "notes": f"{args.device} {args.dtype} forward+backward per step, median of repeats; each system in its "
                    "own process; peak = ru_maxrss of that process (CPU) or torch.cuda.max_memory_allocated (GPU), "
                    "+MB = peak minus the memory after loading the model"}
    write_results(doc, results_name("shared_prefix", gpu=cuda), args.out, args.quick)
    return doc


def main_vlm(args):
    """Vision-language rows: shared (each image once per group) vs unshared packing (once per completion) vs
    per-sample padded rows; ratios of medians in one run, peak RSS per process."""
    import bench_shared_prefix_vlm as v

    if args.device != "cpu":
        raise SystemExit("--vlm: CPU rows only so far (GPU rows: not yet run)")
    workloads = v.QUICK if args.quick else v.WORKLOADS
    rows = []
    print(f"{'workload':36s} {'system':9s} {'tokens':>7s} {'images':>6s} {'visual':>7s} {'s/step':>8s} "
          f"{'cpu s':>8s} {'peak MB':>8s} {'+MB':>7s} {'vs shared':>9s} {'cpu vs':>7s}")
    for spec in workloads:
        runs = {s: run_one(s, spec, 1 if args.quick else args.repeats, vlm=True) for s in v.SYSTEMS}
        ref = runs["shared"]["loss"]
        for name, r in runs.items():
            agree = abs(r["loss"] - ref) <= 1e-4 * abs(ref)
            ratio = r["seconds"] / runs["shared"]["seconds"]
            cpu_ratio = r["cpu_seconds"] / runs["shared"]["cpu_seconds"]
            row = {"workload": spec[0], **r, "time_vs_shared": ratio, "cpu_time_vs_shared": cpu_ratio,
                   "extra_mb": r["peak_rss_mb"] - r["model_rss_mb"], "loss_agrees": agree}
            rows.append(row)
            print(f"{spec[0]:36s} {name:9s} {r['tokens']:7d} {r['images']:6d} {r['visual_tokens']:7d} "
                  f"{r['seconds']:8.3f} {r['cpu_seconds']:8.3f} {r['peak_rss_mb']:8.0f} {row['extra_mb']:7.0f} "
                  f"{ratio:8.2f}x {cpu_ratio:6.2f}x{'' if agree else '  LOSS DIFFERS'}")
    doc = {"machine": machine_info(), "model": v.MODEL, "device": "cpu", "dtype": "fp32", "rows": rows,
           "threads_per_process": 1,
           "notes": "cpu fp32 forward+backward per step (vision tower included), median of repeats (wall seconds and "
                    "process CPU seconds: on a shared, loaded machine the CPU-time ratio is the steadier one); "
                    "one torch "
                    "thread per process; each system in "
                    "its own process; peak = ru_maxrss of that process, +MB = peak minus after loading the model; "
                    "tokens = the language model's token slots (padding included), images / visual = what the "
                    "vision tower encodes / the merged visual tokens in the language model"}
    write_results(doc, "shared_prefix_vlm_cpu.json", args.out, args.quick)
    return doc


if __name__ == "__main__":
    main()
