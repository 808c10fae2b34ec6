"""PackedIterableDataset(max_sequences=N): every item carries the static-shape contract (issue 62): N slots per row,
cu_seq_lens_q/k rows * N + 1 long (flat: N + 1), unused slots repeating the last offset, the used ones where
position_ids restart; every example delivered once; an item over N refused by name, never cut."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from packkit.training.streaming import PackedIterableDataset

pytestmark = pytest.mark.core


def _examples(lengths):
    return [{"input_ids": list(range(100 * i + 1, 100 * i + 1 + n))} for i, n in enumerate(lengths)]


def _check_cu(cu: np.ndarray, pos: np.ndarray, slots: int):
    """The batch's offsets (as pack_sequences' contract): every segment start, in flat token order, where positions
    restart, then the batch end repeated up to ``slots + 1`` entries (zero-length slots at the end)."""
    flat = pos.reshape(-1)
    starts = np.flatnonzero(flat == 0)
    assert len(starts) <= slots
    want = np.concatenate((starts, [len(flat)] * (slots + 1 - len(starts))))
    assert cu.tolist() == want.tolist()


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=0, max_size=60), capacity=st.integers(30, 80),
       n=st.integers(2, 6), layout=st.sampled_from(["padded", "flat"]), k=st.sampled_from([None, 1, 2]),
       buffer_size=st.integers(4, 32))
def test_items_carry_the_contract_and_every_example_once(lengths, capacity, n, layout, k, buffer_size):
    ds = PackedIterableDataset(_examples(lengths), capacity, layout=layout, rows_per_item=k, buffer_size=buffer_size,
                               max_sequences=n, return_example_ids=True, seed=1)
    seen = []
    for item in ds:
        cu = item["cu_seq_lens_q"].numpy()
        pos = item["position_ids"].numpy()
        assert item["cu_seq_lens_k"].tolist() == cu.tolist()
        rows = item["input_ids"].shape[0]
        assert layout == "padded" or rows == 1
        assert cu.shape == (rows * n + 1,)  # N slots per row (flat: one row)
        _check_cu(cu, pos, rows * n)
        assert ((pos.reshape(rows, -1) == 0).sum(axis=1) <= n).all()  # and within N per row, its padding included
        assert int(item["seq_idx"].max()) < n * item["input_ids"].shape[0]
        ids = item["example_ids"]
        seen += [e for row in ids for e in row] if k is not None else ids
    assert sorted(seen) == list(range(len(lengths)))


def test_the_limit_binds_and_an_item_over_it_is_refused_by_name():
    lengths = [60] + [1] * 20
    capped = list(PackedIterableDataset(_examples(lengths), 64, max_sequences=4, return_example_ids=True))
    assert max(len(item["example_ids"]) for item in capped) == 3  # the row's padding takes the 4th slot
    free = PackedIterableDataset(_examples(lengths), 64, rows_per_item=1)  # control: rows over 4 pieces
    it = iter(free)
    first = next(it)
    assert first["cu_seq_lens_q"].shape[0] - 1 > 4
    state = free.state_dict()  # planned rows still waiting: they were planned without the limit
    resumed = PackedIterableDataset(_examples(lengths), 64, rows_per_item=1, max_sequences=4)
    resumed.load_state_dict(state)
    assert max(len(r) for r in state["ready"]) >= 4  # a waiting row needs more than 4 slots
    with pytest.raises(ValueError, match="max_sequences=4"):
        list(resumed)


def test_bad_input():
    ex = _examples([3, 4])
    for value, exc in ((0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(exc, match="max_sequences"):
            PackedIterableDataset(ex, 8, max_sequences=value)
    with pytest.raises(ValueError, match="max_sequences=1 is below rows_per_item=2"):
        PackedIterableDataset(ex, 8, layout="flat", rows_per_item=2, max_sequences=1)
    with pytest.raises(ValueError, match="max_sequences=1 leaves no slot"):  # context_parallel: the shard's slots
        PackedIterableDataset(ex, 8, context_parallel=(2, 0), max_sequences=1)
