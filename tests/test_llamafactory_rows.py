"""packkit's LLaMA-Factory rows without LLaMA-Factory: one global plan, every example exactly once, rows in the order
accelerate's round-robin dealer (as LLaMA-Factory's trainer sets it up, a sequential sampler under the packkit hook)
needs, rows built field for field, argument errors. The LLaMA-Factory side is in tests/test_llamafactory.py."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, SequentialSampler

from packkit.integrations.llamafactory import build_rows, plan_rows
from packkit.integrations.llamafactory.rows import IGNORE_INDEX, MAX_SUB_SEQ_IDX

pytestmark = pytest.mark.full

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")
COST = (6.0 * 2048, 1.0)


def lognormal(n: int, median: float = 800, cap: int = 8192, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(rng.normal(np.log(median), 0.932, n))), 16, cap).astype(np.int64)


def dealt(num_rows: int, dp_size: int, per_rank: int) -> list[list[list[int]]]:
    """Each rank's batches of row indices: a sequential sampler, LLaMA-Factory's batch size, accelerate's
    ``BatchSamplerShard`` as the HF Trainer builds it (``even_batches=True``, ``drop_last=False``)."""
    batches = BatchSampler(SequentialSampler(range(num_rows)), per_rank, drop_last=False)
    return [list(accelerate_data_loader.BatchSamplerShard(batches, num_processes=dp_size, process_index=r))
            for r in range(dp_size)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 300), max_size=120), st.integers(1, 5), st.integers(1, 3), st.integers(0, 3),
       st.booleans())
def test_every_example_once_rows_fit(lengths, dp_size, per_rank, seed, shuffle):
    cutoff = 256
    p = plan_rows(lengths, cutoff, dp_size=dp_size, rows_per_rank=per_rank, cost="attention", seed=seed,
                  shuffle=shuffle)
    arr = np.asarray(lengths, dtype=np.int64)
    placed = sorted(i for row in p.rows for i in row)
    expected = sorted(set(range(len(arr))) - set(p.dropped.tolist()) - set(p.zero_length.tolist()))
    assert placed == expected  # each kept example in exactly one row
    assert sorted(p.dropped.tolist()) == [i for i, n in enumerate(lengths) if n > cutoff]
    assert sorted(p.zero_length.tolist()) == [i for i, n in enumerate(lengths) if n == 0]
    assert all(len(row) and arr[row].sum() <= cutoff for row in p.rows)


@pytest.mark.parametrize("dp_size,per_rank", [(4, 1), (3, 2)])
def test_round_robin_dealing_lands_each_row_on_its_planned_rank(dp_size, per_rank):
    lengths = lognormal(3000, median=400, cap=4096)
    p = plan_rows(lengths, 4096, dp_size=dp_size, rows_per_rank=per_rank, cost=COST, seed=1)
    per_step = dp_size * per_rank
    full_steps = len(p.rows) // per_step
    a, b = COST
    costs = np.array([a * lengths[r].sum() + b * (lengths[r].astype(float) ** 2).sum() for r in p.rows])
    ranks = dealt(len(p.rows), dp_size, per_rank)
    got = np.array([[costs[ranks[r][s]].sum() for r in range(dp_size)] for s in range(full_steps)])
    np.testing.assert_allclose(got, p.rank_costs[:full_steps], rtol=1e-12)
    balance = got.max(1).sum() / got.mean(1).sum()
    assert balance < 1.003
    # control: the same rows in a random order (what LLaMA-Factory's RandomSampler does) are far less level
    perm = np.random.default_rng(0).permutation(len(p.rows))
    shuffled = np.array([[costs[perm[ranks[r][s]]].sum() for r in range(dp_size)] for s in range(full_steps)])
    assert shuffled.max(1).sum() / shuffled.mean(1).sum() > balance + 0.02


def test_global_plan_fewer_rows_than_chunked_greedy_knapsack():
    lengths = lognormal(5000, median=800, cap=8192)
    p = plan_rows(lengths, 8192, dp_size=1, cost="tokens")
    chunked = sum(len(_greedy_knapsack(lengths[i:i + 1000].tolist(), 8192)) for i in range(0, len(lengths), 1000))
    assert len(p.rows) < chunked
    assert len(p.rows) == int(np.ceil(lengths.sum() / 8192))  # the lower bound here


def _greedy_knapsack(numbers, capacity):
    """LLaMA-Factory 0.9.5's ``greedy_knapsack`` (processor_utils.py), for the row count it reaches per chunk."""
    import bisect

    numbers.sort()
    out = []
    while numbers:
        room, row = capacity, []
        while True:
            i = bisect.bisect(numbers, room) - 1
            if i < 0:
                break
            room -= numbers[i]
            row.append(numbers.pop(i))
        out.append(row)
    return out


def test_shuffle_and_seed():
    lengths = lognormal(800, median=300, cap=2048)
    a = plan_rows(lengths, 2048, dp_size=2, seed=0)
    assert [list(r) for r in a.rows] == [list(r) for r in plan_rows(lengths, 2048, dp_size=2, seed=0).rows]
    assert [list(r) for r in a.rows] != [list(r) for r in plan_rows(lengths, 2048, dp_size=2, seed=1).rows]


def test_build_rows_columns():
    examples = {"input_ids": [[5, 6, 7], [8, 9], [1]], "labels": [[IGNORE_INDEX, 6, 7], [IGNORE_INDEX, 9], [1]],
                "images": [["a.png"], None, []], "videos": [None, None, None], "audios": [None, None, None]}
    neat = build_rows(examples, [[1, 0], [2]], cutoff_len=6, neat_packing=True, pad_token_id=0)
    assert neat["input_ids"][0] == [8, 9, 5, 6, 7, 0, 0]
    assert neat["attention_mask"][0] == [1, 1, 2, 2, 2, 0, 0]
    assert neat["position_ids"][0] == [0, 1, 0, 1, 2, 0, 0]
    assert neat["labels"][0] == [IGNORE_INDEX, 9, IGNORE_INDEX, 6, 7, IGNORE_INDEX, IGNORE_INDEX]
    assert neat["images"] == [["a.png"], None] and neat["videos"] == [None, None]
    assert neat["packing_params"][0] == {"sequence_boundaries": [0, 2, 5, 7], "image_subseq_ids": [1],
                                         "video_subseq_ids": [MAX_SUB_SEQ_IDX], "audio_subseq_ids": [MAX_SUB_SEQ_IDX],
                                         "right_padding_length": 2}
    plain = build_rows(examples, [[1, 0]], cutoff_len=6, neat_packing=False, pad_token_id=0)
    assert plain["attention_mask"][0] == [1] * 7 and "packing_params" not in plain
    with pytest.raises(ValueError, match="more than cutoff_len=4"):
        build_rows(examples, [[1, 0]], cutoff_len=4, neat_packing=True, pad_token_id=0)
    bad = dict(examples, labels=[[1], [1, 2], [1]])
    with pytest.raises(ValueError, match="example 0: labels"):
        build_rows(bad, [[0]], cutoff_len=6, neat_packing=True, pad_token_id=0)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(cutoff_len=0), ValueError, "cutoff_len must be >= 1"),
    (dict(cutoff_len=8.0), TypeError, "cutoff_len must be an int"),
    (dict(dp_size=0), ValueError, "dp_size must be >= 1"),
    (dict(rows_per_rank=True), TypeError, "rows_per_rank must be an int"),
    (dict(seed="1"), TypeError, "seed must be an int"),
    (dict(shuffle=1), TypeError, "shuffle must be a bool"),
    (dict(cost="flops"), ValueError, "unknown cost 'flops'"),
])
def test_argument_errors(kwargs, error, match):
    args = dict(lengths=[3, 4], cutoff_len=8) | kwargs
    with pytest.raises(error, match=match):
        plan_rows(args.pop("lengths"), args.pop("cutoff_len"), **args)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(dp_size=0), ValueError, "dp_size must be None or an int >= 1"),
    (dict(seed=-1), ValueError, "seed must be None or an int >= 0"),
    (dict(shuffle="yes"), TypeError, "shuffle must be a bool"),
    (dict(cost="flops"), ValueError, "unknown cost 'flops'"),
])
def test_install_argument_errors(kwargs, error, match):
    from packkit.integrations.llamafactory import install

    with pytest.raises(error, match=match):  # refused before LLaMA-Factory is imported or patched
        install(**kwargs)


def test_install_without_llamafactory_names_the_install():
    import importlib.util

    from packkit.integrations.llamafactory import install

    if importlib.util.find_spec("llamafactory") is not None:
        pytest.skip("llamafactory is installed here")
    with pytest.raises(ImportError, match="needs llamafactory==0.9.5"):
        install()
