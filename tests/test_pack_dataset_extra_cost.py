"""pack_dataset(extra_cost=...): a per-row cost (an array or a numeric column, e.g. the vision tower's FLOPs of each
row's images) in the data-parallel balance. The balance is recomputed from the packed rows themselves (each token
names its source row), so a plan that ignored the extra cost fails it; zero extra cost changes nothing."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import packkit
from dataset_checks import STRIDE, decode_segments, expected_segments, make_rows

pytestmark = pytest.mark.core

datasets = pytest.importorskip("datasets")


def vlm_like(n: int, seed: int):
    """Text lengths 5-300 tokens; a tenth of the rows carry images worth 3,000 tokens of compute each."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 300, n)
    extra = np.zeros(n)
    extra[rng.choice(n, n // 10, replace=False)] = 3000.0
    return lengths, extra


def step_balance(rows_ids, extra, dp_size: int) -> float:
    """sum over full steps of the costliest rank / sum of the mean rank, cost = tokens + the rows' extra cost."""
    costs = []
    for ids in rows_ids:
        src = np.unique(np.asarray(ids, np.int64) // STRIDE)
        costs.append(len(ids) + extra[src].sum())  # extra cost once per row, whichever piece holds it
    steps = np.array(costs[: len(costs) // dp_size * dp_size]).reshape(-1, dp_size)
    return float(steps.max(axis=1).sum() / steps.mean(axis=1).sum())


@pytest.mark.parametrize("as_column", [False, True])
def test_the_extra_cost_is_balanced_and_the_control_is_not(as_column):
    lengths, extra = vlm_like(400, 0)
    data = {"input_ids": make_rows(lengths)}
    if as_column:
        data["image_flops"] = extra
    ds = datasets.Dataset.from_dict(data)
    out, report = packkit.pack_dataset(ds, 512, dp_size=4, extra_cost="image_flops" if as_column else extra,
                                       return_report=True)
    assert out.column_names == ["input_ids", "seq_lengths"]  # the cost column is read, not packed
    assert report.excluded_columns == (["image_flops"] if as_column else [])
    assert decode_segments(out["input_ids"], out["seq_lengths"], 512) == expected_segments(lengths, 512, "error")
    true = step_balance(out["input_ids"], extra, 4)
    assert true == pytest.approx(report.balance, rel=1e-9), "the report's balance is not the packed rows' balance"
    assert true < 1.15, true
    # Control: the same data planned on tokens alone is far off balance once the images are counted.
    control = packkit.pack_dataset(datasets.Dataset.from_dict({"input_ids": make_rows(lengths)}), 512, dp_size=4)
    assert step_balance(control["input_ids"], extra, 4) > 1.5


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 120), dp_size=st.integers(1, 4), shuffle=st.booleans(), seed=st.integers(0, 3),
       overlong=st.sampled_from(["drop", "split", "truncate"]))
def test_zero_extra_cost_packs_the_same_rows(n, dp_size, shuffle, seed, overlong):
    lengths = np.random.default_rng(seed).integers(0, 200, n)
    ds = datasets.Dataset.from_dict({"input_ids": make_rows(lengths)})
    common = dict(dp_size=dp_size, shuffle=shuffle, seed=seed, overlong=overlong)
    try:
        plain = packkit.pack_dataset(ds, 128, **common)
    except ValueError as e:  # nothing to pack (every row empty or dropped): the same refusal either way
        with pytest.raises(ValueError, match=str(e)[:40]):
            packkit.pack_dataset(ds, 128, extra_cost=np.zeros(n), **common)
        return
    zero = packkit.pack_dataset(ds, 128, extra_cost=np.zeros(n), **common)
    assert zero["input_ids"] == plain["input_ids"] and zero["seq_lengths"] == plain["seq_lengths"]


def test_a_different_extra_cost_is_a_different_dataset_fingerprint():
    lengths, extra = vlm_like(60, 1)
    ds = datasets.Dataset.from_dict({"input_ids": make_rows(lengths)})
    a = packkit.pack_dataset(ds, 512, dp_size=2, extra_cost=extra)
    b = packkit.pack_dataset(ds, 512, dp_size=2, extra_cost=extra * 2)
    c = packkit.pack_dataset(ds, 512, dp_size=2)
    assert len({a._fingerprint, b._fingerprint, c._fingerprint}) == 3


@pytest.mark.parametrize("extra_cost, error, match", [
    ("missing", ValueError, "extra_cost names the column 'missing'.*columns: 'input_ids'"),
    ("input_ids", TypeError, "extra_cost column 'input_ids' must hold one number per row"),
    ("caption", TypeError, "extra_cost column 'caption' must hold one number per row"),
    ({"a": 1}, TypeError, "extra_cost must be a 1-D array"),
    ([1.0, 2.0], ValueError, "extra_cost has 2 entries for 6"),
    ([0, 0, 0, 0, 0, -1.0], ValueError, "extra_cost must be finite and >= 0"),
    ([0, 0, 0, 0, 0, float("inf")], ValueError, "extra_cost must be finite and >= 0"),
])
def test_bad_extra_cost_is_named(extra_cost, error, match):
    ds = datasets.Dataset.from_dict({"input_ids": make_rows([3] * 6), "caption": ["x"] * 6})
    with pytest.raises(error, match=match):
        packkit.pack_dataset(ds, 16, columns=["input_ids"], extra_cost=extra_cost)


def test_a_null_in_the_cost_column_is_refused():
    ds = datasets.Dataset.from_dict({"input_ids": make_rows([3] * 4), "flops": [1.0, None, 2.0, 0.0]})
    with pytest.raises(ValueError, match="extra_cost column 'flops' has 1 null"):
        packkit.pack_dataset(ds, 16, extra_cost="flops")
