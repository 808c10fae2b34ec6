"""Issue 39 §2, continued: resume states that do not match are refused, and the adversarial pass over the core
APIs' arguments (exception types, dtypes, allocations out of proportion). See tests/test_core_inputs.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packkit
from packkit import PackedBatchSampler, PackedIterableDataset, PackingCollator, pack_sequences
from packkit.packing.checks import MAX_PADDING_TOKENS

pytestmark = pytest.mark.core

LENGTHS = np.random.default_rng(0).integers(1, 60, 200)


# -- PackedBatchSampler: the fingerprint covers context_parallel and a callable cost ---------------------------
def test_sampler_state_of_another_cp_setting_is_refused():
    saved = PackedBatchSampler(LENGTHS, 64, rank=0, world_size=2, context_parallel=(2, 0))
    it = iter(saved)
    done = [next(it) for _ in range(3)]
    state = saved.state_dict()
    for other in (None, (4, 0), (2, 0, "contiguous")):
        with pytest.raises(ValueError, match="context_parallel: saved"):
            PackedBatchSampler(LENGTHS, 64, rank=0, world_size=2, context_parallel=other).load_state_dict(state)
    # Control: another rank of the same CP group resumes with exactly the rest of the epoch.
    resumed = PackedBatchSampler(LENGTHS, 64, rank=0, world_size=2, context_parallel=(2, 1))
    resumed.load_state_dict(state)
    assert done + list(resumed) == saved.batches()


def test_sampler_state_of_another_cost_callable_is_refused():
    def sampler(cost):
        return PackedBatchSampler(LENGTHS, 64, rank=0, world_size=2, cost=cost)

    state = sampler(lambda x: x.astype(float) ** 2).state_dict()
    with pytest.raises(ValueError, match="cost: saved 'callable:.*<lambda>:[0-9a-f]+', now"):
        sampler(lambda x: x.astype(float)).load_state_dict(state)
    sampler(lambda x: x.astype(float) ** 2).load_state_dict(state)  # the same costs: accepted
    with pytest.raises(ValueError, match="state\\['config'\\] must be the dict"):
        sampler("tokens").load_state_dict({**state, "config": None})


def test_sampler_rows_per_step_beyond_the_planner_is_named():
    with pytest.raises(ValueError, match="world_size \\* rows_per_step"):
        PackedBatchSampler(LENGTHS, 64, rank=0, world_size=2, rows_per_step=10**9)


# -- PackedIterableDataset: a tampered state is refused ------------------------------------------------------
EXAMPLES = [{"input_ids": list(range(1, n + 1))} for n in np.random.default_rng(1).integers(1, 30, 60).tolist()]


def _state(**kwargs):
    ds = PackedIterableDataset(EXAMPLES, 32, buffer_size=8, **kwargs)
    it = iter(ds)
    next(it)
    return ds.state_dict()


def test_streaming_state_with_duplicate_or_unread_pieces_is_refused():
    state = _state()
    assert state["ready"], "the test needs pending ready rows"
    piece = state["ready"][0][0]
    ds = PackedIterableDataset(EXAMPLES, 32, buffer_size=8)
    with pytest.raises(ValueError, match="twice"):
        ds.load_state_dict({**state, "ready": state["ready"] + [[piece]]})
    with pytest.raises(ValueError, match="but next_position is"):
        ds.load_state_dict({**state, "ready": state["ready"] + [[[state["next_position"], 0]]]})
    with pytest.raises(ValueError, match="non-negative ints"):
        ds.load_state_dict({**state, "stats": {"items": float("nan")}})
    with pytest.raises(ValueError, match="must be a list of rows"):
        ds.load_state_dict({**state, "ready": 5})
    sharded = _state(rank=0, world_size=2)
    with pytest.raises(ValueError, match="not in shard 0 of 2"):
        ds.load_state_dict({**sharded, "ready": [[[1, 0]]]})
    # Control: the untouched state resumes with every example exactly once.
    ds.load_state_dict(state)
    rest = list(ds)
    assert rest


@pytest.mark.parametrize("as_stream", [False, True])
def test_streaming_state_past_the_source_is_refused(as_stream):
    state = _state()
    source = (lambda: iter(EXAMPLES)) if as_stream else EXAMPLES
    ds = PackedIterableDataset(source, 32, buffer_size=8)
    ds.load_state_dict({**state, "next_position": 10**9})
    with pytest.raises(ValueError, match="next_position is 1000000000 but the (source has|source ended after) 60"):
        list(ds)


def test_streaming_state_of_another_cp_padding_is_refused():
    state = _state()
    with pytest.raises(ValueError, match="padded to multiples of 1"):
        PackedIterableDataset(EXAMPLES, 32, buffer_size=8, context_parallel=(2, 0)).load_state_dict(state)
    cp_state = _state(context_parallel=(2, 0))
    PackedIterableDataset(EXAMPLES, 32, buffer_size=8, context_parallel=(2, 1)).load_state_dict(cp_state)


# -- adversarial pass: exception types, dtypes, sizes --------------------------------------------------------
BIG = 10**9


@pytest.mark.parametrize("call", [
    lambda: pack_sequences([[1, 2]], capacity=BIG, layout="padded"),
    lambda: pack_sequences([[1, 2]], row_len=BIG),
    lambda: pack_sequences([[1, 2]], plan=packkit.plan([2], 2), layout="padded", row_len=2, num_rows=BIG),
    lambda: PackingCollator(pad_to_multiple_of=BIG)([{"input_ids": [1, 2]}]),
    lambda: PackingCollator(BIG, layout="padded", pad_to_capacity=False, pad_to_multiple_of=BIG)([{"input_ids": [1]}]),
    lambda: PackingCollator(8, layout="padded", num_rows=2**25, pad_to_capacity=False)([{"input_ids": [1, 2]}]),
    lambda: packkit.unpack_sequences(torch.zeros(1, 2), pack_sequences([[1, 2]], return_info=True)[1], padded=True,
                                     max_len=BIG),
], ids=["capacity", "row_len", "num_rows", "pad_to_multiple_of", "collator-capacity", "static-rows",
        "unpack-max_len"])
def test_padding_out_of_proportion_is_refused_before_allocating(call):
    with pytest.raises(ValueError, match="refuses more than"):
        call()


@pytest.mark.parametrize("call", [
    lambda: PackingCollator(BIG, layout="padded"),
    lambda: PackingCollator(2**20, layout="padded", num_rows=2**10),
    lambda: PackedIterableDataset(EXAMPLES, BIG),
    lambda: PackedIterableDataset(EXAMPLES, 2**20, rows_per_item=2**6),
])
def test_static_shapes_that_a_small_batch_would_fail_are_refused_at_construction(call):
    with pytest.raises(ValueError, match="would be refused as padding out of proportion"):
        call()


def test_static_shapes_within_the_padding_limit_still_work():
    rows = MAX_PADDING_TOKENS // 2**18  # 64 rows of 16384 (1M tokens), all padding but one: within the limit
    batch = PackingCollator(2**14, layout="padded", num_rows=rows)([{"input_ids": [1, 2]}])
    assert batch["input_ids"].shape == (rows, 2**14)


def _unpack_int(pad_value):
    batch, info = pack_sequences([[1, 2]], return_info=True)
    return packkit.unpack_sequences(batch["input_ids"], info, pad_value=pad_value)


@pytest.mark.parametrize("call, error, match", [
    (lambda: pack_sequences([torch.tensor([1.0, 2.0])]), TypeError, "integer tensor"),
    (lambda: pack_sequences([torch.tensor([True, False])]), TypeError, "integer tensor"),
    (lambda: pack_sequences([torch.tensor([1, 2], dtype=torch.uint64)]), TypeError, "integer tensor"),
    (lambda: pack_sequences([[1, 2]], labels=[torch.tensor([1.5, 2.7])]), TypeError, "labels must be an integer"),
    (lambda: PackingCollator()([{"input_ids": [1, 2], "labels": torch.tensor([1.5, 2.5])}]), TypeError, "labels"),
    (lambda: PackingCollator()([{"input_ids": [1, 2], "labels": torch.tensor([True, False])}]), TypeError, "labels"),
    (lambda: packkit.shard_context_parallel({**pack_sequences([[1, 2, 3]]), "labels": torch.ones(1, 3)}, 2, 0),
     TypeError, "batch\\['labels'\\]"),
    (lambda: pack_sequences([[1, 2]], pad_token_id=1.5, capacity=4, layout="padded"), TypeError, "pad_token_id"),
    (lambda: pack_sequences([[1, 2]], ignore_index=1.5), TypeError, "ignore_index"),
    (lambda: pack_sequences([[1, 2]], mask_first_label="no"), TypeError, "mask_first_label"),
    (lambda: PackingCollator(separator_id=1.5), TypeError, "separator_id"),
    (lambda: PackingCollator(ignore_index=5), ValueError, "separator_id=ignore_index"),
    (lambda: PackingCollator(return_num_items="yes"), TypeError, "return_num_items"),
    (lambda: PackingCollator(device="bogus"), ValueError, "device='bogus'"),
    (lambda: pack_sequences(torch.tensor([1, 2, 3]), [4, -1]), ValueError, "lengths must be >= 0"),
    (lambda: pack_sequences([[1, 2], [3]], lengths=[2, 1]), TypeError, "with lengths=, pass all tokens as one flat"),
    (lambda: packkit.unpack_sequences(torch.zeros(1, 2), {}), TypeError, "PackInfo"),
    (lambda: packkit.unpack_sequences([[0.0, 0.0]], pack_sequences([[1, 2]], return_info=True)[1]), TypeError,
     "must be a tensor"),
    (lambda: packkit.shard_context_parallel(pack_sequences([[1, 2]]), 2, 0, return_info="yes"), TypeError,
     "return_info"),
    (lambda: PackedIterableDataset(EXAMPLES, 32, pad_token_id=-1), ValueError, "pad_token_id"),
    (lambda: PackedIterableDataset(EXAMPLES, 32, mask_first_label="no"), TypeError, "mask_first_label"),
    (lambda: next(iter(PackedIterableDataset([{"input_ids": [1, 2], "shift_labels": [2, -100]}], 32,
                                             context_parallel=(2, 0)))), ValueError, "'shift_labels' would be replaced"),
    (lambda: next(iter(PackedIterableDataset([{"input_ids": [1, 2], "example_ids": [0, 0]}], 32,
                                             return_example_ids=True))), ValueError, "'example_ids' would be replaced"),
    (lambda: next(iter(PackedIterableDataset(EXAMPLES[:3] + [{"input_ids": [4, -1]}], 32))), ValueError,
     "example 3: token id -1 is negative"),
    # values a cast would silently change (they raised a RuntimeError from the C++ op, or were truncated)
    (lambda: pack_sequences([torch.tensor([1, 2], dtype=torch.int32)], capacity=4, layout="padded",
                            pad_token_id=2**40), ValueError, "pad_token_id=1099511627776 cannot be stored"),
    (lambda: pack_sequences([[1, 2]], capacity=4, layout="padded", fields={"m": [[1, 1]]}, pad_values={"m": 1.5}),
     ValueError, "pad_values\\['m'\\]=1.5"),
    (lambda: packkit.pack_context_parallel([[1, 2, 3]], 2, 0, fields={"m": [[1, 1, 1]]}, pad_values={"m": 1.5}),
     ValueError, "pad_values\\['m'\\]=1.5"),
    (lambda: PackingCollator(separator_id=2**40)([{"input_ids": torch.tensor([1, 2], dtype=torch.int32)}]),
     ValueError, "separator_id=1099511627776"),
    (lambda: _unpack_int(1.5), ValueError, "pad_value=1.5 cannot be stored"),
    (lambda: packkit.shard_context_parallel({**pack_sequences([[1, 2, 3]]), "position_ids": torch.ones(1, 3) / 2}, 2,
                                            0), TypeError, "position_ids"),
])
def test_bad_arguments_raise_the_right_type(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_shard_is_not_sharded_again():
    shard = packkit.shard_context_parallel(pack_sequences([[1, 2, 3], [4, 5]]), 2, 0)
    with pytest.raises(ValueError, match="already has 'shift_labels'"):
        packkit.shard_context_parallel(shard, 2, 0)


def test_unshard_checks_each_ranks_part():
    batch = pack_sequences([[1, 2, 3], [4, 5]])
    _, info = packkit.shard_context_parallel(batch, 2, 0, return_info=True)
    with pytest.raises(ValueError, match="rank 1's output must be"):
        packkit.unshard_context_parallel([torch.zeros(info.local_len), torch.zeros(info.local_len + 1)], info)


def test_narrow_integer_ids_are_widened_not_refused():
    for dtype in (torch.int8, torch.int16, torch.uint8):
        batch = pack_sequences([torch.tensor([1, 2, 3], dtype=dtype)])
        assert batch["input_ids"].tolist() == [[1, 2, 3]] and batch["input_ids"].dtype == torch.int64


def test_sampler_metrics_stay_finite_or_refuse():
    """Item costs that are each finite can overflow when a row sums them: balance would be NaN."""
    huge = PackedBatchSampler(np.arange(1, 50), 64, rank=0, world_size=2, cost=lambda x: np.full(len(x), 1e308))
    with pytest.raises(ValueError, match="overflow float64"):
        huge.balance
    ok = PackedBatchSampler(np.arange(1, 50), 64, rank=0, world_size=2, cost=lambda x: np.full(len(x), 1e300))
    assert np.isfinite(ok.balance) and np.isfinite(ok.rank_balance)
    zero = PackedBatchSampler(np.arange(1, 50), 64, rank=0, world_size=2, cost=lambda x: np.zeros(len(x)))
    assert zero.balance == 1.0 and zero.rank_balance == 1.0


def test_cp_padded_lengths_refuses_floats_and_negatives():
    from packkit.context_parallel import cp_padded_lengths

    with pytest.raises(TypeError):
        cp_padded_lengths([1.5, 2], 2)
    with pytest.raises(ValueError, match=">= 0"):
        cp_padded_lengths([-3, 2], 2)
    assert cp_padded_lengths([1, 5], 2).tolist() == [4, 8]
