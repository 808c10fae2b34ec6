"""PackingCollator: HF-compatible output, label options, shapes, block mask, num_items_in_batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from packkit import PackingCollator

pytestmark = pytest.mark.core

transformers = pytest.importorskip("transformers")


def make_features(seed, n=None, max_len=40, form="list", labels=False):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 16)) if n is None else n
    feats = []
    for _ in range(n):
        ids = rng.integers(3, 500, int(rng.integers(1, max_len + 1)))
        lab = rng.integers(-100, 500, len(ids))
        conv = {"list": lambda a: a.tolist(), "numpy": lambda a: a, "tensor": torch.from_numpy}[form]
        feats.append({"input_ids": conv(ids), **({"labels": conv(lab)} if labels else {})})
    return feats


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), form=st.sampled_from(["list", "numpy", "tensor"]), labels=st.booleans(),
       separator=st.sampled_from([-100, 0, 7]), start=st.sampled_from([0, 2]))
def test_flat_equals_hf_data_collator_with_flattening(seed, form, labels, separator, start):
    feats = make_features(seed, form=form, labels=labels)
    hf = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True,
                                                 separator_id=separator, position_ids_start=start)(feats)
    ours = PackingCollator(separator_id=separator, position_ids_start=start)(feats)
    assert list(ours) == list(hf)
    for key, value in hf.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
        else:
            assert type(ours[key]) is type(value) and ours[key] == value, key


def test_labels_from_completion_and_assistant_masks():
    feats = [{"input_ids": [5, 6, 7, 8], "completion_mask": [0, 0, 1, 1]},
             {"input_ids": [9, 10, 11], "assistant_masks": [1, 1, 0]},
             {"input_ids": [12, 13], "labels": [-100, 13]},
             {"input_ids": [14, 15]}]
    batch = PackingCollator()(feats)
    assert batch["labels"].tolist() == [[-100, -100, 7, 8, -100, 10, -100, -100, 13, -100, 15]]
    with pytest.raises(ValueError, match="completion_mask has 2 entries"):
        PackingCollator()([{"input_ids": [1, 2, 3], "completion_mask": [1, 1]}])


def test_padded_fixed_rows_multiple_and_num_items():
    feats = make_features(3, n=20, max_len=60)
    collate = PackingCollator(64, layout="padded", num_rows=16, return_num_items=True)
    batch = collate(feats)
    assert batch["input_ids"].shape == (16, 64)
    assert int(batch["num_items_in_batch"]) == sum(len(f["input_ids"]) - 1 for f in feats)
    assert int(batch["num_items_in_batch"]) == int((batch["labels"] != -100).sum())
    tight = PackingCollator(64, layout="padded", pad_to_capacity=False, pad_to_multiple_of=8)(feats)
    assert tight["input_ids"].shape[1] % 8 == 0 and tight["input_ids"].shape[1] <= 64
    flat = PackingCollator(pad_to_multiple_of=32)(feats)
    assert flat["input_ids"].shape[1] % 32 == 0
    assert int(flat["cu_seq_lens_q"][-1]) == flat["input_ids"].shape[1]
    with pytest.raises(ValueError, match="num_rows=2"):
        PackingCollator(64, layout="padded", num_rows=2)(feats)


def test_empty_batch_gives_padding_rows():
    batch = PackingCollator(16, layout="padded", num_rows=2, return_num_items=True)([])
    assert batch["input_ids"].shape == (2, 16) and int(batch["num_items_in_batch"]) == 0
    assert (batch["labels"] == -100).all()
    flat = PackingCollator(16)([])
    assert flat["input_ids"].shape == (1, 16) and flat["cu_seq_lens_q"].tolist() == [0, 16]


def test_overlong_policies():
    feats = [{"input_ids": list(range(1, 30))}, {"input_ids": [1, 2]}]
    with pytest.raises(ValueError, match="longer than"):
        PackingCollator(16)(feats)
    assert PackingCollator(16, overlong="truncate")(feats)["input_ids"].shape == (1, 18)
    assert PackingCollator(16, overlong="drop")(feats)["input_ids"].tolist() == [[1, 2]]
    split = PackingCollator(16, layout="padded", overlong="split")(feats)
    assert int((split["input_ids"] != 0).sum()) == 31


def test_block_mask_is_document_causal():
    feats = make_features(4, n=6, max_len=30)
    batch = PackingCollator(40, layout="padded", return_block_mask=True)(feats)
    mask = batch["attention_mask"]
    doc = batch["seq_idx"]
    rows, length = doc.shape
    q = torch.arange(length)[:, None]
    kv = torch.arange(length)[None, :]
    for b in range(rows):
        got = mask.mask_mod(torch.tensor(b), torch.tensor(0), q, kv)
        want = (doc[b][:, None] == doc[b][None, :]) & (kv <= q)
        assert torch.equal(got, want)


@pytest.mark.parametrize("bad, error, match", [
    ("not a list", TypeError, "list of features"),
    ([{"text": "hi"}], ValueError, "no 'input_ids'"),
    ([{"input_ids": [1.5, 2.0]}], TypeError, "integer"),
    ([{"input_ids": [1, 2], "labels": [1]}], ValueError, "labels has 1 entries"),
])
def test_bad_features(bad, error, match):
    with pytest.raises(error, match=match):
        PackingCollator()(bad)


@pytest.mark.parametrize("kwargs, match", [
    (dict(layout="padded"), "needs capacity"),
    (dict(capacity=0), "positive int"),
    (dict(layout="stacked"), "unknown layout"),
    (dict(capacity=8, algorithm="magic"), "unknown algorithm"),
    (dict(num_rows=4), "applies to layout"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PackingCollator(**kwargs)


def test_separator_id_none_keeps_first_labels_and_separator_sets_them():
    """separator_id=None must leave every label as given (audit, issue 27: untested; planted control: a
    pack_sequences that always masks the first label fails this)."""
    feats = [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9], "labels": [1, 2]}, {"input_ids": [10, 11, 12, 13]}]
    flat = PackingCollator(separator_id=None)(feats)
    assert flat["labels"].tolist() == [[5, 6, 7, 1, 2, 10, 11, 12, 13]]
    assert PackingCollator(separator_id=3)(feats)["labels"].tolist() == [[3, 6, 7, 3, 2, 3, 11, 12, 13]]
    padded = PackingCollator(8, layout="padded", separator_id=None, algorithm="nf")(feats)
    assert padded["labels"].tolist() == [[5, 6, 7, 1, 2, -100, -100, -100], [10, 11, 12, 13, -100, -100, -100, -100]]
