"""Issue 57 part 3: the trainer plugins' planners (no framework import) refuse bad arguments by name, found when the
API fuzzer registered them: a batch_size that hung ms-swift's plan_buffer (a loop over batch_size), bools read as
ints, rows-per-step bounds named as the planner's dp_size, a cost callable's None read as NaN costs."""
from __future__ import annotations

import time

import numpy as np
import pytest

from packkit.integrations import llamafactory as lf
from packkit.integrations import swift as sw
from packkit.integrations.axolotl import MultipackBatchSampler

pytestmark = pytest.mark.core

L = [5, 3, 7, 2, 6]
PAIRS = [(f"s{i}", n) for i, n in enumerate(L)]


def _buffer(**kw):
    args = dict(data=list(PAIRS), packing_length=10, finished=True, dp_size=2, batch_size=1, cost="attention",
                algorithm="obfd")
    return sw.plan_buffer(**{**args, **kw})


def test_plan_buffer_batch_size_bounded_by_the_data():
    start = time.process_time()
    rows, carry = _buffer(batch_size=2**23)  # was a loop of dp_size * batch_size iterations (hung at 2**31)
    assert time.process_time() - start < 0.5
    assert sorted(s for row in rows for s, _ in row) + [s for s, _ in carry] == sorted(s for s, _ in PAIRS)
    with pytest.raises(ValueError, match=r"batch_size must be <= 16777216"):
        _buffer(batch_size=2**31)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(batch_size=0), ValueError, r"batch_size must be >= 1"),  # was ZeroDivisionError
    (dict(batch_size=2.5), TypeError, r"batch_size must be an int, got float"),
    (dict(finished="no"), TypeError, r"finished must be a bool"),
    (dict(shuffle=1), TypeError, r"shuffle must be a bool"),
    (dict(packing_length=10.5), TypeError, r"packing_length must be an int"),  # was the planner's 'capacity'
    (dict(packing_length="10"), TypeError, r"packing_length must be an int"),
    (dict(algorithm="ffd"), ValueError, r"algorithm must be one of 'obfd', 'ogbfd'"),
    (dict(data=[1, 2]), TypeError, r"data must be a list of \(sample, length\) pairs"),
])
def test_plan_buffer_arguments_named(kw, exc, match):
    with pytest.raises(exc, match=match):
        _buffer(**kw)


def test_plan_packed_idx_packing_length_named():
    with pytest.raises(ValueError, match=r"packing_length must be <= 9223372036854775807"):  # was 'capacity'
        sw.plan_packed_idx(L, 2**64)
    assert sw.plan_packed_idx(L, 10, dp_size=2).dp_size == 2


def test_plan_rows_rows_per_step_named():
    with pytest.raises(ValueError, match=r"dp_size \* rows_per_rank = 2 \* 262144 = 524288 rows per step"):
        lf.plan_rows(L, 10, dp_size=2, rows_per_rank=2**18)  # was "dp_size=524288 is more than 65536"
    with pytest.raises(ValueError, match=r"seed must be >= 0"):  # was numpy's "expected non-negative integer"
        lf.plan_rows(L, 10, seed=-1)
    assert len(lf.plan_rows(L, 10, dp_size=2).rows) >= 2


def _sampler(**kw):
    args = dict(sampler=range(len(L)), batch_size=1, batch_max_len=10, lengths=np.asarray(L), bin_size=None,
                dp_size=2)
    return MultipackBatchSampler(**{**args, **kw})


@pytest.mark.parametrize("kw, exc, match", [
    (dict(bin_size=False), TypeError, r"bin_size must be a positive int, 0 or None"),  # False was "no cap"
    (dict(safe_mode=1), TypeError, r"safe_mode must be a bool"),
    (dict(mp_start_method=3), ValueError, r"mp_start_method must be one of 'fork', 'spawn', 'forkserver'"),
    (dict(packing_efficiency_estimate=float("nan")), ValueError, r"packing_efficiency_estimate must be a finite"),
    (dict(num_count_samples=True), TypeError, r"num_count_samples must be an int, got bool"),
    (dict(sampler=5), TypeError, r"sampler must be a torch Sampler or an iterable"),
    (dict(batch_size=2**18), ValueError, r"dp_size \* batch_size = 2 \* 262144 = 524288 rows per step is more than 65536"),
])
def test_multipack_sampler_arguments_named(kw, exc, match):
    with pytest.raises(exc, match=match):
        list(_sampler(**kw))


def test_multipack_sampler_cost_callback_checked():
    with pytest.raises((ValueError, TypeError), match=r"cost"):
        list(_sampler(cost=lambda x: None))  # np.asarray(None, float64) was a NaN cost
    with pytest.raises(ValueError, match=r"cost callable .*shape"):
        list(_sampler(cost=lambda x: np.asarray(x, float)[:-1]))
    assert len(list(_sampler(cost=lambda x: np.asarray(x, float) ** 2))) >= 2


def test_multipack_sampler_takes_axolotls_unset_config_keys():
    """axolotl's calculate_total_num_steps passes cfg.sample_packing_group_size and friends, None when unset (CI's
    axolotl entry-point run raised 'group_size must be an int, got NoneType None'); None is the default there."""
    want = [list(map(list, b)) for b in _sampler()]
    got = _sampler(group_size=None, num_count_samples=None, packing_efficiency_estimate=None, sequential=None,
                   num_processes=None, safe_mode=None)
    assert [list(map(list, b)) for b in got] == want
