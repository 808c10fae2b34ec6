"""Packing Qwen2.5-VL samples (text, images) with packkit.PackingCollator(mrope=config), and training on them.

    python examples/qwen25_vl_packing.py

The collator packs the samples' tokens into rows, concatenates their pixel rows in packed order and
gives the [4, B, L] positions the model needs for packed input (row 0: text positions restarting at
every document; rows 1-3: each document's mRoPE positions as the model computes them for it alone).
The model is tiny and random, its config built here: nothing is downloaded.
"""
from __future__ import annotations

import numpy as np
import torch
import transformers

import packkit

IMAGE, VSTART, VEND = 90, 92, 93


def tiny_qwen25_vl() -> transformers.Qwen2_5_VLForConditionalGeneration:
    text = dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2],
                                                       "rope_theta": 10000.0})
    vision = dict(depth=1, num_heads=2, hidden_size=16, intermediate_size=32, out_hidden_size=32, patch_size=2,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=8, fullatt_block_indexes=[0])
    config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE,
                                           video_token_id=91, vision_start_token_id=VSTART, vision_end_token_id=VEND)
    config.use_cache = False
    return transformers.Qwen2_5_VLForConditionalGeneration(config)


def sample(rng, n_text: int, grid=None) -> dict:
    """What the processor returns for n_text text tokens and an optional image of grid (t, h, w) patches."""
    ids, types, extra = rng.integers(1, 80, n_text).tolist(), [0] * n_text, {}
    if grid is not None:
        t, h, w = grid
        n = t * h * w // 4  # 2x2 patches merge into one token
        ids, types = ids + [VSTART] + [IMAGE] * n + [VEND], types + [0] + [1] * n + [0]
        extra = {"pixel_values": torch.from_numpy(rng.standard_normal((t * h * w, 24))).float(),
                 "image_grid_thw": torch.tensor([grid])}
    return {"input_ids": ids, "mm_token_type_ids": types, **extra}


def main() -> list[float]:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = tiny_qwen25_vl()
    features = [sample(rng, 7, (1, 4, 4)), sample(rng, 12), sample(rng, 3, (1, 2, 6)), sample(rng, 20),
                sample(rng, 9, (1, 4, 4)), sample(rng, 30)]
    collate = packkit.PackingCollator(64, layout="padded", mrope=model.config, return_num_items=True)
    batch = collate(features)
    print(f"rows {tuple(batch['input_ids'].shape)}  position_ids {tuple(batch['position_ids'].shape)}  "
          f"pixel rows {batch['pixel_values'].shape[0]}  label tokens {int(batch['num_items_in_batch'])}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):  # overfit the one packed batch: the loss must fall
        loss = model(**batch, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    print(f"steps {len(losses)}  first loss {losses[0]:.3f}  last loss {losses[-1]:.3f}")
    return losses


if __name__ == "__main__":
    main()
