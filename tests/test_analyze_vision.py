"""``packkit analyze`` for vision-language data: image tokens from image sizes by the Qwen-VL resize rule."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyze_helpers import run_cli, write
from packkit.analyze import AnalyzeError, LengthSpec, read_lengths
from packkit.analyze.vision_tokens import FAMILIES, VisionTokenRule, image_tokens

pytestmark = pytest.mark.core


def smart_resize(height, width, factor, min_pixels, max_pixels):
    """The Qwen2-VL image processor's rule, written out (transformers' own is compared below when present)."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# (family, width, height) -> tokens, worked by hand from the rule.
KNOWN = [
    ("qwen2.5-vl", 640, 480, 23 * 17),      # 480/28 = 17.1 -> 17, 640/28 = 22.9 -> 23; inside [min, max]
    ("qwen2-vl", 28, 28, 2 * 2),            # 784 px < min 3136: scaled up to 56x56
    ("qwen3-vl", 640, 480, 20 * 15),        # multiples of 32 already
    ("qwen3-vl", 100, 100, 8 * 8),          # 96x96 < min 65536: scaled up to 256x256
    ("qwen3-vl", 8192, 8192, 128 * 128),    # 64 Mpx > max 16.7 Mpx: scaled down to 4096x4096
    ("qwen2.5-vl", 1000, 10, 1 * 20),       # 10 px rounds to 0: scaled up by sqrt(3136/10000) = 0.56 -> 28 x 560
]


@pytest.mark.parametrize("family,width,height,tokens", KNOWN)
def test_known_sizes(family, width, height, tokens):
    rule = VisionTokenRule.for_family(family)
    assert int(rule.tokens(width, height)) == tokens
    h, w = smart_resize(height, width, rule.factor, rule.min_pixels, rule.max_pixels)
    assert (h // rule.factor) * (w // rule.factor) == tokens


@settings(max_examples=300, deadline=None)
@given(family=st.sampled_from(sorted(FAMILIES)), height=st.integers(1, 10000), width=st.integers(1, 10000),
       patch=st.sampled_from([None, 14, 16]), min_pixels=st.sampled_from([None, 3136, 200704]))
def test_rule_matches_smart_resize(family, height, width, patch, min_pixels):
    if max(height, width) / min(height, width) > 200:
        return
    rule = VisionTokenRule.for_family(family, patch_size=patch, min_pixels=min_pixels)
    want = smart_resize(height, width, rule.factor, rule.min_pixels, rule.max_pixels)
    got = rule.resize(np.array([height]), np.array([width]))
    assert (int(got[0][0]), int(got[1][0])) == want
    try:  # transformers' own function, where importable (needs Pillow)
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize
    except ImportError:
        return
    assert hf_smart_resize(height, width, rule.factor, rule.min_pixels, rule.max_pixels) == want


def test_sample_forms_and_errors():
    rule = VisionTokenRule.for_family("qwen3-vl", extra_tokens_per_image=2)
    sizes = [{"width": 640, "height": 480}, [640, 480], [[640, 480], {"w": 100, "h": 100}], None, []]
    got = image_tokens(rule, len(sizes), lambda i: (None, f"row {i}"), sizes=sizes)
    assert got.tolist() == [302, 302, 302 + 66, 0, 0]
    got = image_tokens(rule, 3, lambda i: (None, f"row {i}"), widths=[640, [640, 100], None],
                       heights=[480, [480, 100], None])
    assert got.tolist() == [302, 368, 0]
    with pytest.raises(AnalyzeError, match="row 1: .*aspect ratio above 200"):
        image_tokens(rule, 2, lambda i: (None, f"row {i}"), sizes=[[10, 10], [10000, 10]])
    with pytest.raises(AnalyzeError, match="row 0: field 'img'.*width and height"):
        image_tokens(rule, 1, lambda i: (None, f"row {i}"), sizes=[{"width": 3}], names=("img", None, None))
    with pytest.raises(AnalyzeError, match="unknown vision model family"):
        VisionTokenRule.for_family("llava")
    with pytest.raises(AnalyzeError, match="need a resize rule"):
        LengthSpec(ids_fields=("input_ids",), image_size_fields=("image",))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_read_lengths_adds_image_tokens(tmp_path, fmt):
    pytest.importorskip("pyarrow")
    rng = np.random.default_rng(0)
    recs = [{"text_tokens": int(rng.integers(5, 500)), "width": int(rng.integers(32, 2000)),
             "height": int(rng.integers(32, 2000))} for _ in range(50)]
    path = write(fmt, recs, tmp_path / fmt)
    rule = VisionTokenRule.for_family("qwen3-vl")
    spec = LengthSpec(count_fields=("text_tokens",), image_width_field="width", image_height_field="height",
                      vision=rule)
    got = read_lengths(path, spec).lengths
    want = [r["text_tokens"] + (lambda hw: (hw[0] // 32) * (hw[1] // 32))(
        smart_resize(r["height"], r["width"], 32, rule.min_pixels, rule.max_pixels)) for r in recs]
    assert got.tolist() == want


def test_cli_vision_options(tmp_path, capsys):
    recs = [{"input_ids": [1] * 10, "images": [{"width": 640, "height": 480}]},
            {"input_ids": [1] * 20, "images": []}]
    path = write("jsonl", recs, tmp_path / "d")
    code, out, err = run_cli(["analyze", path, "-o", tmp_path / "out", "--ids-field", "input_ids",
                              "--image-size-field", "images", "--vision-model", "qwen2.5-vl", "--patch-size", "16",
                              "--image-extra-tokens", "2", "--no-figures", "--no-progress", "--save-lengths"], capsys)
    assert code == 0, err
    # 640x480 at factor 16 * 2 = 32: 20 x 15 = 300 tokens, + 2 per image; the second sample has no image.
    assert np.load(tmp_path / "out" / "lengths.npy").tolist() == [10 + 302, 20]
    source = json.loads((tmp_path / "out" / "dataset_stats.json").read_text())["source"]["length_source"]
    assert source["vision"] == {"patch_size": 16, "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056,
                                "extra_tokens_per_image": 2}
    code, out, err = run_cli(["analyze", path, "-o", tmp_path / "o2", "--image-size-field", "images",
                              "--no-figures"], capsys)
    assert code == 2 and "--vision-model" in err
