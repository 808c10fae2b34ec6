"""packkit's axolotl ``MultipackBatchSampler`` without axolotl: each index once per epoch, items in the order
accelerate's round-robin dealer needs, ``len`` exact, epochs, resume, argument errors. The dealing is
accelerate's own ``BatchSamplerShard`` with ``drop_last=True`` and ``even_batches=False``, as axolotl sets them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from packkit.integrations.axolotl import MultipackBatchSampler
from packkit.integrations.axolotl.fill import fill_last_step

pytestmark = pytest.mark.full

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")


def lognormal(n: int, median: float = 800, cap: int = 8192, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(rng.normal(np.log(median), 0.932, n))), 16, cap).astype(np.int64)


class Identity:
    """A dataset that, like a Hugging Face Dataset, takes a list of indices (one bin) as a key."""

    def __getitem__(self, key):
        return key


def make(lengths, capacity, *, dp_size, batch_size=1, bin_size=None, sequential=False, cost=(6 * 4096, 1), seed=0,
         sampler=None):
    if sampler is None:  # torch's RandomSampler refuses an empty range; a list is a sampler too
        sampler = RandomSampler(range(len(lengths))) if len(lengths) else []
    return MultipackBatchSampler(sampler, batch_size, capacity, lengths, bin_size, sequential=sequential,
                                 dp_size=dp_size, cost=cost, seed=seed)


def dealt(sampler, dp_size):
    """Each rank's items as accelerate deals them in axolotl (drop_last from the sampler, even_batches=False)."""
    return [list(accelerate_data_loader.BatchSamplerShard(sampler, num_processes=dp_size, process_index=r,
                                                          even_batches=False)) for r in range(dp_size)]


def dealt_costs(lengths, ranks, cost):
    a, b = cost
    f = lambda row: a * lengths[row].sum() + b * (lengths[row].astype(np.float64) ** 2).sum()  # noqa: E731
    return np.array([[sum(f(row) for row in item) for item in rank] for rank in ranks], dtype=np.float64).T


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(4, 120).flatmap(lambda cap: st.tuples(st.just(cap), st.lists(st.integers(0, cap * 2), max_size=70))),
       st.integers(1, 4), st.integers(1, 3), st.sampled_from([None, 3, 10]), st.booleans(), st.integers(0, 3))
def test_each_index_once_rows_fit_dealt_as_planned(case, dp_size, batch_size, bin_size, sequential, epoch):
    capacity, lengths = case
    lengths = np.asarray(lengths, dtype=np.int64)
    s = make(lengths, capacity, dp_size=dp_size, batch_size=batch_size, bin_size=bin_size, sequential=sequential)
    s.set_epoch(epoch)
    n = len(s)
    items = list(s)
    assert n == len(items) and n % dp_size == 0
    flat = [i for item in items for row in item for i in row]
    # every index exactly once, or (degenerate: every row holds one sample) in the reported dropped last step
    assert sorted(flat + s.dropped_last.tolist()) == list(range(len(lengths)))
    for item in items:
        assert len(item) == batch_size and all(len(row) for row in item)  # axolotl's collator needs a sample
        for row in item:
            over = [i for i in row if lengths[i] > capacity]
            assert (over == row and len(row) == 1) if over else lengths[row].sum() <= capacity  # axolotl's rule
            assert bin_size is None or len(row) <= bin_size
    assert sorted(s.overlong.tolist()) == np.flatnonzero(lengths > capacity).tolist()
    # accelerate deals item s*W + r to rank r and loses none of them
    ranks = dealt(s, dp_size)
    assert [len(r) for r in ranks] == [n // dp_size] * dp_size
    assert all(ranks[r] == items[r::dp_size] for r in range(dp_size))
    np.testing.assert_allclose(dealt_costs(lengths, ranks, (6 * 4096, 1)), s.rank_costs, rtol=1e-12)
    if sequential:  # axolotl's sample_packing_sequentially: the sampler's order kept
        assert flat == sorted(flat)


def test_dealt_steps_balanced_and_control():
    lengths = lognormal(20_000)
    s = make(lengths, 8192, dp_size=8)
    ranks = dealt(s, 8)
    costs = dealt_costs(lengths, ranks, (6 * 4096, 1))
    balance = costs.max(axis=1).sum() / costs.mean(axis=1).sum()
    assert balance == pytest.approx(s.balance, rel=1e-12) and balance <= 1.002
    # control: the same rows emitted rank-major (each rank's rows one after another) are dealt off-plan
    items = s.generate_batches()
    steps = len(items) // 8
    rank_major = [items[st * 8 + r] for r in range(8) for st in range(steps)]
    wrong = [rank_major[r::8] for r in range(8)]
    off = dealt_costs(lengths, wrong, (6 * 4096, 1))
    assert off.max(axis=1).sum() / off.mean(axis=1).sum() > 1.01


def test_len_exact_cheap_and_the_same_for_every_seed_and_epoch():
    """axolotl's LR-schedule count builds a second sampler (fresh RandomSampler): its len must be the trainer's."""
    lengths = lognormal(5_000, median=3000, cap=32768)
    first = make(lengths, 32768, dp_size=4, bin_size=200)
    n = len(first)
    for seed in (0, 7):
        for epoch in (0, 1, 5):
            other = make(lengths, 32768, dp_size=4, bin_size=200, seed=seed)
            other.set_epoch(epoch)
            assert len(other) == n == len(list(other))
    assert len(first.generate_batches()) == n


def test_set_epoch_reaches_through_accelerate_and_changes_the_order():
    lengths = lognormal(3_000)
    s = make(lengths, 8192, dp_size=2)
    loader = accelerate_data_loader.DataLoaderShard(list(range(len(lengths))), batch_sampler=s,
                                                    collate_fn=lambda x: x)
    before = s.generate_batches()
    loader.set_epoch(3)
    assert s.epoch == 3 and s.generate_batches() != before
    assert sorted(i for it in s.generate_batches() for r in it for i in r) == list(range(len(lengths)))


def test_resume_mid_epoch():
    lengths = lognormal(4_000)
    s = make(lengths, 8192, dp_size=4, seed=3)
    s.set_epoch(2)
    it = iter(s)
    head = [next(it) for _ in range(12)]
    state = s.state_dict()
    again = make(lengths, 8192, dp_size=4, seed=3)
    again.load_state_dict(state)
    assert head + list(again) == list(make(lengths, 8192, dp_size=4, seed=3).__class__.generate_batches(s))
    with pytest.raises(ValueError, match="does not match"):
        make(lengths, 8192, dp_size=2, seed=3).load_state_dict(state)


def test_dataloader_and_sequential_sampler_keep_order():
    lengths = lognormal(500)
    for sequential in (False, True):  # eval's SequentialSampler: not shuffled; sequential=True: order kept
        s = make(lengths, 8192, dp_size=2, sampler=SequentialSampler(range(500)), sequential=sequential)
        assert not s.shuffle
        loader = DataLoader(Identity(), batch_sampler=s, collate_fn=lambda x: x)  # dataset[bin] as a HF Dataset
        flat = [i for item in loader for row in item for i in row]
        assert (flat if sequential else sorted(flat)) == list(range(500))


def test_fill_splits_last_step_rows_then_borrows_then_drops():
    lengths = np.array([5, 5, 5, 5, 1, 1], dtype=np.int64)
    cost = lambda x: x.astype(np.float64)  # noqa: E731
    # last step: one row of three samples and one empty row -> split
    steps, dropped = fill_last_step([[[[0]], [[1]]], [[[2, 4, 5]], [[]]]], lengths, cost)
    assert dropped == [] and sorted(steps[1][0][0] + steps[1][1][0]) == [2, 4, 5]
    assert all(steps[1][r][0] for r in (0, 1))
    # last step rows hold one sample each: borrow the cheapest sample of the fullest earlier row
    steps, dropped = fill_last_step([[[[0, 4, 5]], [[1]]], [[[2]], [[]]]], lengths, cost)
    assert dropped == [] and steps[1][1][0] in ([4], [5]) and len(steps[0][0][0]) == 2
    # every row holds one sample: the last step is dropped and reported
    steps, dropped = fill_last_step([[[[0]], [[1]]], [[[2]], [[]]]], lengths, cost)
    assert dropped == [2] and len(steps) == 1


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(lengths=[3, -1]), ValueError, "lengths must be >= 0"),
    (dict(bin_size=-2), ValueError, "bin_size"),
    (dict(dp_size=0), ValueError, "dp_size"),
    (dict(batch_max_len=0), ValueError, "batch_max_len"),
    (dict(sequential="yes"), TypeError, "sequential"),
    (dict(sampler=[0, 0, 1]), ValueError, "more than once"),
    (dict(sampler=[0, 7]), ValueError, "outside"),
    (dict(cost="flops"), ValueError, "unknown cost"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    args = dict(sampler=[0, 1], batch_size=1, batch_max_len=8, lengths=[3, 4], bin_size=None, dp_size=1)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        MultipackBatchSampler(**args)
