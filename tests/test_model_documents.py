"""packkit.models.documents: the document spans recurrent stand-ins run (issue 50). For any packkit batch, flat or
padded, the spans read from ``cu_seq_lens_q``, from ``seq_idx`` and from ``position_ids`` are the same, cover every
token once in order, and each holds one sample's tokens; malformed boundaries are refused by name."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import packkit
from packkit.models.documents import (document_spans, spans_from_cu, spans_from_position_ids,
                                      spans_from_seq_idx)

pytestmark = pytest.mark.core


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=8), padded=st.booleans())
def test_three_sources_agree_and_cover_every_token(lengths, padded):
    features = [{"input_ids": [3 + i] * n} for i, n in enumerate(lengths)]
    collate = packkit.PackingCollator(12, layout="padded") if padded else packkit.PackingCollator()
    batch = collate(features)
    rows, length = batch["input_ids"].shape
    from_cu = spans_from_cu(batch["cu_seq_lens_q"], rows, length, "test")
    assert spans_from_seq_idx(batch["seq_idx"], rows, length, "test") == from_cu
    by_position = spans_from_position_ids(batch["position_ids"], rows, length, "test")
    assert by_position == (from_cu if len(from_cu) > rows else None)  # a row of one document is not packed
    covered = [(row, i) for row, a, b in from_cu for i in range(a, b)]
    assert covered == [(row, i) for row in range(rows) for i in range(length)]
    for row, a, b in from_cu:  # one sample (or padding) per span
        assert len(set(batch["input_ids"][row, a:b].tolist())) == 1


def test_boundaries_are_checked():
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    assert document_spans({"cu_seq_lens_q": cu}, 1, 8, "t") == [(0, 0, 3), (0, 3, 8)]
    assert document_spans({}, 1, 8, "t") is None
    with pytest.raises(ValueError, match="must rise from 0 to the batch's 1 x 9 tokens"):
        spans_from_cu(cu, 1, 9, "t")
    with pytest.raises(ValueError, match="crosses a row of 4 tokens"):
        spans_from_cu(cu, 2, 4, "t")
    with pytest.raises(ValueError, match="1-D integer tensor"):
        spans_from_cu(cu.float(), 1, 8, "t")
    with pytest.raises(ValueError, match=r"seq_idx must be a \[1, 8\] tensor"):
        spans_from_seq_idx(torch.zeros(8), 1, 8, "t")
    with pytest.raises(ValueError, match="do not match"):
        spans_from_position_ids(torch.zeros(2, 3), 1, 8, "t")
