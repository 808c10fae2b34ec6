"""``packkit.vision_cost`` (issue 50 §6): the vision tower's training FLOPs per sample of Qwen2-VL / Qwen2.5-VL /
Qwen3-VL, checked on tiny random-init towers built from configs (tests/vlm_helpers.py, depth 3, Qwen2.5-VL with a
full-attention block between windowed ones, Qwen3-VL with two deepstack mergers) on random image and video grids.

* The per-patch part against torch's FLOP counter: a forward with the attention core hidden from the counter equals
  ``linear / 3`` (forward = a third of training) within 5%.
* The pairs: the (query, key) pairs each block's attention is called with (the segments ``cu_seqlens`` /
  ``cu_window_seqlens`` cut, recorded by an attention function registered for the test) equal ``pairs()`` exactly.
* The whole: forward + backward of the eager tower (the pixels need a gradient, so every matmul has its two backward
  matmuls) equals the cost within 5%.
* Controls: every Qwen2.5-VL block counted as full attention, a video counted as one segment instead of one per
  frame, and the merger counted per patch instead of per merged token each fail the same checks.
"""
from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from packkit.planning.vision_cost import _TOWERS, VisionCost

transformers = pytest.importorskip("transformers")
from vlm_helpers import PIXEL_DIM, tiny_config  # noqa: E402

pytestmark = pytest.mark.core

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
_RECORDED: list = []


def _config(family: str):
    config = tiny_config(family)
    vision = config.vision_config
    vision.depth = 3
    if family == "qwen2_5_vl":
        vision.fullatt_block_indexes = [1]  # window_size 8 = 2 merged tokens a side, then full, then windows
    if family == "qwen3_vl":
        vision.deepstack_visual_indexes = [0, 2]
    return config


def _register() -> tuple[str, str]:
    """Two attention functions: one hidden from the FLOP counter, one that also records each call's pairs."""
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers.models.qwen2_vl.modeling_qwen2_vl import eager_attention_forward

    def hidden(module, query, key, value, attention_mask, **kwargs):
        with _disable_current_modes():
            return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    def recording(module, query, key, value, attention_mask, **kwargs):
        # unmasked and bidirectional inside the segment it is given: every (query, key) pair of it is attended
        assert attention_mask is None and kwargs.get("is_causal") is False
        _RECORDED.append((module, query.shape[2] * key.shape[2]))
        return hidden(module, query, key, value, attention_mask, **kwargs)

    transformers.AttentionInterface.register("packkit_test_vision_hidden", hidden)
    transformers.AttentionInterface.register("packkit_test_vision_recording", recording)
    return "packkit_test_vision_hidden", "packkit_test_vision_recording"


_TOWER_CACHE: dict = {}


def _tower(family: str):
    if family not in _TOWER_CACHE:
        vision = _config(family).vision_config
        module, name = _TOWERS[vision.model_type]
        cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _TOWER_CACHE[family] = cls(vision).double()
    return _TOWER_CACHE[family]


def _run(family: str, grids: np.ndarray, attn: str, backward: bool = False):
    """(FLOPs counted, pairs each block was called with) of one tower forward (and backward) on ``grids``."""
    from torch.utils.flop_counter import FlopCounterMode

    tower = _tower(family)
    tower.config._attn_implementation = attn
    torch.manual_seed(1)
    pixels = torch.randn(int(grids.prod(axis=1).sum()), PIXEL_DIM, dtype=torch.float64, requires_grad=backward)
    _RECORDED.clear()
    counter = FlopCounterMode(display=False)
    with counter, torch.set_grad_enabled(backward):
        out = tower(pixels, grid_thw=torch.from_numpy(grids))
        if backward:
            deepstack = getattr(out, "deepstack_features", None) or []
            (out.pooler_output.sum() + sum(d.sum() for d in deepstack)).backward()
    block = {id(b.attn): i for i, b in enumerate(tower.blocks)}
    pairs = [0] * len(tower.blocks)
    for module, n in _RECORDED:
        pairs[block[id(module)]] += n
    return counter.get_total_flops(), pairs


_side = st.integers(1, 6).map(lambda k: 2 * k)  # h, w: multiples of the merge size 2
_image = st.tuples(st.just(1), _side, _side)
_video = st.tuples(st.integers(1, 3), _side, _side)
_grids = st.tuples(st.lists(_image, max_size=3), st.lists(_video, max_size=2)).filter(lambda g: g[0] or g[1])


def _array(grids) -> np.ndarray:
    return np.array(grids, dtype=np.int64).reshape(-1, 3)


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=5, deadline=None)
@given(grids=_grids)
def test_pairs_equal_the_segments_each_block_attends(family, grids):
    images, videos = _array(grids[0]), _array(grids[1])
    cost = packkit.vision_cost(_config(family))
    _, recorded = _run(family, np.concatenate([images, videos]), _register()[1])
    assert cost.pairs(np.concatenate([images, videos])) == recorded
    assert cost(images, videos) == pytest.approx(
        cost.linear(np.concatenate([images, videos])) + cost.pair_flops * sum(recorded), rel=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_per_patch_part_matches_the_flop_counter(family):
    grids = np.array([[1, 6, 10], [2, 4, 4], [1, 2, 2]])
    cost = packkit.vision_cost(_config(family))
    counted, _ = _run(family, grids, _register()[0])
    assert counted == pytest.approx(cost.linear(grids) / 3, rel=0.05)


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_backward_matches_the_flop_counter(family):
    grids = np.array([[1, 6, 10], [2, 4, 4]])
    cost = packkit.vision_cost(_config(family))
    counted, _ = _run(family, grids, "eager", backward=True)
    assert counted == pytest.approx(cost(grids), rel=0.05)
    frozen = packkit.vision_cost(_config(family), train_vision=False)  # forward only
    assert frozen(grids) == pytest.approx(cost(grids) / 3, rel=1e-12)


def test_control_full_attention_count_of_windowed_blocks_fails():
    grids = np.array([[1, 6, 10]])
    right = packkit.vision_cost(_config("qwen2_5_vl"))
    _, recorded = _run("qwen2_5_vl", grids, _register()[1])
    wrong = VisionCost("control", 0, 0, 16, 2, 3, None, (), True)  # no windows: every block full
    assert right.pairs(grids) == recorded
    assert wrong.pairs(grids) != recorded and wrong.pairs(grids)[0] > 3 * recorded[0]


def test_control_a_video_as_one_segment_fails():
    grids = np.array([[3, 4, 6]])
    _, recorded = _run("qwen2_vl", grids, _register()[1])
    one_segment = float(grids.prod()) ** 2  # frames attending across each other
    assert recorded == packkit.vision_cost(_config("qwen2_vl")).pairs(grids)
    assert recorded[0] != one_segment and recorded[0] * 3 == one_segment


def test_control_merger_counted_per_patch_fails():
    grids = np.array([[1, 6, 10], [2, 4, 4]])
    cost = packkit.vision_cost(_config("qwen2_vl"))
    counted, _ = _run("qwen2_vl", grids, _register()[0])
    from packkit.planning.vision_cost import _per_patch_macs

    patch, merged = _per_patch_macs(_config("qwen2_vl").vision_config, 2)
    wrong = 2.0 * (patch + merged) * float(grids.prod(axis=1).sum())  # forward, merger on every patch
    assert counted == pytest.approx(cost.linear(grids) / 3, rel=0.05)
    assert counted != pytest.approx(wrong, rel=0.05)


def test_per_sample_is_one_cost_per_sample():
    cost = packkit.vision_cost(_config("qwen3_vl"))
    images = [None, [[1, 4, 4]], torch.tensor([[1, 2, 2], [1, 4, 6]]), []]
    videos = [[[2, 4, 4]], None, None, None]
    out = cost.per_sample(images, videos)
    assert out.dtype == np.float64 and out.shape == (4,) and out[3] == 0
    assert out[1] == cost([[1, 4, 4]]) and out[0] == cost(None, [[2, 4, 4]])
    assert out[2] == pytest.approx(cost([[1, 2, 2]]) + cost([[1, 4, 6]]))  # full attention: per image, additive


def test_bad_input_is_named():
    cost = packkit.vision_cost(_config("qwen2_vl"))
    with pytest.raises(ValueError, match="spatial merge size 2"):
        cost([[1, 3, 4]])
    with pytest.raises(ValueError, match="image_grid_thw must be"):
        cost([[1, 0, 4]])
    with pytest.raises(ValueError, match="sample 1: video_grid_thw must be"):
        cost.per_sample([None, None], [None, [[1.5, 2, 2]]])
    with pytest.raises(ValueError, match="video_grids has 1 entries for 2 samples"):
        cost.per_sample([None, None], [None])
    with pytest.raises(ValueError, match="vision_cost counts the vision towers"):
        packkit.vision_cost(transformers.LlamaConfig())
    config = _config("qwen2_5_vl")
    config.vision_config.__dict__["window_size"] = None  # past HF's validator
    with pytest.raises(ValueError, match="window size"):
        packkit.vision_cost(config)
    with pytest.raises(TypeError, match="train_vision"):
        packkit.vision_cost(_config("qwen2_vl"), train_vision=1)


def test_qwen3_vl_moe_has_the_qwen3_vl_tower():
    vision = _config("qwen3_vl").vision_config.to_dict()
    vision.pop("model_type", None)
    moe = transformers.Qwen3VLMoeConfig(vision_config=vision)
    grids = np.array([[1, 6, 10], [3, 4, 4]])
    assert packkit.vision_cost(moe)(grids) == packkit.vision_cost(_config("qwen3_vl"))(grids) > 0
    with pytest.raises(TypeError, match="image_grids or video_grids"):
        packkit.vision_cost(moe).per_sample(None)
