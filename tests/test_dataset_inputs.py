"""Bad input to pack_dataset gets a clear error before any work (issue 39: never silently wrong)."""
from __future__ import annotations

import pytest

import packkit

pytestmark = pytest.mark.core

datasets = pytest.importorskip("datasets")


def _ds(**columns):
    return datasets.Dataset.from_dict(columns or {"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]]})


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(seed="x"), TypeError, "seed must be None or an int >= 0, got 'x'"),
    (dict(seed=-1), ValueError, "seed must be None or an int >= 0, got -1"),
    (dict(seed=True), TypeError, "seed must be None"),
    (dict(shuffle="yes"), TypeError, "shuffle must be True or False, got 'yes'"),
    (dict(position_ids="yes"), TypeError, "position_ids must be True or False"),
    (dict(algorithm="nope"), ValueError, "unknown algorithm 'nope'"),
    (dict(overlong="bogus"), ValueError, "unknown overlong policy 'bogus'"),
    (dict(cost="flops"), ValueError, "unknown cost 'flops'"),
])
def test_options_are_validated(kwargs, error, match):
    with pytest.raises(error, match=match):
        packkit.pack_dataset(_ds(), 10, **kwargs)


def test_negative_token_ids_are_warned_about_with_their_row():
    # trl.pack_dataset packs them (issue 57: takes what TRL takes), so packkit packs them too, with a warning.
    ds = _ds(input_ids=[[1, 2], [3, -4, 5]], labels=[[1, 2], [3, -100, 5]])
    with pytest.warns(UserWarning, match="row 1 holds a negative token id"):
        out = packkit.pack_dataset(ds, 10)
    assert sorted(out[0]["input_ids"]) == [-4, 1, 2, 3, 5]
    # -100 in labels is the ignore index, not an error.
    out = packkit.pack_dataset(_ds(input_ids=[[1, 2], [3, 4, 5]], labels=[[1, 2], [3, -100, 5]]), 10)
    assert out[0]["labels"] == [1, 2, 3, -100, 5] or out[0]["labels"] == [3, -100, 5, 1, 2]


def test_negative_token_id_in_a_later_chunk(tmp_path):
    # A dataset read back from disk comes in several Arrow chunks: the row named is the global row.
    parts = [_ds(input_ids=[[1, 2]] * 3), _ds(input_ids=[[1, 2], [5, -1]])]
    ds = datasets.concatenate_datasets(parts)
    assert len(ds.data.column("input_ids").chunks) == 2
    with pytest.warns(UserWarning, match="row 4 holds a negative token id"):
        packkit.pack_dataset(ds, 10)
