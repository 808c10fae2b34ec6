"""Vision-language GRPO rows of the shared-prefix benchmark (issue 36): one training step (forward + backward,
CPU fp32) of a small Qwen2.5-VL-shaped model (a real vision tower of 4 blocks, 2 text layers) on GRPO groups whose
prompt is one image (256-1,024 merged visual tokens) + 64-256 text tokens, completions lognormal. Three systems:

* ``shared``: ``pack_groups(prompts, completions, mrope=config)``: each prompt and its image once per group
  (the vision tower encodes each image once), two-pass attention;
* ``unshared``: the same sequences packed without sharing (``pack_tree`` with one group per sequence: each
  completion re-carries its prompt and image, the vision tower encodes it G times), the same attention code;
* ``padded``: per-sample rows padded to the longest (HF's own positions, SDPA), the image repeated per row.

Run through ``python benchmarks/bench_shared_prefix.py --vlm`` (``--quick`` for a smoke run).
"""
from __future__ import annotations

import numpy as np
import torch

PATCH, MERGE, TPATCH = 14, 2, 2
VOCAB = 4096
IMAGE, VSTART, VEND = VOCAB - 3, VOCAB - 2, VOCAB - 1  # Qwen's special tokens, inside this small vocabulary
TEXT = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=8192, bos_token_id=None, eos_token_id=None,
            pad_token_id=None,
            rope_parameters={"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 1e6})
VISION = dict(depth=4, hidden_size=128, intermediate_size=256, num_heads=4, out_hidden_size=256, patch_size=PATCH,
              spatial_merge_size=MERGE, temporal_patch_size=TPATCH, window_size=112, fullatt_block_indexes=[3],
              tokens_per_second=2)
MODEL = {"text": TEXT, "vision": VISION}

# (name, merged image side range (tokens = side**2), text range, G, completion median, groups)
WORKLOADS = [
    ("vlm-img256-t64..256-g8-c128", (16, 16), (64, 256), 8, 128, 2),
    ("vlm-img1024-t64..256-g8-c256", (32, 32), (64, 256), 8, 256, 1),
    ("vlm-img256..1024-t64..256-g16-c192", (16, 32), (64, 256), 16, 192, 1),
]
QUICK = [("vlm-quick", (4, 4), (8, 16), 4, 16, 2)]


def tiny_vlm(device="cpu", dtype=torch.float32):
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2_5_VLConfig(text_config=dict(TEXT, use_cache=False), vision_config=VISION,
                                           image_token_id=IMAGE, video_token_id=VOCAB - 4,
                                           vision_start_token_id=VSTART, vision_end_token_id=VEND)
    config._attn_implementation = "sdpa"
    return transformers.Qwen2_5_VLForConditionalGeneration(config).to(device=device, dtype=dtype)


def make_groups(spec, seed=0):
    _, (slo, shi), (tlo, thi), g, median, n = spec
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for _ in range(n):
        side = int(rng.integers(slo, shi + 1))
        h = w = side * MERGE  # patches
        text = int(rng.integers(tlo, thi + 1))
        before = text // 4
        ids = (rng.integers(1, VOCAB - 8, before).tolist() + [VSTART] + [IMAGE] * side * side + [VEND]
               + rng.integers(1, VOCAB - 8, text - before).tolist())
        pixels = torch.from_numpy(rng.standard_normal((h * w, 3 * TPATCH * PATCH * PATCH)).astype(np.float32))
        prompts.append({"input_ids": ids, "pixel_values": pixels, "image_grid_thw": torch.tensor([[1, h, w]])})
        lens = np.clip(np.exp(rng.normal(np.log(median), 0.5, g)).astype(int), 1, 4 * median)
        completions.append([rng.integers(1, VOCAB - 8, int(c)).tolist() for c in lens])
    return prompts, completions


def _loss(result):
    return -(result.padded * result.mask).sum() / result.mask.sum()


def step_shared(model, prompts, completions, share=True):
    from packkit import shared_prefix as sp

    model.set_attn_implementation(sp.register_attention())
    if share:
        batch, info = sp.pack_groups(prompts, completions, mrope=model.config, attention="varlen")
    else:  # each prompt + completion its own tree (one group per sequence): prompt and image once per completion
        seqs = [{**p, "input_ids": p["input_ids"] + c} for p, cs in zip(prompts, completions) for c in cs]
        score = [len(p["input_ids"]) for p, cs in zip(prompts, completions) for _ in cs]
        batch, info = sp.pack_tree(seqs, np.arange(len(seqs)), score_from=score, mrope=model.config,
                                   attention="varlen")

    def step():
        model.zero_grad(set_to_none=True)
        loss = _loss(sp.completion_logprobs(model(**batch, use_cache=False).logits, info))
        loss.backward()
        return float(loss.detach())
    return step, {"tokens": int(batch["input_ids"].numel()), "images": info.vision.images_forwarded,
                  "visual_tokens": info.vision.visual_tokens_forwarded}


def step_padded(model, prompts, completions):
    """Per-sample rows, right-padded: HF computes positions from the attention mask; each row has its image."""
    model.set_attn_implementation("sdpa")
    seqs = [(p, c) for p, cs in zip(prompts, completions) for c in cs]
    width = max(len(p["input_ids"]) + len(c) for p, c in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    score = torch.zeros(len(seqs), width - 1, dtype=torch.bool)
    for b, (p, c) in enumerate(seqs):
        row = p["input_ids"] + c
        ids[b, :len(row)] = torch.tensor(row)
        mask[b, :len(row)] = 1
        score[b, len(p["input_ids"]) - 1:len(row) - 1] = True
    pixels = torch.cat([p["pixel_values"] for p, _ in seqs])
    grids = torch.cat([p["image_grid_thw"] for p, _ in seqs])
    types = (ids == IMAGE).long()

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids,
                       mm_token_type_ids=types, use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * score).sum() / score.sum()
        loss.backward()
        return float(loss.detach())
    visual = int(grids.prod(-1).sum()) // MERGE ** 2
    return step, {"tokens": int(ids.numel()), "images": len(grids), "visual_tokens": visual}


SYSTEMS = {"shared": step_shared, "unshared": lambda m, p, c: step_shared(m, p, c, False), "padded": step_padded}
