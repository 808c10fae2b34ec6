"""Tests of packkit.PackedBatchSampler: exactly-once sharding, equal steps, balance, shuffle, resume,
arguments, DataLoader + PackingCollator, and a 2-process torch.distributed (gloo) run."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packkit
from packkit.training.sampler import PackedBatchSampler

from dist_helpers import run_gloo_workers

pytestmark = pytest.mark.core


def lognormal(n: int, seed: int = 1, cap: int = 8192) -> np.ndarray:
    """Lengths of the seed-001 profile (median 864, sigma 0.932), clipped to [1, cap]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(rng.normal(np.log(864), 0.932, n))), 1, cap).astype(np.int64)


def all_ranks(lengths, capacity, world_size, **kw) -> list[PackedBatchSampler]:
    return [PackedBatchSampler(lengths, capacity, rank=r, world_size=world_size, **kw) for r in range(world_size)]


def check_shards(samplers, lengths, capacity, *, expected=None, truncate=False):
    """Rows of all ranks: equal step counts, each sample once, no row over capacity, costs as reported."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = [list(s) for s in samplers]
    steps = len(samplers[0])
    assert all(len(s) == steps for s in samplers)
    assert all(len(r) == steps for r in rows)
    flat = [i for r in rows for row in r for i in row]
    if expected is None:
        expected = np.flatnonzero((lengths > 0) & ((lengths <= capacity) | truncate))
    assert sorted(flat) == sorted(np.asarray(expected).tolist()), "not every sample exactly once"
    assert len(flat) == len(set(flat))
    planned = np.minimum(lengths, capacity)
    costs = np.zeros((steps, len(samplers)))
    for r, rank_rows in enumerate(rows):
        for step, row in enumerate(rank_rows):
            assert all(isinstance(i, int) for i in row)
            assert planned[row].sum() <= capacity
            costs[step, r] = float((planned[row].astype(np.float64) ** 2).sum())
    np.testing.assert_allclose(samplers[0].rank_costs, costs, rtol=1e-12)
    return rows


# -- sharding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_shards_exactly_once_equal_steps(world_size):
    lengths = lognormal(4000, seed=world_size)
    lengths[:5] = 0
    lengths[5:9] = 9000
    samplers = all_ranks(lengths, 8192, world_size, overlong="drop", seed=11)
    check_shards(samplers, lengths, 8192)
    s = samplers[0]
    assert s.dropped.tolist() == [5, 6, 7, 8] and s.zero_length.tolist() == [0, 1, 2, 3, 4]
    assert s.num_steps == len(s) == s.plan.num_steps
    assert [s.batches(r) for r in range(world_size)] == [list(t) for t in samplers]


@pytest.mark.parametrize("world_size", [2, 8])
def test_balanced_and_better_than_round_robin(world_size):
    lengths = lognormal(20000, cap=16384)
    s = PackedBatchSampler(lengths, 16384, rank=0, world_size=world_size)
    assert s.balance == pytest.approx(s.plan.balance)
    assert s.balance <= 1.03 and s.rank_balance <= 1.001
    # The same rows dealt round-robin in a random order, and obfd's rows dealt in order.
    costs = np.array([float((lengths[s.permutation[b]].astype(np.float64) ** 2).sum()) for b in s.plan.bins])
    dealt = np.random.default_rng(0).permutation(costs)
    dealt = np.append(dealt, np.zeros(-len(dealt) % world_size)).reshape(-1, world_size)
    round_robin = dealt.max(1).sum() / dealt.mean(1).sum()
    obfd = packkit.plan(lengths[s.permutation], 16384, algorithm="obfd", dp_size=world_size, cost="attention")
    assert s.balance <= obfd.balance + 1e-12
    assert s.balance < round_robin


def test_tokens_cost_model_balances_tokens():
    lengths = lognormal(5000)
    s = PackedBatchSampler(lengths, 8192, rank=0, world_size=4, cost="tokens")
    tokens = np.array([[lengths[row].sum() for row in s.batches(r)] for r in range(4)]).T
    np.testing.assert_allclose(s.rank_costs, tokens)
    assert s.balance <= 1.02


def test_truncate_yields_overlong_samples_planned_at_capacity():
    lengths = np.array([100, 5000, 30, 4096, 7000, 1, 0])
    samplers = all_ranks(lengths, 4096, 2, overlong="truncate")
    check_shards(samplers, lengths, 4096, truncate=True)
    assert samplers[0].truncated.tolist() == [1, 4] and samplers[0].dropped.tolist() == []


def test_single_process_defaults():
    s = PackedBatchSampler([5, 6, 7], 10)
    assert (s.rank, s.world_size, s.epoch) == (0, 1, 0)
    assert sorted(i for row in s for i in row) == [0, 1, 2]
    s = PackedBatchSampler([5, 6, 7], 10, world_size=1)
    assert (s.rank, s.world_size) == (0, 1)


def test_empty_dataset():
    s = PackedBatchSampler([], 10, rank=1, world_size=2)
    assert len(s) == 0 and list(s) == [] and s.balance == 1.0
    state = s.state_dict()
    assert state["steps_done"] == 0 and state["epoch"] == 0
    fresh = PackedBatchSampler([], 10, rank=1, world_size=2)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert fresh.state_dict() == state and list(fresh) == [] and len(fresh) == 0
    with pytest.raises(ValueError, match="state does not match"):  # the round trip really compares
        PackedBatchSampler([], 20, rank=1, world_size=2).load_state_dict(state)


# -- the last step -------------------------------------------------------------------------------
def test_last_step_empty_rows_yield_empty_lists():
    lengths = [10, 10, 10]  # three full rows over two ranks: the second step has an empty row
    samplers = all_ranks(lengths, 10, 2)
    rows = check_shards(samplers, lengths, 10)
    assert len(samplers[0]) == 2 and samplers[0].plan.empty_bins == 1
    last = [r[-1] for r in rows]
    assert sorted(map(len, last)) == [0, 1]
    many = all_ranks([3, 4], 10, 8)  # fewer samples than ranks: one step, six empty rows
    rows = check_shards(many, [3, 4], 10)
    assert len(many[0]) == 1 and sorted(len(r[0]) for r in rows) == [0] * 6 + [1, 1]


@pytest.mark.parametrize("shuffle", [True, False])
def test_incomplete_step_stays_last(shuffle):
    lengths = np.full(41, 100)  # 41 full rows over 4 ranks: 10 full steps and one with 3 empty rows
    for epoch in range(3):
        samplers = all_ranks(lengths, 100, 4, shuffle=shuffle)
        for s in samplers:
            s.set_epoch(epoch)
        rows = check_shards(samplers, lengths, 100)
        assert [sum(len(r[k]) == 0 for r in rows) for k in range(len(rows[0]))] == [0] * 10 + [3]


def test_drop_last_drops_incomplete_step_and_reports_it():
    lengths = np.full(42, 100)
    lengths[7] = 0  # 41 full rows over 4 ranks
    samplers = all_ranks(lengths, 100, 4, drop_last=True, seed=5)
    s = samplers[0]
    assert len(s) == 10 and s.plan.num_steps == 11
    dropped_last = s.dropped_last.tolist()
    assert len(dropped_last) == 1
    expected = sorted(set(range(42)) - {7} - set(dropped_last))
    rows = check_shards(samplers, lengths, 100, expected=expected)
    assert all(len(row) == 1 for r in rows for row in r)
    # Complete plans lose nothing with drop_last.
    full = all_ranks(np.full(40, 100), 100, 4, drop_last=True)
    check_shards(full, np.full(40, 100), 100)
    assert full[0].dropped_last.tolist() == []


# -- shuffle -------------------------------------------------------------------------------------
def test_shuffle_is_per_epoch_and_deterministic():
    lengths = lognormal(3000)
    a = PackedBatchSampler(lengths, 8192, rank=1, world_size=4, seed=3)
    b = PackedBatchSampler(lengths, 8192, rank=1, world_size=4, seed=3)
    epoch0 = list(a)
    assert epoch0 == list(b) == list(a)  # same (seed, epoch): same rows, however often iterated
    a.set_epoch(1)
    epoch1 = list(a)
    assert epoch1 != epoch0 and len(epoch1) == len(epoch0)
    b.set_epoch(1)
    assert list(b) == epoch1
    other_seed = PackedBatchSampler(lengths, 8192, rank=1, world_size=4, seed=4)
    assert list(other_seed) != epoch0
    # The step order is shuffled too: the planner emits steps by decreasing cost.
    assert not np.array_equal(a.step_order, np.sort(a.step_order))
    assert pickle.loads(pickle.dumps(a)).batches() == epoch1


def test_no_shuffle_keeps_index_order_and_orders_steps_by_their_longest_sample():
    lengths = lognormal(2000)
    s = PackedBatchSampler(lengths, 8192, rank=0, world_size=2, shuffle=False)
    np.testing.assert_array_equal(s.permutation, np.arange(2000))
    first = list(s)
    s.set_epoch(5)
    assert list(s) == first
    planned = packkit.plan(lengths, 8192, algorithm="ogbfd", dp_size=2, cost="attention")
    # The plan's steps, not in the planner's order (longest samples first, issue 47) but in the dataset order of
    # each step's longest sample (ties: the earliest index); an incomplete last step would stay last.
    def anchor(step):
        members = np.concatenate(planned.bins[2 * step:2 * step + 2])
        return min(members.tolist(), key=lambda i: (-lengths[i], i))

    complete = planned.num_steps - (planned.empty_bins > 0)
    expected = sorted(range(complete), key=anchor) + list(range(complete, planned.num_steps))
    np.testing.assert_array_equal(s.step_order, expected)
    assert first == [planned.rank_bins(0)[k].tolist() for k in expected]
    assert not np.array_equal(s.step_order, np.arange(len(s)))


# -- resume --------------------------------------------------------------------------------------
@pytest.mark.parametrize("consumed", [0, 1, 17, 49])
def test_resume_mid_epoch_yields_the_rest(consumed):
    lengths = lognormal(3000)
    s = PackedBatchSampler(lengths, 8192, rank=2, world_size=3, seed=9)
    s.set_epoch(4)
    full = list(s)
    assert len(full) > 49
    it = iter(s)
    head = [next(it) for _ in range(consumed)]
    state = s.state_dict()
    assert state["epoch"] == 4 and state["steps_done"] == consumed and state["seed"] == 9
    state = json.loads(json.dumps(state))  # plain data: JSON and torch.save round trips
    fresh = PackedBatchSampler(lengths, 8192, rank=2, world_size=3, seed=9)
    fresh.load_state_dict(state)
    assert fresh.epoch == 4
    rest = list(fresh)
    assert head + rest == full
    assert list(fresh) == full  # only the first iteration after loading resumes
    # Another rank resumes from rank 2's state: states do not depend on the rank.
    other = PackedBatchSampler(lengths, 8192, rank=0, world_size=3, seed=9)
    other.load_state_dict(state)
    other_full = other.batches()
    assert list(other) == other_full[consumed:]


def test_resume_with_explicit_steps_done_and_epoch_loop():
    lengths = lognormal(2000)
    s = PackedBatchSampler(lengths, 8192, rank=0, world_size=2)
    s.set_epoch(2)
    list(s)
    assert s.state_dict()["steps_done"] == len(s)
    state = s.state_dict(steps_done=5)  # what the training loop consumed, not what was prefetched
    fresh = PackedBatchSampler(lengths, 8192, rank=0, world_size=2)
    fresh.load_state_dict(state)
    assert fresh.state_dict()["steps_done"] == 5
    fresh.set_epoch(2)  # a loop restarting at the saved epoch keeps the resume point
    assert list(fresh) == s.batches()[5:]
    fresh.load_state_dict(state)
    fresh.set_epoch(3)  # moving on to another epoch starts it from the beginning
    assert fresh.state_dict()["steps_done"] == 0
    s.set_epoch(3)
    assert list(fresh) == list(s)
    done = s.state_dict()
    fresh.load_state_dict(done)  # a finished epoch resumes to nothing
    assert list(fresh) == []
    with pytest.raises(ValueError, match="steps_done must be in"):
        s.state_dict(steps_done=len(s) + 1)


def test_state_mismatch_raises():
    lengths = lognormal(1000, cap=4096)
    state = PackedBatchSampler(lengths, 8192, rank=0, world_size=2).state_dict()
    for kw, what in ((dict(capacity=4096), "capacity"), (dict(world_size=4), "world_size"),
                     (dict(seed=1), "seed"), (dict(cost="tokens"), "cost"), (dict(shuffle=False), "shuffle")):
        args = dict(capacity=8192, rank=0, world_size=2) | kw
        capacity = args.pop("capacity")
        with pytest.raises(ValueError, match=f"state does not match.*{what}: saved ") as err:
            PackedBatchSampler(lengths, capacity, **args).load_state_dict(state)
        assert "saved None" not in str(err.value)  # the saved value is named, not lost
    changed = lengths.copy()
    changed[0] += 1
    with pytest.raises(ValueError, match="lengths_digest"):
        PackedBatchSampler(changed, 8192, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        PackedBatchSampler(lengths, 8192, rank=0, world_size=2).load_state_dict({"epoch": 0})
    with pytest.raises(TypeError):
        PackedBatchSampler(lengths, 8192, rank=0, world_size=2).load_state_dict([1, 2])


# -- arguments -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(lengths=[1, -2]), ValueError, "lengths must be >= 0; index 1"),
    (dict(lengths=[1.5, 2.0]), TypeError, "lengths must be integers"),
    (dict(lengths="abc"), TypeError, "lengths must be"),
    (dict(capacity=0), ValueError, "capacity must be a positive int"),
    (dict(capacity=10.0), TypeError, "capacity must be an int"),
    (dict(rank=2, world_size=2), ValueError, r"rank must be in \[0, 2\)"),
    (dict(rank=-1, world_size=2), ValueError, r"rank must be in \[0, 2\)"),
    (dict(rank=0, world_size=0), ValueError, "world_size must be >= 1"),
    (dict(rank=True, world_size=2), TypeError, "rank must be an int"),
    (dict(world_size=4), ValueError, "without rank"),
    (dict(rank=1), ValueError, "without world_size"),
    (dict(overlong="split"), ValueError, "'split' is not supported.*allowed: error, drop, truncate"),
    (dict(overlong="clip"), ValueError, "allowed: error, drop, truncate"),
    (dict(lengths=[5, 50, 60]), ValueError, "2 samples are longer than capacity 10 .first: index 1"),
    (dict(algorithm="best"), ValueError, "allowed: nf, ffd, bfd, obfd, ogbfd"),
    (dict(cost="flops"), ValueError, "allowed: 'tokens', 'attention'"),
    (dict(cost=(0, 0)), ValueError, "not both 0"),
    (dict(shuffle=1), TypeError, "shuffle must be a bool"),
    (dict(drop_last="yes"), TypeError, "drop_last must be a bool"),
    (dict(seed=-1), ValueError, "seed must be >= 0"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
])
def test_bad_arguments(kwargs, error, match):
    args = dict(lengths=[5, 6, 7], capacity=10) | kwargs
    with pytest.raises(error, match=match):
        PackedBatchSampler(args.pop("lengths"), args.pop("capacity"), **args)


def test_bad_method_arguments():
    s = PackedBatchSampler([5, 6, 7], 10, rank=0, world_size=2)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        s.set_epoch(-1)
    with pytest.raises(TypeError, match="epoch must be an int"):
        s.set_epoch("1")
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        s.batches(rank=2)
    with pytest.raises(RuntimeError, match="initialised"):
        s.verify()
    with pytest.raises(ValueError, match="group was given"):
        PackedBatchSampler([5], 10, group=object())


def test_numpy_and_tensor_arguments():
    lengths = torch.tensor([5, 6, 7, 3])
    s = PackedBatchSampler(lengths, np.int64(10), rank=np.int64(1), world_size=torch.tensor(2), seed=np.uint8(3))
    assert (s.rank, s.world_size, s.capacity, s.seed) == (1, 2, 10, 3)
    check_shards(all_ranks(lengths, 10, 2), lengths.numpy(), 10)


def test_from_dataset():
    data = [{"input_ids": [1] * n} for n in (5, 9, 3, 12)]
    s = PackedBatchSampler.from_dataset(data, 10, rank=0, world_size=1, overlong="drop")
    np.testing.assert_array_equal(s.lengths, [5, 9, 3, 12])
    assert s.dropped.tolist() == [3]
    np.testing.assert_array_equal(PackedBatchSampler.from_dataset(
        data, 30, length_key=lambda item: len(item["input_ids"]) * 2).lengths, [10, 18, 6, 24])
    with_length = [{"length": n} for n in (4, 2)]
    np.testing.assert_array_equal(PackedBatchSampler.from_dataset(with_length, 10, length_key="length").lengths, [4, 2])
    with pytest.raises(ValueError, match=r"dataset\[0\] has no 'tokens' key"):
        PackedBatchSampler.from_dataset(data, 10, length_key="tokens")
    with pytest.raises(TypeError, match="length_key must be"):
        PackedBatchSampler.from_dataset(data, 10, length_key=3)


def test_from_hf_dataset_column():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in (5, 9, 3)], "length": [5, 9, 3]})
    for key in ("input_ids", "length"):
        np.testing.assert_array_equal(PackedBatchSampler.from_dataset(ds, 10, length_key=key).lengths, [5, 9, 3])


# -- DataLoader + PackingCollator ----------------------------------------------------------------
def test_dataloader_with_packing_collator():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(1, 200, 97), [256, 256, 256]])
    data = [{"input_ids": list(range(1000 * (i + 1), 1000 * (i + 1) + n))} for i, n in enumerate(lengths)]
    seen = []
    for rank in range(2):
        sampler = PackedBatchSampler(lengths, 256, rank=rank, world_size=2, seed=1)
        loader = torch.utils.data.DataLoader(data, batch_sampler=sampler,
                                             collate_fn=packkit.PackingCollator(256, layout="padded"))
        batches = list(loader)
        assert len(batches) == len(sampler)
        for batch, row in zip(batches, sampler.batches()):
            assert batch["input_ids"].shape == (1, 256)
            assert int(batch["labels"].ne(-100).sum()) == int(lengths[row].sum()) - len(row)
            if not row:  # an empty row is pure padding: no loss tokens, same shape
                assert batch["labels"].eq(-100).all()
            ids = batch["input_ids"][0]
            assert ids.ne(0).sum() == lengths[row].sum() and ids[int(lengths[row].sum()):].eq(0).all()
            assert sorted({int(x) // 1000 - 1 for x in ids if x}) == sorted(row)  # the row's samples, whole
            seen += row
    assert sorted(seen) == list(range(100))


# -- properties ----------------------------------------------------------------------------------
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 200).flatmap(lambda cap: st.tuples(
           st.just(cap), st.lists(st.integers(0, cap * 2), max_size=80))),
       st.integers(1, 8), st.sampled_from(["drop", "truncate"]), st.booleans(), st.booleans(),
       st.integers(0, 3), st.sampled_from(["ogbfd", "obfd", "nf"]))
def test_property_exactly_once_equal_steps(case, world_size, overlong, shuffle, drop_last, epoch, algorithm):
    capacity, lengths = case
    lengths = np.asarray(lengths, dtype=np.int64)
    samplers = all_ranks(lengths, capacity, world_size, overlong=overlong, shuffle=shuffle, drop_last=drop_last,
                         algorithm=algorithm)
    for s in samplers:
        s.set_epoch(epoch)
    kept = np.flatnonzero((lengths > 0) & ((lengths <= capacity) | (overlong == "truncate")))
    s = samplers[0]
    expected = sorted(set(kept.tolist()) - set(s.dropped_last.tolist()))
    rows = check_shards(samplers, lengths, capacity, expected=expected)
    if drop_last:
        assert all(len(r[k]) > 0 for r in rows for k in range(len(s)))
    else:
        assert s.dropped_last.tolist() == []
        assert len(s) == s.plan.num_steps
        # only the last step may hold empty rows
        assert all(len(r[k]) > 0 for r in rows for k in range(len(s) - 1))
    # resuming at any point of the epoch yields the rest
    k = len(s) // 2
    fresh = PackedBatchSampler(lengths, capacity, rank=world_size - 1, world_size=world_size, overlong=overlong,
                               shuffle=shuffle, drop_last=drop_last, algorithm=algorithm)
    fresh.load_state_dict(samplers[-1].state_dict(steps_done=k))
    assert list(fresh) == rows[-1][k:]


# -- torch.distributed, gloo, 2 processes -----------------------------------------------------------
def _run_workers(out: Path, world_size: int = 2, timeout: float = 120.0) -> tuple[list[int], list[str]]:
    return run_gloo_workers("sampler_dist_worker.py", world_size, out, timeout)


def test_gloo_two_processes(tmp_path):
    out = tmp_path / "result.json"
    for attempt in range(3):  # the free port can be taken between probing and binding
        codes, logs = _run_workers(out)
        if codes == [0, 0] and out.exists():
            break
        if not any("address already in use" in log.lower() or "eaddrinuse" in log.lower() for log in logs):
            break
    assert codes == [0, 0] and out.exists(), "workers failed:\n" + "\n----\n".join(logs)
    result = json.loads(out.read_text())
    lengths, capacity = np.array(result["lengths"]), result["capacity"]
    expected = np.flatnonzero((lengths > 0) & (lengths <= capacity)).tolist()
    orders = []
    for epoch in result["epochs"]:
        gathered = epoch["gathered"]
        assert [g["rank"] for g in gathered] == [0, 1] and all(g["world_size"] == 2 for g in gathered)
        steps = gathered[0]["len"]
        assert steps > 0 and all(g["len"] == steps and len(g["rows"]) == steps for g in gathered)  # equal steps
        shards = [[i for row in g["rows"] for i in row] for g in gathered]
        assert not set(shards[0]) & set(shards[1])  # disjoint
        assert sorted(shards[0] + shards[1]) == expected  # exhaustive, each once
        assert epoch["dropped"] == [3, 4, 5, 6, 7] and epoch["zero_length"] == [0, 1, 2]
        costs = np.array([[float((lengths[g["rows"][k]].astype(np.float64) ** 2).sum()) for g in gathered]
                          for k in range(steps)])
        assert all(lengths[row].sum() <= capacity for g in gathered for row in g["rows"])
        np.testing.assert_allclose(costs, epoch["rank_costs"])
        balance = costs.max(1).sum() / costs.mean(1).sum()  # per-step slowest rank / mean
        assert balance == pytest.approx(epoch["balance"]) and balance == pytest.approx(epoch["plan_balance"])
        assert balance <= 1.01
        orders.append(gathered[0]["rows"])
    assert orders[0] != orders[1]  # set_epoch reshuffles
    # DataLoader + PackingCollator with an empty row at the last step: both ranks took both steps.
    small = result["small_steps"]
    assert [len(s) for s in small] == [2, 2]
    for step in range(2):
        assert all(s[step]["shape"] == [1, capacity] for s in small)
        assert small[0][step]["global_label_tokens"] == sum(s[step]["label_tokens"] for s in small)
    assert sorted(s[1]["label_tokens"] for s in small) == [0, capacity - 1]
    # rows_per_step=k: k rows per rank per step, exactly once over ranks, balanced on the sums, resumable
    acc = result["rows_per_step"]
    k, ranks = acc["k"], acc["ranks"]
    steps = ranks[0]["num_steps"]
    assert steps > 0 and all(r["num_steps"] == steps and r["len"] == len(r["rows"]) == steps * k for r in ranks)
    shards = [[i for row in r["rows"] for i in row] for r in ranks]
    assert not set(shards[0]) & set(shards[1]) and sorted(shards[0] + shards[1]) == expected
    assert all(lengths[row].sum() <= capacity for r in ranks for row in r["rows"])
    sums = np.array([[sum(float((lengths[row].astype(np.float64) ** 2).sum()) for row in r["rows"][s * k:(s + 1) * k])
                      for r in ranks] for s in range(steps)])
    np.testing.assert_allclose(sums, ranks[0]["rank_costs"])
    balance = sums.max(1).sum() / sums.mean(1).sum()
    assert balance == pytest.approx(ranks[0]["balance"]) and balance <= 1.01
    assert all(r["resumed"] == r["rows"][acc["resume_at"]:] for r in ranks)


def test_from_dataset_reads_0d_tensor_lengths():
    """Lengths held as 0-d tensors (what a torch Dataset often returns) are read as ints (kills a mutmut
    survivor; docs/mutation.md)."""
    data = [{"n": torch.tensor(n)} for n in (5, 7, 3, 9)]
    s = PackedBatchSampler.from_dataset(data, 10, length_key="n")
    assert list(s.lengths) == [5, 7, 3, 9]


def test_fresh_sampler_state_is_the_start_of_epoch_0():
    """A state taken before any iteration resumes from the first row (kills a mutmut survivor that started
    the count at 1; docs/mutation.md)."""
    lengths = [5, 6, 7, 8, 9, 3]
    s = PackedBatchSampler(lengths, 10, rank=0, world_size=2)
    assert s.state_dict()["steps_done"] == 0 and s.state_dict()["epoch"] == 0
    resumed = PackedBatchSampler(lengths, 10, rank=0, world_size=2)
    resumed.load_state_dict(s.state_dict())
    assert list(resumed) == list(PackedBatchSampler(lengths, 10, rank=0, world_size=2))
