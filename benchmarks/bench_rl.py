"""RL rollout micro-batching: packkit.rl.micro_batches vs verl 0.9.1's pipeline, and (with a GPU) pack_rollouts vs
an ``unpad_input``-style torch gather.

Workload (GRPO-like, one global batch): prompt uniform in [100, 1000] tokens, response lognormal with median
``cap / 16`` and sigma 1.0, clipped to [1, cap / 2]; seed 0.

Rows:
* ``rank`` (dp 1): one rank's batch, verl's ``rearrange_micro_batches`` planning (count = ceil(tokens / cap),
  Karmarkar-Karp on ``calculate_workload``, re-run with one more micro-batch while a partition breaks the cap;
  the TensorDict slicing, the same for both, is left out) vs ``packkit.rl.micro_batches``.
* ``global`` (dp > 1): verl's pipeline = the trainer's ``_balance_batch`` (KK, equal counts per rank) + every
  rank's rearrange with the count agreed across ranks (all_reduce MAX, re-run until every rank fits), vs
  ``packkit.rl.micro_batches(dp_size=dp)`` (and ``equal_count=True``, which verl's equal-chunk dispatch needs).
  verl's time is its critical path: the global step + the slowest rank's rearrange.
Columns: time, micro-batches per rank vs the bound ceil(ceil(tokens / cap) / dp), max tokens in a micro-batch,
cross-rank per-step balance (sum over k of the costliest rank's micro-batch k / the mean) under verl's
workload and under ``transformer_cost`` of a Llama-3-8B-shaped model (each planner planned under the cost it is
scored on; verl always plans under its workload).

``--heavy`` (issue 30's held-out workload, plus 2,048 / dp 8 and 4,096 / dp 16 rows, issue 36): heavy-tailed
rollouts, prompt uniform in [64, 1500], response lognormal with median 1,500-3,000 and sigma 1.0 clipped to the
cap minus the prompt (tails of 12k-30k), caps 16k / 32k, dp 8 / 16, seeds 0 and 1: verl's pipeline vs
``micro_batches(cost=verl's workload)`` (both the best of 5 runs: under load a run loses 4 ms scheduler slices) and
the certified lower bound on the balance of any plan with that many micro-batches per rank
(``packkit.planning.balance_bound.step_balance_lower_bound``).

Usage: python benchmarks/bench_rl.py [--quick] [--full] [--heavy] [--out PATH]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import count_sync_warnings, machine_info, results_name, write_results  # noqa: E402

import packkit  # noqa: E402
from packkit import rl  # noqa: E402

LLAMA3_8B = packkit.transformer_cost(hidden_size=4096, num_layers=32, intermediate_size=14336, num_heads=32,
                                     num_kv_heads=8, vocab_size=128256)


def rollout_lengths(n, cap, seed=0):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(100, 1001, n)
    response = np.clip(np.exp(rng.normal(np.log(cap / 16), 1.0, n)).astype(np.int64), 1, cap // 2)
    return prompt + response


def heavy_lengths(n, median, cap, seed):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(64, 1501, n)
    response = np.clip(np.exp(rng.normal(np.log(median), 1.0, n)).astype(np.int64), 1, cap - prompt)
    return prompt + response


HEAVY = [(512, 1500, 16384, 8), (1024, 1500, 16384, 8), (1024, 2000, 16384, 16), (2048, 2000, 16384, 16),
         (512, 3000, 32768, 8), (1024, 3000, 32768, 16), (2048, 1500, 16384, 8), (4096, 2000, 16384, 16)]


def heavy_rows(repeat=5):
    """Both planners timed as the best of ``repeat`` runs (the same for both: this VM is shared and noisy)."""
    from packkit.planning.balance_bound import step_balance_lower_bound

    rows = []
    for n, median, cap, dp in HEAVY:
        for seed in (0, 1):
            lengths = heavy_lengths(n, median, cap, seed)
            t_verl = float("inf")
            for _ in range(repeat):
                plans, t_run, _ = verl_pipeline(lengths, cap, dp)
                t_verl = min(t_verl, t_run)
            mb, t = timed(lambda: rl.micro_batches(lengths, cap, dp, cost=workload), repeat=repeat)
            k = len(mb.indices[0])
            cost = lambda idx: workload(lengths[idx])  # noqa: E731
            rows.append({"rollouts": n, "median": median, "cap": cap, "dp": dp, "seed": seed,
                         "max_len": int(lengths.max()), "micro_batches": k, "verl_micro_batches": len(plans[0]),
                         "balance_packkit": round(step_balance(mb.indices, cost), 5),
                         "balance_verl": round(step_balance(plans, cost), 5),
                         "bound": round(step_balance_lower_bound(lengths, cap, dp, k, 24576, 1), 5),
                         "ms_packkit": round(t * 1e3, 2), "ms_verl": round(t_verl * 1e3, 1),
                         "speedup": round(t_verl / t, 1)})
    return rows


def workload(x):
    return 24576 * x + x ** 2  # verl's calculate_workload


def tcost(x):
    a, b = LLAMA3_8B
    return a * x + b * x.astype(np.float64) ** 2


def verl_rank(lengths, cap, count=None):
    """verl 0.9.1 rearrange_micro_batches' planning (lines 398-459 of seqlen_balancing.py), no TensorDicts."""
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    workloads = workload(torch.from_numpy(lengths)).tolist()
    tokens = lengths.tolist()
    k = min(len(tokens), -(-int(lengths.sum()) // cap)) if count is None else count
    while True:
        parts = get_seqlen_balanced_partitions(workloads, k, equal_size=False)
        if all(sum(tokens[i] for i in p) <= cap for p in parts):
            break
        k += 1
    parts.sort(key=lambda p: (sum(workloads[i] for i in p), p[0] if p else 0), reverse=True)
    return parts[::2][::-1] + parts[1::2]


def verl_pipeline(lengths, cap, dp):
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    t0 = time.perf_counter()
    w = workload(torch.from_numpy(lengths))
    ranks = get_seqlen_balanced_partitions(w.tolist(), k_partitions=dp, equal_size=True)
    t_global = time.perf_counter() - t0
    # every rank: the initial count, agreed by all_reduce MAX, then re-run until every rank fits
    k = max(min(len(r), -(-int(lengths[r].sum()) // cap)) for r in ranks)
    slowest, plans = 0.0, None
    while plans is None:
        plans, slowest = [], 0.0
        for r in ranks:
            rank_lengths = lengths[np.asarray(r)]
            t0 = time.perf_counter()
            parts = verl_rank(rank_lengths, cap, count=k)
            slowest = max(slowest, time.perf_counter() - t0)
            if len(parts) != k:  # this rank needed more: all ranks re-run with the larger count
                k, plans = len(parts), None
                break
            plans.append([[r[i] for i in p] for p in parts])
    return plans, t_global + slowest, t_global


def step_balance(plans, cost):
    """plans[rank][k] = index list; sum_k max_r cost / sum_k mean_r cost."""
    c = np.array([[float(cost(np.asarray(p, np.int64)).sum()) if len(p) else 0.0 for p in rank] for rank in plans])
    mean = c.mean(axis=0).sum()
    return float(c.max(axis=0).sum() / mean) if mean else 1.0


def row(name, kind, n, dp, cap, seconds, plans, lengths, bound):
    tokens = max(int(lengths[np.asarray(p, np.int64)].sum()) for rank in plans for p in rank)
    cost = lambda idx: workload(lengths[idx])  # noqa: E731
    tc = lambda idx: tcost(lengths[idx])  # noqa: E731
    return {"planner": name, "kind": kind, "rollouts": n, "dp": dp, "cap": cap, "ms": round(seconds * 1e3, 3),
            "micro_batches": len(plans[0]), "bound": bound, "max_tokens": tokens,
            "balance_verl_workload": round(step_balance(plans, cost), 5),
            "balance_transformer_cost": round(step_balance(plans, tc), 5),
            "within_rank_max_over_mean": round(_within(plans, cost), 5)}


def _within(plans, cost):
    """max / mean workload over all micro-batches (how even the micro-batches are, ranks aside)."""
    c = np.array([float(cost(np.asarray(p, np.int64)).sum()) for rank in plans for p in rank if len(p)])
    return float(c.max() / c.mean()) if len(c) else 1.0


def timed(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def packkit_rows(lengths, cap, dp, kind):
    n = len(lengths)
    bound = -(-(-(-int(lengths.sum()) // cap)) // dp)
    rows = []
    for label, kw in (("packkit", {}), ("packkit equal_count", {"equal_count": True})):
        if kw and n % dp:
            continue
        mb, t = timed(lambda: rl.micro_batches(lengths, cap, dp, cost=workload, **kw))
        r = row(label, kind, n, dp, cap, t, mb.indices, lengths, bound)
        mb2 = rl.micro_batches(lengths, cap, dp, cost=LLAMA3_8B, **kw)  # planned under the scored cost
        r["balance_transformer_cost"] = round(step_balance(mb2.indices, lambda idx: tcost(lengths[idx])), 5)
        rows.append(r)
    return rows


def gpu_rows(quick):
    """pack_rollouts vs an unpad_input-style gather, per micro-batch, on the GPU."""
    import torch.nn.functional as F

    dev = torch.device("cuda")
    B, P, R, cap = 512, 1024, 7168, 65536
    lengths = rollout_lengths(B, cap // 8)
    prompt = np.random.default_rng(1).integers(100, P + 1, B)
    response = np.clip(lengths - prompt, 1, R)
    cols = torch.arange(P + R)
    mask = ((cols >= torch.from_numpy(P - prompt)[:, None]) & (cols < torch.from_numpy(P + response)[:, None])).long()
    ids = (torch.randint(1, 32000, mask.shape) * mask).to(dev)
    mask = mask.to(dev)
    layout = rl.rollout_layout(mask)
    plan = rl.micro_batches(layout.length, cap, 1)
    parts = plan.indices[0]

    def ours():
        for p in parts:
            rl.pack_rollouts(ids, mask, p, layout, check=False)

    def torch_gather():
        for p in parts:
            idx = torch.from_numpy(p).to(dev, non_blocking=True)
            m, x = mask[idx], ids[idx]
            seqlens = m.sum(-1, dtype=torch.int32)
            flat = torch.nonzero(m.flatten(), as_tuple=False).flatten()  # host sync (output size)
            max_seqlen = int(seqlens.max().item())  # host sync
            cu = F.pad(torch.cumsum(seqlens, 0, dtype=torch.int32), (1, 0))
            x.flatten()[flat]
            ((m.cumsum(1) - 1).clamp(min=0)).flatten()[flat]
            del cu, max_seqlen

    out = []
    for name, fn in (("packkit pack_rollouts", ours), ("unpad_input-style torch", torch_gather)):
        fn()
        torch.cuda.synchronize()
        syncs = count_sync_warnings(fn)
        reps = 3 if quick else 20
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / reps / len(parts) * 1e6
        out.append({"method": name, "us_per_micro_batch": round(us, 1), "host_syncs_per_micro_batch":
                    syncs / len(parts), "micro_batches": len(parts), "rollouts": B})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small smoke run (CI)")
    ap.add_argument("--full", action="store_true", help="also the slow verl rows (minutes)")
    ap.add_argument("--heavy", action="store_true", help="only the heavy-tailed balance rows (issue 30)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    try:
        import verl.utils.seqlen_balancing  # noqa: F401
        has_verl = True
    except ImportError:
        has_verl = False
        print("verl not installed: packkit rows only")

    if args.heavy:
        if not has_verl:
            raise SystemExit("--heavy compares with verl: pip install --no-deps verl==0.9.1 omegaconf tensordict")
        rows = heavy_rows()
        keys = list(rows[0])
        print(" | ".join(keys))
        for r in rows:
            print(" | ".join(str(r[k]) for k in keys))
        write_results({"machine": machine_info(verl=True), "rows": rows}, "rl_heavy_cpu.json", args.out, False)
        return
    if args.quick:
        rank_cases, global_cases = [(256, 16384)], [(512, 8, 16384)]
    else:
        rank_cases = [(256, 16384), (512, 32768), (1024, 65536)]
        global_cases = [(2048, 8, 16384), (4096, 16, 32768), (8192, 32, 65536), (16384, 64, 65536)]
        if args.full:
            global_cases += [(8192, 8, 65536), (16384, 16, 32768)]
    rows = []
    for n, cap in rank_cases:
        lengths = rollout_lengths(n, cap)
        bound = -(-int(lengths.sum()) // cap)
        if has_verl:
            parts, t = timed(lambda: verl_rank(lengths, cap), repeat=1)
            rows.append(row("verl rearrange", "rank", n, 1, cap, t, [parts], lengths, bound))
        rows += packkit_rows(lengths, cap, 1, "rank")[:1]
    for n, dp, cap in global_cases:
        lengths = rollout_lengths(n, cap)
        bound = -(-(-(-int(lengths.sum()) // cap)) // dp)
        if has_verl:
            plans, t, t_global = verl_pipeline(lengths, cap, dp)
            r = row("verl pipeline", "global", n, dp, cap, t, plans, lengths, bound)
            r["ms_global_balance"] = round(t_global * 1e3, 3)
            rows.append(r)
        rows += packkit_rows(lengths, cap, dp, "global")
    verl_ms = {}
    for r in rows:  # packkit's speedup over verl's planning of the same batch (same run)
        if r["planner"].startswith("verl"):
            verl_ms[r["rollouts"], r["dp"], r["cap"]] = r["ms"]
        elif (r["rollouts"], r["dp"], r["cap"]) in verl_ms:
            r["speedup"] = round(verl_ms[r["rollouts"], r["dp"], r["cap"]] / r["ms"], 1)
    keys = ["planner", "rollouts", "dp", "cap", "ms", "speedup", "micro_batches", "bound", "max_tokens",
            "balance_verl_workload", "balance_transformer_cost", "within_rank_max_over_mean"]
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r.get(k, "-")) for k in keys))
    doc = {"machine": machine_info(verl=has_verl), "rows": rows}
    if torch.cuda.is_available():
        doc["gpu_rows"] = gpu_rows(args.quick)
        for r in doc["gpu_rows"]:
            print(r)
    write_results(doc, results_name("rl", gpu=torch.cuda.is_available()), args.out, args.quick)


if __name__ == "__main__":
    main()
