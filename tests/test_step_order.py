"""Issue 47: every path that emits planned steps emits them free of length bias, whole steps at a time.

Over 5,000 lognormal documents, the Spearman correlation between a step's position (in its buffer, and in the
epoch) and the mean length of its documents is within +-0.1 for each path, by default (seeded shuffle) and with
``shuffle=False`` (source order of each step's longest document). The control is today's order, the planner's
(``step_order.order_steps`` patched to the identity): it fails the same bound on every path. Whole steps move, so
each step still holds one row per rank of one balanced plan step, and the shuffled order resumes exactly.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packkit
from packkit.planning import step_order

pytestmark = pytest.mark.core

N_DOCS, SEQ_LEN, BOUND = 5000, 1024, 0.1


def _lengths(seed: int = 0) -> np.ndarray:
    return np.clip(np.random.default_rng(seed).lognormal(5.0, 1.0, N_DOCS).astype(np.int64), 2, SEQ_LEN)


def _ranks(a: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), as scipy.stats.rankdata."""
    a = np.asarray(a, np.float64)
    sorter = np.argsort(a, kind="mergesort")
    inverse = np.empty(len(a), np.int64)
    inverse[sorter] = np.arange(len(a))
    s = a[sorter]
    obs = np.concatenate(([True], s[1:] != s[:-1]))
    dense = np.cumsum(obs)[inverse]
    count = np.concatenate((np.flatnonzero(obs), [len(obs)]))
    return 0.5 * (count[dense] + count[dense - 1] + 1)


def spearman(x, y) -> float:
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx ** 2).sum() * (ry ** 2).sum()))


def correlations(steps) -> tuple[float, float]:
    """``steps``: ``(buffer id, mean document length)`` in emitted order -> (rho in the buffer, rho in the epoch).
    In-buffer positions are pooled over buffers (position 0, 1, ... of each)."""
    buffers = [b for b, _ in steps]
    means = np.array([m for _, m in steps], np.float64)
    within = np.zeros(len(steps), np.int64)
    for k in range(1, len(steps)):
        within[k] = within[k - 1] + 1 if buffers[k] == buffers[k - 1] else 0
    return spearman(within, means), spearman(np.arange(len(steps)), means)


def test_spearman_matches_a_direct_computation():
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    y = np.array([2, 7, 1, 8, 2, 8, 1, 8])
    assert spearman(x, x) == pytest.approx(1.0) and spearman(x, -x) == pytest.approx(-1.0)
    # By hand: Pearson's r of the average ranks.
    rx, ry = np.array([4, 1.5, 5, 1.5, 6, 8, 3, 7]), np.array([4.5, 6, 1.5, 7, 4.5, 7, 1.5, 7])
    assert np.allclose(_ranks(x), rx) and np.allclose(_ranks(y), [3.5, 5, 1.5, 7, 3.5, 7, 1.5, 7])
    ry = _ranks(y)
    assert spearman(x, y) == pytest.approx(np.corrcoef(rx, ry)[0, 1])


@pytest.mark.parametrize("seed", range(5))
def test_source_keys_are_each_steps_longest_item_earliest_first(seed):
    rng = np.random.default_rng(seed)
    n, steps = int(rng.integers(1, 60)), int(rng.integers(1, 12))
    step_of, length = rng.integers(0, steps, n), rng.integers(1, 6, n)  # ties on purpose
    position = rng.permutation(10 * n)[:n]
    expected = [min((-length[i], position[i]) for i in range(n) if step_of[i] == s)[1] if (step_of == s).any()
                else np.iinfo(np.int64).max for s in range(steps)]
    assert step_order.source_keys(step_of, length, position, steps).tolist() == expected
    grouped = np.argsort(step_of, kind="stable")  # the grouped fast path gives the same
    assert step_order.source_keys(step_of[grouped], length[grouped], position[grouped], steps).tolist() == expected
    assert step_order.order_steps(steps, shuffle=False, keys=expected).tolist() == sorted(
        range(steps), key=lambda k: (expected[k], k))


# ------------------------------------------------------------------------------------------------- the paths
def _stream_steps(shuffle: bool):
    from packkit.integrations.torchtitan import BalancedDocumentStream

    lengths = _lengths()
    docs = [np.arange(n, dtype=np.int64) % 97 + 1 for n in lengths + 1]  # n input/label pairs
    streams = [BalancedDocumentStream(docs, seq_len=SEQ_LEN, local_batch_size=1, dp_rank=r, dp_world_size=2,
                                      buffer_size=1024, shuffle=shuffle) for r in range(2)]
    out = []
    for (b0, _), (b1, _) in zip(streams[0], streams[1]):
        start = streams[0].state_dict()["buffer_start"]
        docs_in_step = []
        for row_ids, pos in zip(torch.cat([b0["input"], b1["input"]]), torch.cat([b0["positions"], b1["positions"]])):
            starts = np.flatnonzero(pos.numpy() == 0).tolist() + [SEQ_LEN]
            # Positions restart at every document and at the row's padding (pad id 0; documents hold no 0).
            docs_in_step += [e - s for s, e in zip(starts[:-1], starts[1:]) if int(row_ids[s]) != 0]
        out.append((start, float(np.mean(docs_in_step))))
    return out


def _iterable_steps(shuffle: bool):
    lengths = _lengths()
    source = [{"input_ids": list(range(1, n + 1))} for n in lengths]
    ds = packkit.PackedIterableDataset(source, SEQ_LEN, buffer_size=1024, return_example_ids=True, shuffle=shuffle,
                                       rank=0, world_size=1)
    out = []
    for item in ds:
        ids = item["example_ids"]
        ids = ids[0] if isinstance(ids[0], (list, tuple)) else ids
        out.append((ds.state_dict()["next_position"], float(np.mean(lengths[np.asarray(ids, np.int64)]))))
    return out


def _swift_steps(shuffle: bool):
    from packkit.integrations.swift import plan_buffer

    lengths = _lengths()
    data, carry, out = list(enumerate(lengths.tolist())), [], []
    for b, lo in enumerate(range(0, N_DOCS, 1000)):
        buffer = carry + data[lo:lo + 1000]
        rows, carry = plan_buffer(buffer, SEQ_LEN, lo + 1000 >= N_DOCS, dp_size=2, batch_size=1, cost="attention",
                                  algorithm="ogbfd", shuffle=shuffle, seed=(0, 1, b))
        for s in range(0, len(rows) - 1, 2):
            out.append((b, float(np.mean([n for row in rows[s:s + 2] for _, n in row]))))
    return out


def _pack_dataset_steps(shuffle: bool):
    datasets = pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    lengths = _lengths()
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    values = pa.array(np.arange(int(offsets[-1]), dtype=np.int64) % 1000 + 1)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), values)})
    out = packkit.pack_dataset(datasets.Dataset(table), SEQ_LEN, dp_size=2, cost="attention", shuffle=shuffle)
    seq = out["seq_lengths"]
    return [(0, float(np.mean(seq[s] + seq[s + 1]))) for s in range(0, len(seq) - 1, 2)]


def _sampler_steps(shuffle: bool):
    lengths = _lengths()
    rows = packkit.PackedBatchSampler(lengths, SEQ_LEN, rank=0, world_size=2, shuffle=shuffle, seed=0)
    other = packkit.PackedBatchSampler(lengths, SEQ_LEN, rank=1, world_size=2, shuffle=shuffle, seed=0)
    return [(0, float(np.mean(lengths[a + b]))) for a, b in zip(rows, other) if a + b]


def _axolotl_steps(shuffle: bool):
    from torch.utils.data import RandomSampler, SequentialSampler

    from packkit.integrations.axolotl.sampler import MultipackBatchSampler

    lengths = _lengths()
    sampler = (RandomSampler if shuffle else SequentialSampler)(range(N_DOCS))
    s = MultipackBatchSampler(sampler, 1, SEQ_LEN, lengths, None, dp_size=2, seed=0)
    items = list(s)
    return [(0, float(np.mean(lengths[[i for item in items[k:k + 2] for row in item for i in row]])))
            for k in range(0, len(items) - 1, 2)]


def _llamafactory_steps(shuffle: bool):
    from packkit.integrations.llamafactory import plan_rows

    lengths = _lengths()
    rows = plan_rows(lengths, SEQ_LEN, dp_size=2, shuffle=shuffle).rows
    return [(0, float(np.mean(lengths[np.concatenate(rows[k:k + 2])]))) for k in range(0, len(rows) - 1, 2)]


def _swift_packed_idx_steps(shuffle: bool):
    """The order ms-swift's ``BatchSamplerShard(shuffle=False)`` deals (with ``shuffle=True`` ms-swift's sampler,
    :class:`PlannedBatchSamplerShard`, permutes whole steps itself)."""
    from packkit.integrations.swift import plan_packed_idx

    assert not shuffle
    lengths = _lengths()
    rows = plan_packed_idx(lengths, SEQ_LEN, dp_size=2).packed_idx
    return [(0, float(np.mean(lengths[rows[k] + rows[k + 1]]))) for k in range(0, len(rows) - 1, 2)]


PATHS = {"torchtitan stream": _stream_steps, "PackedIterableDataset": _iterable_steps, "swift plan_buffer": _swift_steps,
         "pack_dataset": _pack_dataset_steps, "PackedBatchSampler": _sampler_steps, "axolotl sampler": _axolotl_steps,
         "LLaMA-Factory plan_rows": _llamafactory_steps, "swift packed_idx": _swift_packed_idx_steps}


CASES = [(path, shuffle) for path in sorted(PATHS) for shuffle in (True, False)
         if not (shuffle and path == "swift packed_idx")]


@pytest.mark.parametrize("path, shuffle", CASES, ids=[f"{p}-{'shuffle' if s else 'source-order'}" for p, s in CASES])
def test_no_length_trend_in_step_order_and_control_fails(path, shuffle, monkeypatch):
    steps = PATHS[path](shuffle)
    assert len(steps) > 100
    in_buffer, in_epoch = correlations(steps)
    assert abs(in_buffer) <= BOUND and abs(in_epoch) <= BOUND, (path, in_buffer, in_epoch)
    # Control: today's order (the planner's) on the same path fails the same bound.
    monkeypatch.setattr(step_order, "order_steps", lambda n, **_: np.arange(n, dtype=np.int64))
    in_buffer, in_epoch = correlations(PATHS[path](shuffle))
    assert abs(in_buffer) > BOUND, (path, in_buffer)


# ------------------------------------------------------------------------------------------------ resume
def _docs(n=400, seed=3):
    lengths = np.clip(np.random.default_rng(seed).lognormal(4.0, 1.0, n).astype(np.int64), 2, 129)
    return [np.arange(1, k + 1, dtype=np.int64) for k in lengths]


def _batches(stream, k=None):
    out = []
    for x, labels in stream:
        out.append((x["input"].tolist(), x["positions"].tolist(), labels.tolist()))
        if k is not None and len(out) == k:
            break
    return out


@pytest.mark.parametrize("shuffle", [True, False])
def test_stream_resumes_mid_buffer_with_the_same_remaining_steps(shuffle):
    from packkit.integrations.torchtitan import BalancedDocumentStream

    make = lambda **kw: BalancedDocumentStream(_docs(), seq_len=128, local_batch_size=2, dp_rank=1, dp_world_size=2,  # noqa: E731
                                               buffer_size=64, shuffle=shuffle, seed=5, **kw)
    full = _batches(make())
    assert len(full) > 20
    for k in (1, 7, len(full) // 2, len(full) - 1):
        stream = make()
        head = _batches(stream, k)
        resumed = make()
        resumed.load_state_dict(stream.state_dict())
        assert head + _batches(resumed) == full, k
    other = BalancedDocumentStream(_docs(), seq_len=128, local_batch_size=2, dp_rank=1, dp_world_size=2,
                                   buffer_size=64, shuffle=shuffle, seed=6)
    assert (_batches(other) != full) == shuffle  # the seed changes the order (unshuffled: nothing does)...
    with pytest.raises(ValueError, match="'seed': 5"):  # ...so a state of another seed is refused
        other.load_state_dict(make().state_dict())
    old = make().state_dict()
    old["version"] = 1
    with pytest.raises(ValueError, match="older packkit"):
        make().load_state_dict(old)


@pytest.mark.parametrize("shuffle", [True, False])
def test_iterable_dataset_resumes_mid_buffer_with_the_same_remaining_rows(shuffle):
    source = [{"input_ids": d.tolist()} for d in _docs()]
    make = lambda: packkit.PackedIterableDataset(source, 160, buffer_size=64, shuffle=shuffle, seed=2,  # noqa: E731
                                                 return_example_ids=True, rank=0, world_size=1)
    full = [item["example_ids"] for item in make()]
    for k in (1, 9, len(full) // 2):
        ds = make()
        it = iter(ds)
        head = [next(it)["example_ids"] for _ in range(k)]
        resumed = make()
        resumed.load_state_dict(ds.state_dict())
        assert head + [item["example_ids"] for item in resumed] == full, k


def test_sampler_source_order_resumes_and_keeps_the_incomplete_step_last():
    lengths = _lengths()[:997]
    s = packkit.PackedBatchSampler(lengths, SEQ_LEN, rank=1, world_size=3, shuffle=False)
    full = list(s)
    it = iter(s)
    head = [next(it) for _ in range(11)]
    t = packkit.PackedBatchSampler(lengths, SEQ_LEN, rank=1, world_size=3, shuffle=False)
    t.load_state_dict(s.state_dict())
    assert head + list(t) == full
    if s.plan.empty_bins:
        assert s.step_order[-1] == s.plan.num_steps - 1
