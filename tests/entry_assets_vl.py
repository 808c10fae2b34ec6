"""What the Qwen-VL ``swift sft`` entry test (tests/test_swift_entry.py) trains on, made offline in the test: a tiny
random-init Qwen2.5-VL / Qwen3-VL saved from a config, its processor (the Qwen2-VL image and video processors and a
byte-level Qwen2 tokenizer, built here), and a jsonl of ms-swift messages with real PNG images drawn with PIL. No hub
path anywhere. ms-swift's Qwen-VL templates use the real models' media token ids (``<|image_pad|>`` 151655), so the
tokenizer places its special tokens where Qwen's do and the model's vocabulary reaches past them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# Qwen's own ids for the tokens the template and the model read.
SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
           "<|vision_end|>": 151653, "<|vision_pad|>": 151654, "<|image_pad|>": 151655, "<|video_pad|>": 151656}
VOCAB = 151680
PATCH = 14  # ms-swift's qwen_vl_utils compat resizes images to multiples of patch 14 x merge 2 = 28 pixels


def tokenizer():
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    vocab.update(SPECIAL)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL)})
    assert all(tok.convert_tokens_to_ids(t) == i for t, i in SPECIAL.items())
    return tok


def save_tiny_qwen_vl(path: Path, family: str = "qwen2_5_vl", seed: int = 0) -> None:
    """A random-init 2-layer Qwen2.5-VL (or Qwen3-VL) with a 1-block vision tower, and its processor, saved (fp32)."""
    import torch
    import transformers

    tok = tokenizer()
    patch = PATCH if family == "qwen2_5_vl" else 16  # ms-swift resizes Qwen3-VL images to multiples of 16 x 2
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=patch, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=32)
    tokens = dict(image_token_id=SPECIAL["<|image_pad|>"], video_token_id=SPECIAL["<|video_pad|>"],
                  vision_start_token_id=SPECIAL["<|vision_start|>"], vision_end_token_id=SPECIAL["<|vision_end|>"],
                  tie_word_embeddings=False)
    if family == "qwen2_5_vl":
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=dict(
            vision, fullatt_block_indexes=[0], window_size=2 * patch * 2), **tokens)
        model_cls, processor_cls = transformers.Qwen2_5_VLForConditionalGeneration, transformers.Qwen2_5_VLProcessor
        video_cls = transformers.Qwen2VLVideoProcessor
    else:
        text["rope_parameters"]["mrope_interleaved"] = True
        config = transformers.Qwen3VLConfig(text_config=text, vision_config=dict(
            vision, num_position_embeddings=64, deepstack_visual_indexes=[0]), **tokens)
        model_cls, processor_cls = transformers.Qwen3VLForConditionalGeneration, transformers.Qwen3VLProcessor
        video_cls = transformers.Qwen3VLVideoProcessor
    torch.manual_seed(seed)
    model_cls(config).save_pretrained(path)
    image_kw = dict(patch_size=patch, merge_size=2, temporal_patch_size=2)
    processor = processor_cls(image_processor=transformers.Qwen2VLImageProcessor(**image_kw), tokenizer=tok,
                              video_processor=video_cls(**image_kw))
    processor.save_pretrained(path)


def write_vl_dataset(root: Path, n: int = 12, seed: int = 0) -> list[dict]:
    """``n`` one-image samples in ms-swift's messages format, images of 1x1 to 4x2 merged patches (28-pixel units)
    drawn at random and saved as PNG, answers of a few to ~40 letters."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        h, w = (int(x) for x in rng.integers(2, 5, 2) * 28)
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        image_path = root / f"img{i}.png"
        image.save(image_path)
        question = "".join(rng.choice(list("abcdefgh "), int(rng.integers(1, 12))))
        answer = "".join(rng.choice(list("ijklmnop "), int(rng.integers(3, 40))))
        samples.append({"messages": [{"role": "user", "content": f"<image>{question}"},
                                     {"role": "assistant", "content": answer}], "images": [str(image_path)]})
    (root / "vl.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return samples
