"""Vision-language collate benchmark: PackingCollator(mrope=...) vs a hand-built correct pipeline.

Run from the repository root::

    python benchmarks/bench_vlm_collate.py            # 64 Qwen3-VL-like samples, 20 repeats
    python benchmarks/bench_vlm_collate.py --quick    # 3 repeats, no JSON unless --out

Workload (seed 001's kind: one image per sample plus text; 64 samples ~ 4 packed rows of 20000): image
grids from random image sizes by Qwen3-VL's resize rule (patch 16, merge 2, 256..1024 px sides), text
50..600 tokens, processor-like features (``input_ids`` and ``mm_token_type_ids`` as Python lists,
``pixel_values`` [t*h*w, 6] float32 (small rows: the real 1536-wide rows are a memcpy every system pays
alike), ``image_grid_thw``). Systems:
  * ``packkit PackingCollator(20000, layout="padded", mrope=config)``: obfd rows, [4, B, L] positions,
    vision tensors in packed order, mm_token_type_ids packed;
  * the same without ``mrope`` (text positions only; pixel tensors still concatenated), for the overhead;
  * reference: transformers' ``DataCollatorWithFlattening`` (one flat row) + ``model.model.get_rope_index``
    per sample (the model's own code, what a hand-built packing pipeline calls) + concatenation of the
    vision tensors and mm_token_type_ids.
Results go to ``benchmarks/results/vlm_collate_cpu.json``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import packkit
from _results import machine_info, write_results
from packkit.analyze.vision_tokens import VisionTokenRule


def tiny_qwen3_vl():
    import transformers

    text = dict(vocab_size=200, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8,
                rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True})
    vision = dict(depth=1, num_heads=2, hidden_size=16, intermediate_size=32, out_hidden_size=32, patch_size=16,
                  spatial_merge_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0])
    config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=190,
                                        video_token_id=191, vision_start_token_id=192, vision_end_token_id=193)
    return transformers.Qwen3VLModel(config)


def features(n=64, seed=0):
    rng = np.random.default_rng(seed)
    rule = VisionTokenRule.for_family("qwen3-vl")
    out = []
    for _ in range(n):
        h, w = rule.resize(rng.integers(256, 1025), rng.integers(256, 1025))
        gh, gw = int(h) // 16, int(w) // 16
        tokens = gh * gw // 4
        before, after = int(rng.integers(10, 100)), int(rng.integers(40, 500))
        ids = rng.integers(1, 150, before).tolist() + [192] + [190] * tokens + [193] + rng.integers(1, 150, after).tolist()
        types = [0] * (before + 1) + [1] * tokens + [0] * (after + 1)
        out.append({"input_ids": ids, "mm_token_type_ids": types,
                    "pixel_values": torch.randn(gh * gw, 6), "image_grid_thw": torch.tensor([[1, gh, gw]])})
    return out


def median_time(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    from transformers import DataCollatorWithFlattening

    model = tiny_qwen3_vl()
    feats = features()
    tokens = sum(len(f["input_ids"]) for f in feats)
    ours = packkit.PackingCollator(20000, layout="padded", mrope=model.config)
    text_only = packkit.PackingCollator(20000, layout="padded")
    hf = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)

    def reference():
        batch = hf([{"input_ids": f["input_ids"]} for f in feats])
        rows = [model.get_rope_index(torch.tensor([f["input_ids"]]), torch.tensor([f["mm_token_type_ids"]]),
                                     f["image_grid_thw"], None)[0] for f in feats]
        batch["position_ids"] = torch.cat((batch["position_ids"][None], torch.cat(rows, dim=2)))
        batch["mm_token_type_ids"] = torch.tensor([sum((f["mm_token_type_ids"] for f in feats), [])])
        batch["pixel_values"] = torch.cat([f["pixel_values"] for f in feats])
        batch["image_grid_thw"] = torch.cat([f["image_grid_thw"] for f in feats])
        return batch

    # Same output before timing: packkit's flat layout keeps input order, like the reference.
    info_plan = packkit.plan([len(f["input_ids"]) for f in feats], 20000)
    flat, ref = packkit.PackingCollator(mrope=model.config)(feats), reference()
    for key in ("position_ids", "mm_token_type_ids", "pixel_values", "image_grid_thw", "input_ids"):
        assert torch.equal(flat[key], ref[key]), key
    print(f"{len(feats)} samples, {tokens:,} tokens ({sum(int(f['image_grid_thw'].prod()) // 4 for f in feats):,} "
          f"image tokens), {info_plan.num_bins} rows of 20000, torch threads {torch.get_num_threads()}")
    systems = [("packkit PackingCollator(20000, padded, mrope=config)", lambda: ours(feats)),
               ("packkit PackingCollator(20000, padded), no mrope", lambda: text_only(feats)),
               ("HF DataCollatorWithFlattening + get_rope_index per sample", reference)]
    rows = []
    for name, fn in systems:
        seconds = median_time(fn, repeats)
        rows.append({"system": name, "median_s": seconds, "tokens_per_s": tokens / seconds})
    base = rows[-1]["median_s"]
    print(f"\n{'system':<60} {'median':>10} {'Mtok/s':>8} {'vs ref':>7}")
    for r in rows:
        r["speedup_vs_reference"] = base / r["median_s"]
        print(f"{r['system']:<60} {r['median_s'] * 1000:8.2f}ms {r['tokens_per_s'] / 1e6:8.2f} "
              f"{r['speedup_vs_reference']:6.1f}x")
    load = os.getloadavg()[0]
    print(f"load average during the run: {load:.1f} on {os.cpu_count()} cores (torch ops wait for busy threads)")
    doc = {"machine": machine_info(load_average=load), "workload": {"samples": len(feats), "tokens": tokens, "repeats": repeats},
           "cpu": rows}
    write_results(doc, "vlm_collate_cpu.json", args.out, args.quick)


if __name__ == "__main__":
    main()
