"""mRoPE rows equal the models' own ``get_rope_index`` per sample (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), packed or
built by ``packkit.mrope_position_ids``; vision inputs in packed order; inconsistent samples raise."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit

pytest.importorskip("transformers")
from vlm_helpers import IMAGE, MERGE, make_sample, tiny_model  # noqa: E402

pytestmark = pytest.mark.core

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
_MODELS = {}


def model_of(family):
    if family not in _MODELS:
        _MODELS[family] = tiny_model(family, dtype=torch.float32)
    return _MODELS[family]


def reference_rows(model, sample):
    """``model.model.get_rope_index`` of the sample alone: [3, n]."""
    ids = torch.tensor([sample["input_ids"]])
    types = torch.tensor([sample["mm_token_type_ids"]])
    extra = {}
    if model.config.model_type == "qwen2_5_vl":
        extra["second_per_grid_ts"] = sample.get("second_per_grid_ts")
    if not types.any():  # get_rope_index needs vision; the model uses plain positions for text-only input
        return torch.arange(ids.shape[1]).expand(3, -1)
    rows, _ = model.model.get_rope_index(ids, types, sample.get("image_grid_thw"), sample.get("video_grid_thw"),
                                         **extra)
    return rows[:, 0]


side = st.sampled_from([2, 4, 6])
block = st.one_of(st.tuples(st.just("text"), st.integers(1, 6)),
                  st.tuples(st.just("image"), st.tuples(side, side)),
                  st.tuples(st.just("video"), st.tuples(st.integers(1, 3), side, side)))
sample_spec = st.lists(block, min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(FAMILIES), specs=st.lists(sample_spec, min_size=1, max_size=5),
       seed=st.integers(0, 2**31), layout=st.sampled_from(["flat", "padded"]))
def test_packed_mrope_rows_equal_get_rope_index_per_sample(family, specs, seed, layout):
    rng = np.random.default_rng(seed)
    model = model_of(family)
    feats = [make_sample(rng, s, family) for s in specs]
    capacity = max(len(f["input_ids"]) for f in feats) + int(rng.integers(0, 8))
    batch, info = packkit.pack_sequences([f["input_ids"] for f in feats], capacity=capacity, layout=layout,
                                         fields={k: [f.get(k) for f in feats] for k in
                                                 {k for f in feats for k in f} - {"input_ids"}},
                                         mrope=model.config, return_info=True)
    pos = batch["position_ids"]
    assert pos.shape == (4, *batch["input_ids"].shape) and pos.dtype == torch.int64
    plain = packkit.pack_sequences([f["input_ids"] for f in feats], capacity=capacity, layout=layout)
    assert torch.equal(pos[0], plain["position_ids"])  # row 0: the text positions, as without mrope
    # Each sample's rows, cut back out of the packed batch, equal the model's own for that sample alone.
    per_sample = packkit.unpack_sequences(pos[1:].movedim(0, -1), info, padded=True)
    for i, f in enumerate(feats):
        n = len(f["input_ids"])
        assert torch.equal(per_sample[i, :n].T, reference_rows(model, f)), i
    # Padding counts up like a document: rows 1-3 equal row 0 where no sample is.
    real = torch.zeros(batch["input_ids"].numel(), dtype=torch.bool)
    cu = batch["cu_seq_lens_q"].tolist()
    for s, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        real[a:b] = int(info.cu_seg[s]) >= 0
    real = real.view(batch["input_ids"].shape)
    for r in range(1, 4):
        assert torch.equal(pos[r][~real], pos[0][~real])
    # The plain function gives the same [4, B, L] from the packed batch alone.
    again = packkit.mrope_position_ids(batch["input_ids"], batch["mm_token_type_ids"], batch.get("image_grid_thw"),
                                       batch.get("video_grid_thw"), model.config,
                                       second_per_grid_ts=batch.get("second_per_grid_ts"), position_ids=pos[0])
    assert torch.equal(again, pos)


def test_vision_inputs_follow_packed_order():
    rng = np.random.default_rng(1)
    model = model_of("qwen2_5_vl")
    specs = [[("text", 3), ("image", (2, 2))], [("text", 20)], [("image", (4, 4)), ("text", 1)],
             [("video", (2, 2, 2)), ("image", (2, 4))], [("text", 2), ("image", (2, 2)), ("video", (1, 4, 4))]]
    feats = [make_sample(rng, s) for s in specs]
    collate = packkit.PackingCollator(32, layout="padded", num_rows=5, mrope=model.config)
    batch = collate(feats)
    plan = packkit.plan([len(f["input_ids"]) for f in feats], 32)
    order = [i for row in plan.bins for i in row.tolist()]
    assert order != sorted(order)  # the plan reorders, so the test can tell packed from input order
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        want = torch.cat([feats[i][key] for i in order if key in feats[i]])
        assert torch.equal(batch[key], want), key
    # The image tokens of the packed batch, in row-major order, belong to the grids in that order.
    assert int((batch["input_ids"] == IMAGE).sum()) == int(batch["image_grid_thw"].prod(-1).sum()) // MERGE**2
    assert torch.equal(batch["mm_token_type_ids"] != 0, (batch["input_ids"] == IMAGE) | (batch["input_ids"] == 91))


def test_mm_token_type_ids_derived_from_token_ids():
    rng = np.random.default_rng(2)
    model = model_of("qwen3_vl")
    feats = [make_sample(rng, [("text", 3), ("image", (4, 2)), ("video", (2, 2, 2))], "qwen3_vl") for _ in range(3)]
    with_types = packkit.PackingCollator(mrope=model.config)(feats)
    without = packkit.PackingCollator(mrope=model.config)([{k: v for k, v in f.items() if k != "mm_token_type_ids"}
                                                           for f in feats])
    assert torch.equal(with_types["position_ids"], without["position_ids"])
    assert "mm_token_type_ids" not in without


def _bad(feats, **kw):
    return packkit.PackingCollator(mrope=model_of("qwen2_5_vl").config, **kw)(feats)


@pytest.mark.parametrize("breaks,match", [
    (lambda f: f.update(image_grid_thw=torch.tensor([[1, 4, 2]])), "sample 1: pixel_values .* implies 8 patch rows"),
    (lambda f: f.update(pixel_values=f["pixel_values"][:-1]), "sample 1: pixel_values .* implies 16 patch rows"),
    (lambda f: f.update(image_grid_thw=torch.tensor([[1, 4, 4], [1, 2, 2]]), pixel_values=torch.zeros(20, 24)),
     "sample 1: image_grid_thw has 2 grid"),
    (lambda f: f.pop("pixel_values"), "sample 1: image_grid_thw has 1 grid.*no pixel_values"),
    (lambda f: f.update(mm_token_type_ids=[0] * len(f["input_ids"])), "sample 1: token .* disagrees"),
    (lambda f: f.update(input_ids=f["input_ids"][:-4], mm_token_type_ids=f["mm_token_type_ids"][:-4]),
     "sample 1: image block 0 has 3 tokens"),
    (lambda f: f.update(second_per_grid_ts=torch.tensor([1.0])), "sample 1: second_per_grid_ts has 1"),
])
def test_inconsistent_samples_name_the_sample(breaks, match):
    rng = np.random.default_rng(3)
    feats = [make_sample(rng, [("text", 4)]), make_sample(rng, [("text", 2), ("image", (4, 4))])]
    feats[1]["input_ids"] += [5, 6]
    feats[1]["mm_token_type_ids"] += [0, 0]
    breaks(feats[1])
    with pytest.raises(ValueError, match=match):
        _bad(feats)


def test_vision_without_tokens_raises():
    rng = np.random.default_rng(9)
    image = make_sample(rng, [("image", (2, 2))])
    empty = {"input_ids": [], "pixel_values": image["pixel_values"], "image_grid_thw": image["image_grid_thw"]}
    with pytest.raises(ValueError, match="sample 1 holds vision inputs but no tokens"):
        packkit.PackingCollator()([{"input_ids": [1, 2]}, empty])
    text = {"input_ids": [1, 2, 3], "mm_token_type_ids": [0, 0, 0], "pixel_values": image["pixel_values"],
            "image_grid_thw": image["image_grid_thw"]}
    with pytest.raises(ValueError, match="sample 0: image_grid_thw has 1 grid"):
        _bad([text])


def test_vision_samples_are_never_cut():
    rng = np.random.default_rng(4)
    feats = [make_sample(rng, [("text", 4), ("image", (4, 4)), ("text", 10)])]
    with pytest.raises(ValueError, match="sample 0 holds vision inputs but the plan cuts it"):
        packkit.PackingCollator(12, overlong="truncate", mrope=model_of("qwen2_5_vl").config)(feats)
    dropped = packkit.PackingCollator(12, overlong="drop", mrope=model_of("qwen2_5_vl").config)(
        feats + [{"input_ids": [1, 2, 3]}])
    assert "pixel_values" not in dropped and dropped["input_ids"].shape == (1, 3)


def test_mrope_options_checked():
    with pytest.raises(ValueError, match="model_type"):
        packkit.PackingCollator(mrope=object())
    with pytest.raises(ValueError, match="position_ids_start must be 0"):
        packkit.PackingCollator(mrope=model_of("qwen2_vl").config, position_ids_start=2)


def tagged_samples(family, n, seed):
    """VL samples whose first token (1000 + index) names them inside a packed batch."""
    rng = np.random.default_rng(seed)
    kinds = [[("text", 6)], [("text", 2), ("image", (4, 2)), ("text", 3)],
             [("text", 1), ("video", (2, 2, 4)), ("text", 2), ("image", (2, 2))], [("text", 2), ("image", (2, 6))]]
    out = []
    for i in range(n):
        s = make_sample(rng, kinds[int(rng.integers(len(kinds)))] + [("text", int(rng.integers(1, 9)))], family)
        s["input_ids"] = [1000 + i] + s["input_ids"]
        s["mm_token_type_ids"] = [0] + s["mm_token_type_ids"]
        out.append(s)
    return out


def check_packed_against_samples(batch, feats, model):
    """Every segment of ``batch`` is a whole sample: its mRoPE rows are the model's own, and the vision
    tensors are the segments' samples' tensors in packed order. Returns the sample indices seen."""
    ids, pos = batch["input_ids"].reshape(-1), batch["position_ids"].reshape(4, -1)
    cu = batch["cu_seq_lens_q"].tolist()
    order = []
    for a, b in zip(cu[:-1], cu[1:]):
        if int(ids[a]) < 1000:
            assert (ids[a:b] == 0).all()  # a padding segment
            continue
        i = int(ids[a]) - 1000
        order.append(i)
        assert b - a == len(feats[i]["input_ids"])
        assert torch.equal(pos[1:, a:b], reference_rows(model, feats[i])), i
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        parts = [feats[i][key] for i in order if key in feats[i]]
        assert (key in batch) == bool(parts)
        if parts:
            assert torch.equal(batch[key], torch.cat(parts)), key
    return order


def test_sampler_and_collator_carry_multimodal_features_end_to_end():
    model = model_of("qwen2_5_vl")
    feats = tagged_samples("qwen2_5_vl", 40, seed=6)
    sampler = packkit.PackedBatchSampler([len(f["input_ids"]) for f in feats], 64, rank=0, world_size=1, seed=3)
    loader = torch.utils.data.DataLoader(feats, batch_sampler=sampler,
                                         collate_fn=packkit.PackingCollator(64, layout="padded", mrope=model.config))
    seen = [i for batch in loader for i in check_packed_against_samples(batch, feats, model)]
    assert sorted(seen) == list(range(len(feats)))


def test_streaming_carries_multimodal_features_end_to_end():
    model = model_of("qwen3_vl")
    feats = tagged_samples("qwen3_vl", 40, seed=7)
    ds = packkit.PackedIterableDataset(feats, 64, buffer_size=16, rows_per_item=2, mrope=model.config)
    seen = [i for item in ds for i in check_packed_against_samples(item, feats, model)]
    assert sorted(seen) == list(range(len(feats)))
    flat = packkit.PackedIterableDataset(feats, 64, buffer_size=16, layout="flat", mrope=model.config)
    assert sorted(i for item in flat for i in check_packed_against_samples(item, feats, model)) == list(range(40))


def test_qwen3_vl_moe_uses_its_own_get_rope_index():
    """Qwen3-VL-MoE: the spec reads its config, and the rows equal its model class's ``get_rope_index``
    (called on a stand-in holding only the config: the method reads nothing else)."""
    import transformers
    from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as moe

    base = model_of("qwen3_vl").config
    config = transformers.Qwen3VLMoeConfig(vision_config=base.vision_config.to_dict(), image_token_id=90,
                                           video_token_id=91)
    spec = packkit.packing.multimodal.mrope_spec(config)
    assert spec.family == "qwen3_vl_moe" and spec.frames_as_grids and spec.spatial_merge_size == MERGE

    class StandIn:
        get_rope_index = moe.Qwen3VLMoeModel.get_rope_index
        get_vision_position_ids = moe.Qwen3VLMoeModel.get_vision_position_ids

    stand_in = StandIn()
    stand_in.config = config
    rng = np.random.default_rng(8)
    s = make_sample(rng, [("text", 3), ("video", (3, 4, 2)), ("image", (2, 4)), ("text", 2)], "qwen3_vl")
    ids, types = torch.tensor([s["input_ids"]]), torch.tensor([s["mm_token_type_ids"]])
    want, _ = stand_in.get_rope_index(ids, types, s["image_grid_thw"], s["video_grid_thw"].clone())
    got = packkit.mrope_position_ids(ids, types, s["image_grid_thw"], s["video_grid_thw"], config)
    assert torch.equal(got[1:], want)
