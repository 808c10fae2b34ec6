"""Tiny random Qwen-VL configs/models (built offline) and multimodal samples for the VLM tests."""
from __future__ import annotations

import numpy as np
import torch

IMAGE, VIDEO, VSTART, VEND = 90, 91, 92, 93
VOCAB = 100
PATCH, TPATCH, MERGE, CHANNELS = 2, 2, 2, 3
PIXEL_DIM = CHANNELS * TPATCH * PATCH * PATCH


def tiny_config(family: str, attn: str = "sdpa", tokens_per_second: int = 3):
    import transformers

    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, use_cache=False,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    ids = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VSTART,
               vision_end_token_id=VEND)
    vis = dict(depth=1, num_heads=2, in_channels=CHANNELS, patch_size=PATCH, spatial_merge_size=MERGE,
               temporal_patch_size=TPATCH)
    if family == "qwen2_vl":
        text["rope_parameters"] = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}
        config = transformers.Qwen2VLConfig(text_config=text, vision_config=dict(vis, embed_dim=16, hidden_size=32,
                                                                                 mlp_ratio=2), **ids)
    elif family == "qwen2_5_vl":
        text["rope_parameters"] = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}
        config = transformers.Qwen2_5_VLConfig(
            text_config=text, vision_config=dict(vis, hidden_size=16, intermediate_size=32, out_hidden_size=32,
                                                 window_size=PATCH * MERGE * 2, fullatt_block_indexes=[0],
                                                 tokens_per_second=tokens_per_second), **ids)
    elif family == "qwen3_vl":
        text.update(head_dim=8, rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2],
                                                 "mrope_interleaved": True, "rope_theta": 10000.0})
        config = transformers.Qwen3VLConfig(
            text_config=text, vision_config=dict(vis, hidden_size=16, intermediate_size=32, out_hidden_size=32,
                                                 num_position_embeddings=16, deepstack_visual_indexes=[0]), **ids)
    else:
        raise ValueError(family)
    config._attn_implementation = attn
    config.use_cache = False
    return config


def tiny_model(family: str, attn: str = "sdpa", seed: int = 0, dtype=torch.float64):
    import transformers

    cls = {"qwen2_vl": transformers.Qwen2VLForConditionalGeneration,
           "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
           "qwen3_vl": transformers.Qwen3VLForConditionalGeneration}[family]
    torch.manual_seed(seed)
    model = cls(tiny_config(family, attn)).to(dtype)
    model.config.use_cache = False
    return model


def make_sample(rng, blocks, family: str = "qwen2_5_vl", seconds: bool = True) -> dict:
    """A processor-like sample: ``blocks`` is a list of ("text", n) / ("image", (h, w)) / ("video", (t, h, w))
    with h, w in patches (multiples of MERGE) and t in temporal patches. Qwen3-VL videos get timestamp text
    between frames, as its processor writes them."""
    ids, types, pix, grids, vpix, vgrids, secs = [], [], [], [], [], [], []
    for kind, arg in blocks:
        if kind == "text":
            ids += rng.integers(1, 80, arg).tolist()
            types += [0] * arg
            continue
        t, h, w = (1, *arg) if kind == "image" else arg
        n = (h // MERGE) * (w // MERGE)
        rows = torch.from_numpy(rng.standard_normal((t * h * w, PIXEL_DIM)))
        if kind == "image":
            ids += [VSTART] + [IMAGE] * n * t + [VEND]
            types += [0] + [1] * n * t + [0]
            pix.append(rows)
            grids.append([t, h, w])
            continue
        vpix.append(rows)
        vgrids.append([t, h, w])
        secs.append(float(rng.choice([0.5, 1.0, 2.0, 1.5])))
        if family.startswith("qwen3"):
            for _ in range(t):  # "<t seconds>" text, then the frame
                stamp = rng.integers(1, 80, 2).tolist()
                ids += stamp + [VSTART] + [VIDEO] * n + [VEND]
                types += [0] * 2 + [0] + [2] * n + [0]
        else:
            ids += [VSTART] + [VIDEO] * n * t + [VEND]
            types += [0] + [2] * n * t + [0]
    sample = {"input_ids": ids, "mm_token_type_ids": types}
    if pix:
        sample["pixel_values"] = torch.cat(pix)
        sample["image_grid_thw"] = torch.tensor(grids)
    if vpix:
        sample["pixel_values_videos"] = torch.cat(vpix)
        sample["video_grid_thw"] = torch.tensor(vgrids)
        if seconds and family == "qwen2_5_vl":
            sample["second_per_grid_ts"] = torch.tensor(secs)
    return sample
