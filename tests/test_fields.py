"""Fields beside input_ids: per-token fields packed like the ids, attention_mask, unknown fields refused;
the same in PackingCollator, pack_sequences, PackedIterableDataset and through PackedBatchSampler."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from packkit import PackingCollator, PackedIterableDataset

pytestmark = pytest.mark.core


def features(rng, n, max_len=30, form="list"):
    conv = {"list": lambda a: a.tolist(), "numpy": lambda a: a, "tensor": torch.from_numpy}[form]
    out = []
    for _ in range(n):
        ids = rng.integers(1, 500, int(rng.integers(1, max_len + 1)))
        out.append({"input_ids": conv(ids), "token_type_ids": conv(ids % 3),
                    "loss_weights": conv(ids.astype(np.float32) / 7),
                    "pair": conv(np.stack([ids, -ids], 1)),  # trailing dims are kept
                    "attention_mask": conv(np.ones(len(ids), np.int64))})
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["flat", "padded"]),
       form=st.sampled_from(["list", "numpy", "tensor"]), pad=st.sampled_from([0, -1, 7]))
def test_per_token_fields_follow_the_ids(seed, layout, form, pad):
    rng = np.random.default_rng(seed)
    feats = features(rng, int(rng.integers(1, 12)), form=form)
    collate = PackingCollator(32, layout=layout, pad_values={"token_type_ids": pad, "loss_weights": -1.0},
                              pad_to_multiple_of=8 if layout == "flat" else None)
    batch = collate(feats)
    assert "attention_mask" not in batch
    ids = batch["input_ids"]
    plain = PackingCollator(32, layout=layout, pad_to_multiple_of=8 if layout == "flat" else None)(
        [{"input_ids": f["input_ids"]} for f in feats])
    for key in plain:
        same = torch.equal(plain[key], batch[key]) if isinstance(plain[key], torch.Tensor) else plain[key] == batch[key]
        assert same, key  # extra fields change nothing else
    tt, lw, pair = batch["token_type_ids"], batch["loss_weights"], batch["pair"]
    assert tt.shape == ids.shape and lw.shape == ids.shape and pair.shape == (*ids.shape, 2)
    assert lw.dtype == (torch.float64 if form == "list" else torch.float32) and tt.dtype == torch.int64
    src = torch.cat([torch.as_tensor(np.asarray(f["input_ids"])) for f in feats])
    # Every packed token's fields are its own: the same map from ids as in the source.
    expect_tt = torch.where(ids != 0, ids % 3, tt)
    assert torch.equal(tt, expect_tt)
    assert torch.equal(pair[..., 0], ids) and torch.equal(pair[..., 1], -ids)
    assert torch.allclose(lw[ids != 0], ids[ids != 0].to(lw.dtype) / 7)
    pad_positions = ids == 0  # ids are >= 1, so 0 marks padding exactly
    assert (tt[pad_positions] == pad).all() and (lw[pad_positions] == -1).all()
    assert int((~pad_positions).sum()) == src.numel()


def test_unknown_fields_raise_drop_or_keep():
    feats = [{"input_ids": [1, 2, 3], "id": "a", "score": 0.5}, {"input_ids": [4, 5], "id": "b", "score": 1.5},
             {"input_ids": [6, 7, 8, 9], "id": "c", "score": 2.5}]
    with pytest.raises(ValueError, match=r"field 'id' is not per-token \(sample 0: str .*extra_fields='drop'.*'keep'"):
        PackingCollator()(feats)
    assert set(PackingCollator(extra_fields="drop")(feats)) == set(PackingCollator()(
        [{"input_ids": f["input_ids"]} for f in feats]))
    kept = PackingCollator(5, layout="padded", extra_fields="keep")(feats)
    order = [int(r[0]) for r in kept["input_ids"]]  # first id of each row tells the sample
    assert kept["id"] == ["c", "a", "b"] and kept["score"] == [2.5, 0.5, 1.5] and order == [6, 1]
    with_positions = [dict(f, position_ids=list(range(len(f["input_ids"])))) for f in feats]
    assert torch.equal(PackingCollator(extra_fields="drop")(with_positions)["position_ids"],
                       PackingCollator(extra_fields="drop")(feats)["position_ids"])
    with pytest.raises(ValueError, match="unknown extra_fields policy 'ignore'"):
        PackingCollator(extra_fields="ignore")


@pytest.mark.parametrize("feats,match", [
    ([{"input_ids": [1, 2, 3], "attention_mask": [1, 1, 0]}], "sample 0: attention_mask has a 0"),
    ([{"input_ids": [1, 2], "attention_mask": [1, 1]}, {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 0]}],
     "sample 1: attention_mask has a 0"),
    ([{"input_ids": [1, 2, 3], "attention_mask": [1, 1]}], "sample 0: field 'attention_mask' is list of length 2"),
    ([{"input_ids": [1, 2, 3], "token_type_ids": [0, 1, 1]}, {"input_ids": [4, 5]}],
     "field 'token_type_ids' is not per-token \\(sample 1: missing"),
    ([{"input_ids": [1, 2, 3], "position_ids": [0, 1, 2]}], "position_ids' is computed by packkit"),
])
def test_bad_fields(feats, match):
    with pytest.raises(ValueError, match=match):
        PackingCollator()(feats)


def test_pack_sequences_fields_flat_source_and_keep():
    ids = torch.arange(1, 10)
    batch = packkit.pack_sequences(ids, [4, 2, 3], capacity=5, layout="padded",
                                   fields={"w": ids.double() / 2, "tag": ["x", "y", "z"]}, extra_fields="keep",
                                   pad_values={"w": -1})
    assert torch.equal(batch["w"], torch.where(batch["input_ids"] == 0, -1.0, batch["input_ids"].double() / 2))
    assert batch["tag"] == ["x", "y", "z"]
    with pytest.raises(ValueError, match="sum\\(lengths\\)=9 rows"):
        packkit.pack_sequences(ids, [4, 2, 3], fields={"w": ids[:5]})
    with pytest.raises(ValueError, match="field 'tag' is not per-token"):
        packkit.pack_sequences([[1, 2], [3]], fields={"tag": ["x", "y"]})


def test_streaming_carries_per_token_fields_and_refuses_unknown():
    rng = np.random.default_rng(5)
    feats = features(rng, 200, max_len=60, form="numpy")
    items = list(PackedIterableDataset(feats, 64, buffer_size=32, rows_per_item=2, pad_values={"token_type_ids": 9}))
    for item in items:
        ids = item["input_ids"]
        assert torch.equal(item["token_type_ids"], torch.where(ids == 0, 9, ids % 3))
        assert torch.equal(item["pair"][..., 1], -ids)
    assert sum(int((item["input_ids"] != 0).sum()) for item in items) == sum(len(f["input_ids"]) for f in feats)
    with pytest.raises(ValueError, match="field 'tag' is not per-token"):
        list(PackedIterableDataset([{"input_ids": [1, 2], "tag": "a"}], 8))
    with pytest.raises(ValueError, match="example 0: attention_mask is not all ones"):
        list(PackedIterableDataset([{"input_ids": [1, 2], "attention_mask": [1, 0]}], 8))
    split = list(PackedIterableDataset([{"input_ids": list(range(1, 12)), "token_type_ids": list(range(11))}], 4,
                                       overlong="split", layout="flat"))
    assert sorted(t for item in split for t in item["token_type_ids"].view(-1).tolist()) == list(range(11))
    with pytest.raises(ValueError, match="example 0 has 11 tokens.*'tag'.*cannot be split"):
        list(PackedIterableDataset([{"input_ids": list(range(1, 12)), "tag": "a"}], 4, overlong="split",
                                   extra_fields="keep"))


def test_empty_sample_with_attention_mask_is_accepted():
    """Fuzz finding (tests/fuzz/corpus/collator/collator-empty-attention-mask): an empty sample with an
    all-ones (empty) attention_mask raised a raw RuntimeError from reshape(0, -1)."""
    import packkit

    batch = packkit.PackingCollator(8, layout="padded")([{"input_ids": [], "attention_mask": []},
                                                         {"input_ids": [5, 6], "attention_mask": [1, 1]}])
    assert "attention_mask" not in batch
    assert batch["input_ids"][0, :2].tolist() == [5, 6]
