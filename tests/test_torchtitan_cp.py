"""Static CP in torchtitan: rows whose documents are ordered so torchtitan's head-tail CP shards of each row get
even work. The work model is checked against torch's own ``_HeadTailLoadBalancer`` (what torchtitan's
``cp_shard`` uses by default), the stream keeps every row's documents and resumes exactly, and the loader's
config passes the degree through."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from packkit.integrations.torchtitan import BalancedDocumentStream
from packkit.integrations.torchtitan.cp_balance import headtail_order, rank_work, token_work

pytestmark = pytest.mark.full

balancer = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")


def torch_rank_work(lengths, seq_len, cp, a, b):
    """Each rank's work from torch's head-tail indices of the row: rank r keeps the r-th of cp equal parts."""
    pad = seq_len - int(sum(lengths))
    pos = np.concatenate([np.arange(n) for n in lengths] + ([np.arange(pad)] if pad else []))
    index = balancer._HeadTailLoadBalancer(seq_len, cp, "cpu")._generate_indices()[0].numpy()
    work = a + b * (2 * pos + 1)
    return np.array([work[part].sum() for part in np.split(index, cp)])


def random_row(rng, seq_len):
    lengths = []
    while True:
        n = int(np.clip(rng.lognormal(math.log(seq_len / 6), 1.0), 1, seq_len))
        if sum(lengths) + n > seq_len:
            return lengths or [n]
        lengths.append(n)


@pytest.mark.parametrize("cp, seq_len", [(2, 64), (4, 256), (8, 1024)])
@pytest.mark.parametrize("a, b", [(0.0, 1.0), (6.0, 1.0), (300.0, 0.01)])
def test_work_model_is_torchs_head_tail_split(cp, seq_len, a, b):
    rng = np.random.default_rng([cp, seq_len, int(a)])
    for _ in range(20):
        lengths = random_row(rng, seq_len)
        assert rank_work(lengths, seq_len, cp, a, b) == pytest.approx(torch_rank_work(lengths, seq_len, cp, a, b))


def test_order_balances_the_shards():
    seq_len, cp = 4096, 4
    rng = np.random.default_rng(0)
    before, after = [], []
    for _ in range(200):
        lengths = np.array(random_row(rng, seq_len))
        order = headtail_order(lengths, seq_len, cp, 0.0, 1.0)
        assert sorted(order) == list(range(len(lengths)))
        w0, w1 = (torch_rank_work(x.tolist(), seq_len, cp, 0.0, 1.0) for x in (lengths, lengths[order]))
        assert w1.max() <= w0.max() * (1 + 1e-12)          # never worse than the planner's order
        before.append(w0.max() / w0.mean())
        after.append(w1.max() / w1.mean())
    assert np.percentile(after, 90) < np.percentile(before, 90) - 0.2, (np.percentile(before, 90),
                                                                         np.percentile(after, 90))
    # one long document then short ones: the long one's costly tail lands on the middle ranks; reordered it is even
    lengths = np.array([3000, 300, 300, 300, 296])
    order = headtail_order(lengths, seq_len, cp, 0.0, 1.0)
    w0, w1 = rank_work(lengths, seq_len, cp, 0, 1), rank_work(lengths[order], seq_len, cp, 0, 1)
    assert w1.max() / w1.mean() < 0.9 * (w0.max() / w0.mean())
    assert headtail_order(lengths, seq_len, 1, 0.0, 1.0) == list(range(5))     # cp 1: nothing to balance
    assert headtail_order(lengths, seq_len, cp, 1.0, 0.0) == list(range(5))    # token cost: any order is even


def docs_of(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, int(x)).tolist() for x in np.clip(rng.lognormal(4.5, 1.0, n), 2, 700)]


def rows(stream):
    out = []
    for inputs, labels in stream:
        for ids, pos, lab in zip(inputs["input"], inputs["positions"], labels):
            starts = (pos == 0).nonzero().flatten().tolist() + [len(pos)]
            docs = sorted(tuple(ids[s:e].tolist()) + (int(lab[e - 1]),) for s, e in zip(starts, starts[1:]))
            out.append((docs, pos, lab))
    return out


def test_stream_keeps_rows_and_resumes():
    docs, kw = docs_of(400, 1), dict(seq_len=512, local_batch_size=2, dp_world_size=2, cost="attention",
                                     buffer_size=64, seed=3)
    for rank in range(2):
        plain = rows(BalancedDocumentStream(docs, dp_rank=rank, **kw))
        stream = BalancedDocumentStream(docs, dp_rank=rank, cp_degree=4, **kw)
        ordered = rows(stream)
        assert [d for d, _, _ in ordered] == [d for d, _, _ in plain]   # the same documents in every row
        peaks = []
        for (_, pos, _), (_, pos0, _) in zip(ordered, plain):
            lengths = np.diff((pos == 0).nonzero().flatten().tolist() + [len(pos)])
            lengths0 = np.diff((pos0 == 0).nonzero().flatten().tolist() + [len(pos0)])
            peaks.append((torch_rank_work(lengths.tolist(), 512, 4, 0, 1).max(),
                          torch_rank_work(lengths0.tolist(), 512, 4, 0, 1).max()))
        assert all(p <= q * (1 + 1e-12) for p, q in peaks) and sum(p for p, _ in peaks) < sum(q for _, q in peaks)
        # a resume mid-stream continues with the same ordered rows
        first = BalancedDocumentStream(docs, dp_rank=rank, cp_degree=4, **kw)
        it = iter(first)
        head = [next(it) for _ in range(5)]
        second = BalancedDocumentStream(docs, dp_rank=rank, cp_degree=4, **kw)
        second.load_state_dict(first.state_dict())
        got = rows(head) + rows(second)
        assert len(got) == len(ordered) and all(
            a[0] == b[0] and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) for a, b in zip(got, ordered))


def test_errors_name_cp_degree():
    with pytest.raises(ValueError, match="2 \\* cp_degree"):
        BalancedDocumentStream([[1, 2, 3]], seq_len=100, local_batch_size=1, cp_degree=8)
    with pytest.raises(ValueError, match="cp_degree"):
        BalancedDocumentStream([[1, 2, 3]], seq_len=64, local_batch_size=1, cp_degree=0)
    with pytest.raises(TypeError, match="cp_degree"):
        BalancedDocumentStream([[1, 2, 3]], seq_len=64, local_batch_size=1, cp_degree=2.0)
    assert token_work((6.0, 1.0)) == (6.0, 1.0) and token_work("tokens") == (1.0, 0.0)
    assert token_work(lambda x: x * 2.0) == (0.0, 1.0)


def test_loader_config_passes_the_degree():
    loader = pytest.importorskip("packkit.integrations.torchtitan.loader")
    config = loader.PackkitDataLoader.Config(source=docs_of(50, 2), infinite=False, buffer_size=32,
                                             cost="attention", context_parallel_degree=2)
    built = config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=256, local_batch_size=1,
                         snapshot_every_n_steps=1)
    assert built.stream.cp_degree == 2
    direct = rows(BalancedDocumentStream(docs_of(50, 2), seq_len=256, local_batch_size=1, buffer_size=32,
                                         cost="attention", cp_degree=2))
    got = rows(built)
    assert len(got) == len(direct) and all(a[0] == b[0] and torch.equal(a[1], b[1]) for a, b in zip(got, direct))
