"""Data-parallel balance under the true FLOPs: ``ogbfd`` steps planned with the old dense cost vs the per-architecture
cost (``packkit.transformer_cost`` of the config; issue 50 §6).

Run from the repository root::

    python benchmarks/bench_arch_cost.py            # 3 configs x 2 workloads, ~1-2 minutes on 2 cores
    python benchmarks/bench_arch_cost.py --quick    # smoke run: 2,000 documents
    python benchmarks/bench_arch_cost.py --vlm-only # the Qwen3-VL-with-images rows alone (~20 s)

Configs (public sizes): Gemma 3 27B (sliding window 1,024 on 5 of every 6 layers), GPT-OSS-20B (window 128 on every
other layer, 32 experts, top 4), Qwen3-Next-80B-A3B (Gated DeltaNet on 3 of every 4 layers, 512 experts, top 10),
Qwen3.5 (transformers' default text config: Gated DeltaNet on 3 of every 4 layers), Nemotron-H-8B (Mamba 2, chunked
scan; 24 Mamba 2, 4 attention and 24 MLP layers), Jamba-v0.1 (Mamba 1 on 7 of every 8 layers, 16 experts, top 2).
``--models`` picks some (a substring of the name).
The "old" cost is what ``transformer_cost(config)`` returned before: the dense-Llama ``(a, b)`` read from the
config's sizes (every layer full attention, every expert counted as one MLP of ``intermediate_size``). The truth
both plans are scored by is the per-architecture cost (checked against torch's FLOP counter on tiny models:
tests/test_arch_cost.py). Workloads: 20,000 lognormal documents (median 2,048, sigma 1.2) and a long-context mix
(70% of 200-2,000 tokens, 30% of 8,000-32,768), and its first 512 documents (one global batch, as on-the-fly packing
plans it: few documents per step, where the cost model decides more), capacity 32,768, 8 ranks. Per-step balance: sum over steps of the
slowest rank's FLOPs / sum over steps of the mean rank's (1.0 = no rank waits). Results:
``benchmarks/results/arch_cost_cpu.json`` (``--vlm-only``: ``arch_cost_vlm_cpu.json``).

Qwen3-VL-8B with images (``vlm_rows``): samples of lognormal text (median 512) where 60% carry one to three images
of 256-1,536 px a side (16 px patches) and 5% a video of 4-16 temporal patches at 448 x 768 px; a sample's length is
its text plus its image tokens (``t h w / 4``). "old": the text model's cost of the length (what a VLM run passed
before, ``transformer_cost(config)``); "new": the same plus ``extra_cost=vision_cost(config).per_sample(grids)``. The
truth is text + vision tower (both checked against torch's FLOP counter: tests/test_vision_cost.py).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import packkit
from packkit.planning.cost_model import _read_config

import _results

DP, CAPACITY = 8, 32768


def configs() -> dict:
    from transformers import AutoConfig

    gemma = AutoConfig.for_model(
        "gemma3_text", hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
        num_key_value_heads=16, head_dim=128, vocab_size=262208, sliding_window=1024,
        layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(62)])
    gpt_oss = AutoConfig.for_model(
        "gpt_oss", hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088,
        sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 12)
    qwen_next = AutoConfig.for_model(
        "qwen3_next", hidden_size=2048, intermediate_size=5120, num_hidden_layers=48, num_attention_heads=16,
        num_key_value_heads=2, head_dim=256, num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, vocab_size=151936, linear_num_value_heads=32, linear_num_key_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 12)
    qwen35 = AutoConfig.for_model(  # transformers' Qwen3.5 defaults: Gated DeltaNet on 3 of every 4 layers
        "qwen3_5_text", hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
        num_key_value_heads=4, head_dim=256, vocab_size=248320, linear_num_value_heads=32, linear_num_key_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 8)
    # Nemotron-H-8B sizes (Mamba 2: 128 heads of 64, state 128, 8 groups, chunks of 128); 52 layers: 24 Mamba 2,
    # 4 attention, 24 MLP
    pattern = "M-" * 6 + "*" + "M-" * 6 + "*" + "M-" * 6 + "*" + "M-" * 6 + "*"
    assert (len(pattern), pattern.count("M"), pattern.count("*")) == (52, 24, 4)
    nemotron = AutoConfig.for_model(
        "nemotron_h", hidden_size=4096, intermediate_size=21504, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=131072, mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8,
        chunk_size=128, hybrid_override_pattern=pattern)
    jamba = AutoConfig.for_model("jamba")  # transformers' defaults: Jamba-v0.1 (52B; Mamba 1 on 7 of every 8 layers)
    return {"Gemma 3 27B": gemma, "GPT-OSS-20B": gpt_oss, "Qwen3-Next-80B-A3B": qwen_next, "Qwen3.5 (9B shape)": qwen35,
            "Nemotron-H-8B": nemotron, "Jamba-v0.1": jamba}


def workloads(n: int) -> dict:
    rng = np.random.default_rng(0)
    lognormal = np.clip(np.exp(rng.normal(np.log(2048), 1.2, n)), 1, CAPACITY).astype(np.int64)
    long_mix = np.where(rng.random(n) < 0.7, rng.integers(200, 2000, n), rng.integers(8000, CAPACITY + 1, n))
    return {"lognormal": lognormal, "long-context mix": long_mix.astype(np.int64),
            "long mix, 512 docs": long_mix[:512].astype(np.int64)}  # one global batch planned on the fly


def qwen3_vl_8b():
    from transformers import Qwen3VLConfig

    text = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                rope_parameters={"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True,
                                 "rope_theta": 5000000.0})
    vision = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                  deepstack_visual_indexes=[8, 16, 24])
    return Qwen3VLConfig(text_config=text, vision_config=vision)


def vlm_workload(n: int, seed: int = 0):
    """(lengths, per-sample image grids, per-sample video grids): see the module docstring."""
    rng = np.random.default_rng(seed)
    text = np.clip(np.exp(rng.normal(np.log(512), 1.0, n)), 16, 8192).astype(np.int64)
    images, videos, lengths = [], [], []
    for i in range(n):
        grids = [[1, 2 * int(rng.integers(8, 49)), 2 * int(rng.integers(8, 49))]
                 for _ in range(int(rng.integers(1, 4)))] if rng.random() < 0.6 else []
        video = [[int(rng.integers(4, 17)), 28, 48]] if rng.random() < 0.05 else []
        tokens = sum(t * h * w // 4 for t, h, w in grids + video)
        images.append(grids)
        videos.append(video)
        lengths.append(min(int(text[i]) + tokens, CAPACITY))  # the few longer ones truncated to a row
    return np.array(lengths, np.int64), images, videos


def vlm_rows(quick: bool) -> list:
    config = qwen3_vl_8b()
    text = packkit.transformer_cost(config)  # the text model: dense full attention, an (a, b) pair
    vision = packkit.vision_cost(config)
    lengths, images, videos = vlm_workload(2000 if quick else 20000)
    extra = vision.per_sample(images, videos)
    truth_of = lambda idx: text[0] * lengths[idx] + text[1] * lengths[idx] ** 2.0 + extra[idx]  # noqa: E731
    rows = []
    for name, n in (("images (60%)", len(lengths)), ("images, 512 docs", 512)):
        start = time.perf_counter()
        plans = {"old": packkit.plan(lengths[:n], CAPACITY, algorithm="ogbfd", dp_size=DP, cost=text),
                 "new": packkit.plan(lengths[:n], CAPACITY, algorithm="ogbfd", dp_size=DP, cost=text,
                                     extra_cost=extra[:n])}
        seconds = time.perf_counter() - start
        true_total = float(truth_of(np.arange(n)).sum())
        balance = {k: float(np.array([truth_of(b).sum() if len(b) else 0.0 for b in p.bins]).reshape(-1, DP)
                            .max(axis=1).sum() / (true_total / DP)) for k, p in plans.items()}
        rows.append({"model": "Qwen3-VL-8B", "workload": name, "documents": n,
                     "balance_old_cost": balance["old"], "balance_new_cost": balance["new"],
                     "steps_old": plans["old"].num_bins // DP, "steps_new": plans["new"].num_bins // DP,
                     "old_cost_total_over_true": float((text[0] * lengths[:n] + text[1] * lengths[:n] ** 2.0).sum()
                                                       / true_total),
                     "vision_share": float(extra[:n].sum() / true_total), "plan_seconds": seconds})
    return rows


def step_balance(plan, lengths: np.ndarray, truth) -> float:
    costs = np.array([truth(lengths[b]).sum() if len(b) else 0.0 for b in plan.bins]).reshape(-1, DP)
    return float(costs.max(axis=1).sum() / costs.mean(axis=1).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 documents")
    parser.add_argument("--vlm-only", action="store_true", help="only the Qwen3-VL-with-images rows")
    parser.add_argument("--models", nargs="*", default=None, help="only configs whose name contains one of these")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/arch_cost_cpu.json)")
    args = parser.parse_args()
    rows = []
    print(f"{'model':20s} {'workload':18s} {'old cost: balance':>18s} {'new cost: balance':>18s} {'old a/b err':>12s}")
    for model, config in ({} if args.vlm_only else configs()).items():
        if args.models and not any(m.lower() in model.lower() for m in args.models):
            continue
        truth = packkit.transformer_cost(config)
        old = packkit.transformer_cost(**_read_config(config))  # the dense-Llama pair of the same sizes
        for name, lengths in workloads(2000 if args.quick else 20000).items():
            start = time.perf_counter()
            plans = {label: packkit.plan(lengths, CAPACITY, algorithm="ogbfd", dp_size=DP, cost=cost)
                     for label, cost in (("old", old), ("new", truth))}
            seconds = time.perf_counter() - start
            true_total = truth(lengths).sum() if callable(truth) else (truth[0] * lengths + truth[1] * lengths ** 2.0).sum()
            old_total = (old[0] * lengths + old[1] * lengths ** 2.0).sum()
            scorer = truth if callable(truth) else (lambda l, t=truth: t[0] * l + t[1] * l.astype(float) ** 2)
            row = {"model": model, "workload": name, "documents": int(len(lengths)),
                   "balance_old_cost": step_balance(plans["old"], lengths, scorer),
                   "balance_new_cost": step_balance(plans["new"], lengths, scorer),
                   "steps_old": plans["old"].num_bins // DP, "steps_new": plans["new"].num_bins // DP,
                   "old_cost_total_over_true": float(old_total / true_total), "plan_seconds": seconds}
            rows.append(row)
            print(f"{model:20s} {name:18s} {row['balance_old_cost']:18.4f} {row['balance_new_cost']:18.4f} "
                  f"{row['old_cost_total_over_true']:11.2f}x")
    for row in vlm_rows(args.quick):  # old: text cost only; new: + the vision tower's extra_cost per sample
        rows.append(row)
        print(f"{row['model']:20s} {row['workload']:18s} {row['balance_old_cost']:18.4f} "
              f"{row['balance_new_cost']:18.4f} {row['old_cost_total_over_true']:11.2f}x")
    doc = {"machine": _results.machine_info(load_average=os.getloadavg()[0]), "dp_size": DP, "capacity": CAPACITY,
           "rows": rows}
    _results.write_results(doc, "arch_cost_vlm_cpu.json" if args.vlm_only else "arch_cost_cpu.json", args.out,
                           args.quick)


if __name__ == "__main__":
    main()
