"""The verl drop-in (packkit.integrations.verl) against verl 0.9.1's own rearrange_micro_batches on the same
batches: return format, coverage, the token cap, every documented argument; and the global balancing step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

sb = pytest.importorskip("verl.utils.seqlen_balancing")
from tensordict import TensorDict  # noqa: E402

from packkit.integrations import verl as pv  # noqa: E402

pytestmark = pytest.mark.full

PROMPT, S = 600, 3000


def make_batch(n, seed=0, nested=False):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(50, PROMPT + 1, n)
    response = np.minimum(np.exp(rng.normal(np.log(500), 0.9, n)).astype(np.int64) + 1, S - PROMPT)
    cols = torch.arange(S)
    mask = ((cols >= torch.from_numpy(PROMPT - prompt)[:, None]) &
            (cols < torch.from_numpy(PROMPT + response)[:, None])).long()
    ids = torch.randint(1, 1000, (n, S), generator=torch.Generator().manual_seed(seed)) * mask
    return TensorDict({"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:],
                       "old_log_probs": torch.randn(n, S - PROMPT, generator=torch.Generator().manual_seed(1))},
                      batch_size=[n])


def check(batch, micro, index_lists, cap):
    n = batch.batch_size[0]
    assert isinstance(micro, list) and isinstance(index_lists, list) and len(micro) == len(index_lists)
    assert sorted(i for idx in index_lists for i in idx) == list(range(n))
    for mb, idx in zip(micro, index_lists):
        assert isinstance(mb, TensorDict) and all(type(i) is int for i in idx)
        assert (mb == batch[idx]).all()
        assert int(batch["attention_mask"][idx].sum()) <= cap


KWARGS = [{}, {"min_num_micro_batch": 13}, {"num_batches_divided_by": 4}, {"use_dynamic_bsz_balance": False},
          {"force_group_size": 4}]


@pytest.mark.parametrize("kwargs", KWARGS, ids=lambda k: ",".join(k) or "default")
def test_dropin_matches_verl_format_coverage_and_cap(kwargs):
    batch = make_batch(96)
    cap = 8192
    ref_micro, ref_idx = sb.rearrange_micro_batches(batch, cap, **kwargs)
    micro, idx = pv.rearrange_micro_batches(batch, cap, **kwargs)
    check(batch, ref_micro, ref_idx, cap)
    check(batch, micro, idx, cap)
    assert set(micro[0].keys()) == set(ref_micro[0].keys())
    if "min_num_micro_batch" in kwargs:
        assert len(micro) >= kwargs["min_num_micro_batch"]
    if "num_batches_divided_by" in kwargs:
        assert len(micro) % kwargs["num_batches_divided_by"] == 0
    if "force_group_size" in kwargs:
        g = kwargs["force_group_size"]
        for part in idx:  # consecutive groups stay together
            assert {i // g for i in part} == {i // g for i in part if i % g == 0}
            assert len(part) % g == 0
    else:
        assert len(micro) <= len(ref_micro)  # never more micro-batches than verl


def test_dropin_errors_like_verl():
    batch = make_batch(8)
    with pytest.raises(ValueError, match="max_token_len must be greater"):
        pv.rearrange_micro_batches(batch, S - 1)
    with pytest.raises(ValueError, match="divisible by force_group_size"):
        pv.rearrange_micro_batches(batch, S, force_group_size=3)


def test_balance_batch_plans_every_rank_and_dispatch_follows_it():
    from verl import DataProto

    n, dp, cap = 128, 4, 8192
    td = make_batch(n, seed=2)
    data = DataProto.from_dict(tensors=dict(td.items()))
    original = data.batch["input_ids"].clone()
    metrics = {}
    plan = pv.balance_batch(data, dp, cap, metrics=metrics)
    assert plan.num_micro_batches <= plan.rank_bound + 2 and metrics
    assert not torch.equal(original, data.batch["input_ids"])  # reordered in place
    chunks = data.chunk(dp)  # verl's equal-chunk dispatch
    counts = []
    for rank, chunk in enumerate(chunks):
        micro, idx = pv.rearrange_micro_batches(chunk.batch, cap)
        check(chunk.batch, micro, idx, cap)
        counts.append(len(micro))
        tokens = sorted(int(chunk.batch["attention_mask"][p].sum()) for p in idx)
        assert tokens == sorted(plan.tokens[:, rank].tolist())  # the rank's micro-batches are the global plan's
    assert len(set(counts)) == 1 == len({plan.num_micro_batches} | set(counts))


def test_recorded_plan_is_ignored_when_it_breaks_this_cap():
    from verl import DataProto

    data = DataProto.from_dict(tensors=dict(make_batch(32, seed=4).items()))
    pv.balance_batch(data, 2, 8192)
    chunk = data.chunk(2)[0]
    micro, idx = pv.rearrange_micro_batches(chunk.batch, 4096)  # a smaller cap than the plan's: re-planned
    check(chunk.batch, micro, idx, 4096)
