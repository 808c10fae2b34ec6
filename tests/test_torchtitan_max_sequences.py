"""The torchtitan loader's max_sequences=N (torchtitan's max_packed_sequences_per_sample): at most N sequences per
row, the padding run included, every document once, balanced steps as before; bad input named (issue 62)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from packkit.integrations.torchtitan import BalancedDocumentStream

pytestmark = pytest.mark.full


def _docs(lengths):
    return [[i + 1] * int(n) for i, n in enumerate(lengths)]  # document i is i+1 repeated


def _sequences_per_row(batches):
    return [int((p == 0).sum()) for inputs, _ in batches for p in inputs["positions"].numpy()]


def _documents(batches):
    ids = [int(x) for inputs, labels in batches for row, lab in zip(inputs["input"], labels)
           for x, y in zip(row.tolist(), lab.tolist()) if y != -100]
    return sorted(set(ids))


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(2, 30), min_size=1, max_size=80), n=st.integers(2, 6), dp=st.integers(1, 3),
       b=st.integers(1, 2))
def test_rows_hold_at_most_n_sequences_and_every_document(lengths, n, dp, b):
    streams = [BalancedDocumentStream(_docs(lengths), seq_len=32, local_batch_size=b, dp_rank=r, dp_world_size=dp,
                                      buffer_size=16, max_sequences=n) for r in range(dp)]
    batches = [batch for s in streams for batch in s]
    per_row = _sequences_per_row(batches)
    assert max(per_row, default=0) <= n
    assert _documents(batches) == list(range(1, len(lengths) + 1))


def test_the_limit_binds_and_states_resume():
    lengths = [20] + [2] * 40
    capped = list(BalancedDocumentStream(_docs(lengths), seq_len=64, local_batch_size=1, max_sequences=4))
    assert max(_sequences_per_row(capped)) <= 4
    free = list(BalancedDocumentStream(_docs(lengths), seq_len=64, local_batch_size=1))
    assert max(_sequences_per_row(free)) > 4  # control: without it rows crowd
    s = BalancedDocumentStream(_docs(lengths), seq_len=64, local_batch_size=1, max_sequences=4)
    with pytest.raises(ValueError, match="max_sequences"):  # its plan key differs from a stream without the limit
        BalancedDocumentStream(_docs(lengths), seq_len=64, local_batch_size=1).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="a row holds 1 documents and a padding run but max_sequences=1"):
        list(BalancedDocumentStream(_docs(lengths), seq_len=64, local_batch_size=1, max_sequences=1))  # not cut
    filled = list(BalancedDocumentStream(_docs([65, 65]), seq_len=64, local_batch_size=1, max_sequences=1))
    assert _sequences_per_row(filled) == [1, 1]  # N=1 holds documents that fill their row
    old = BalancedDocumentStream(_docs(lengths), seq_len=64, local_batch_size=1).state_dict()
    assert "max_sequences" not in old["plan"]  # states saved before the option are unchanged


def test_bad_input_and_the_loader_config():
    for value, exc in ((0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(exc, match="max_sequences"):
            BalancedDocumentStream(_docs([4]), seq_len=8, local_batch_size=1, max_sequences=value)
    loader = pytest.importorskip("packkit.integrations.torchtitan.loader")
    config = loader.PackkitDataLoader.Config(source=_docs([20] + [2] * 40), infinite=False, max_sequences=3)
    built = config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=1,
                         snapshot_every_n_steps=1)
    assert built.stream.max_sequences == 3
    assert max(_sequences_per_row(list(built))) <= 3
