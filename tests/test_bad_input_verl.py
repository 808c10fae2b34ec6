"""Issue 57 part 3: verl's entry points name the real cause of bad input (verl's own function raises a KeyError
without attention_mask and an IndexError with min_num_micro_batch above the rows)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl.utils.seqlen_balancing")
from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402

from packkit.integrations import verl as pv  # noqa: E402

pytestmark = pytest.mark.full


def _batch(n=8, s=16):
    mask = (torch.arange(s)[None, :] < torch.arange(4, 4 + n)[:, None]).long()
    return TensorDict({"input_ids": torch.randint(1, 100, (n, s)) * mask, "attention_mask": mask}, batch_size=[n])


def test_rearrange_without_attention_mask_named():
    td = _batch()
    del td["attention_mask"]
    with pytest.raises(ValueError, match=r"rearrange_micro_batches needs batch\['attention_mask'\]"):
        pv.rearrange_micro_batches(td, 64)


def test_min_micro_batches_above_rows_gives_empty_ones():
    micro, idx = pv.rearrange_micro_batches(_batch(8), 64, min_num_micro_batch=20)
    assert len(micro) >= 20 and sorted(i for part in idx for i in part) == list(range(8))


def test_balance_batch_without_attention_mask_named():
    td = _batch()
    del td["attention_mask"]
    with pytest.raises(ValueError, match=r"balance_batch needs batch.batch\['attention_mask'\] .* the batch has "
                                         r"\['input_ids'\]"):  # was KeyError
        pv.balance_batch(DataProto(batch=td), 2, 64)
    with pytest.raises(TypeError, match=r"batch must be a verl DataProto"):
        pv.balance_batch(_batch(), 2, 64)  # a TensorDict, not a DataProto
    with pytest.raises(ValueError, match=r"attention_mask'\] is a meta tensor"):
        pv.balance_batch(DataProto(batch=_batch().to("meta")), 2, 64)
    with pytest.raises(TypeError, match=r"metrics must be a dict"):
        pv.balance_batch(DataProto(batch=_batch()), 2, 64, metrics=[])
    plan = pv.balance_batch(DataProto(batch=_batch()), 2, 64)
    assert plan.dp_size == 2


@pytest.mark.parametrize("bad, match", [(lambda x: x + 1j, "complex"), (lambda x: x[:-1], "shape"),
                                        (lambda x: x * float("nan"), "non-finite"), (lambda x: -x - 1, "negative")])
def test_balance_batch_cost_callback_named(bad, match):
    with pytest.raises(ValueError, match=r"cost callable.*" + match):
        pv.balance_batch(DataProto(batch=_batch()), 2, 64, cost=bad)
