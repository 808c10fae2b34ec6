"""packkit's torchtitan dataloader (packkit.integrations.torchtitan): documents never cut, each exactly once over
the dp ranks, steps balanced, exact resume per rank; against torchtitan 0.3.0 itself: its document mask and varlen
metadata read packkit's positions as packkit's documents, its Llama3 debug model (FlexAttention, compiled, no
grad: CPU Flex backward is refused) gives each packed document the logits it has alone, its Config/build path
and two dp ranks on gloo."""
from __future__ import annotations

import collections
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from packkit.integrations.torchtitan import BalancedDocumentStream

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_helpers import run_gloo_workers  # noqa: E402

pytestmark = pytest.mark.full

IGNORE = -100


def random_docs(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, int(n)).tolist() for n in lengths]


def id_docs(lengths):
    """Document i is i+1 repeated: in a packed row, documents are the runs of one id."""
    return [[i + 1] * int(n) for i, n in enumerate(lengths)]


def rows_of(batches):
    """(input ids, positions, labels) of every row, in order."""
    return [(i.tolist(), p.tolist(), lab.tolist()) for inputs, labels in batches
            for i, p, lab in zip(inputs["input"], inputs["positions"], labels)]


def documents_in(row):
    """The documents of a packed row, rebuilt as torchtitan reads it (a document starts where positions are 0):
    inputs plus the last label give the whole document; the padding run (labels all ignored) is skipped."""
    ids, pos, labels = row
    starts = [k for k, p in enumerate(pos) if p == 0] + [len(pos)]
    docs = []
    for a, b in zip(starts[:-1], starts[1:]):
        if all(x == IGNORE for x in labels[a:b]):
            continue
        assert labels[a:b - 1] == ids[a + 1:b], "labels are the next inputs inside a document"
        docs.append(tuple(ids[a:b] + [labels[b - 1]]))
    return docs


def all_ranks(docs, world, batch, **kw):
    return [list(BalancedDocumentStream(docs, dp_rank=r, dp_world_size=world, local_batch_size=batch, **kw))
            for r in range(world)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 70), min_size=1, max_size=60), st.integers(1, 3), st.integers(1, 3),
       st.integers(4, 40), st.integers(8, 48))
def test_every_document_once_and_whole(lengths, world, batch, buffer_size, seq_len):
    docs = random_docs(lengths)
    ranks = all_ranks(docs, world, batch, seq_len=seq_len, buffer_size=buffer_size)
    assert len({len(r) for r in ranks}) == 1, "every rank runs the same number of steps"
    got = collections.Counter()
    for steps in ranks:
        for inputs, labels in steps:
            assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (batch, seq_len)
        for row in rows_of(steps):
            got.update(documents_in(row))
    want = collections.Counter()
    for d in docs:  # torchtitan's overlong rule here: split into seq_len-input pieces, each its own document
        m = len(d) - 1
        want.update(tuple(d[a:min(a + seq_len, m) + 1]) for a in range(0, m, seq_len))
    assert got == want


def test_steps_are_balanced_across_ranks():
    """Sum over steps of the costliest rank / sum of the mean rank, under attention cost: near 1; the control
    (the same rows dealt in stream order, what a round-robin sampler does) is not."""
    rng = np.random.default_rng(1)
    lengths = np.clip(np.exp(rng.normal(np.log(200), 0.9, 2000)), 2, 1025).astype(int)
    world, batch, seq_len = 4, 2, 1024
    ranks = all_ranks(random_docs(lengths), world, batch, seq_len=seq_len, buffer_size=512, cost="attention")

    def row_cost(row):
        return sum((len(d) - 1) ** 2 for d in documents_in(row))

    per_step = np.array([[sum(row_cost(r) for r in rows_of([ranks[k][s]])) for k in range(world)]
                         for s in range(len(ranks[0]))])
    ratio = per_step.max(1).sum() / per_step.mean(1).sum()
    dealt = [row_cost(r) for s in range(len(ranks[0])) for k in range(world) for r in rows_of([ranks[k][s]])]
    rng.shuffle(dealt)
    dealt = np.array(dealt).reshape(-1, world, batch).sum(2)
    control = dealt.max(1).sum() / dealt.mean(1).sum()
    assert ratio < 1.03 and control > ratio + 0.1, (ratio, control)


@pytest.mark.parametrize("world,rank", [(1, 0), (3, 2)])
def test_resume_reproduces_the_stream(world, rank):
    lengths = np.random.default_rng(2).integers(2, 60, 400)
    docs = random_docs(lengths)
    kw = dict(seq_len=64, local_batch_size=2, dp_rank=rank, dp_world_size=world, buffer_size=37, cost="attention")
    full = rows_of(BalancedDocumentStream(docs, **kw))
    whole = BalancedDocumentStream(docs, **kw)
    n_steps = len(full) // 2
    assert n_steps > 10
    for k in (1, 5, n_steps // 2, n_steps - 1):
        first = BalancedDocumentStream(docs, **kw)
        it = iter(first)
        head = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(first.state_dict()))  # plain data: survives a checkpoint
        second = BalancedDocumentStream(docs, **kw)
        second.load_state_dict(state)
        assert rows_of(head) + rows_of(second) == full, k
    assert whole.state_dict()["steps_done"] == 0
    assert any(s["carry"] for s in states_along(docs, kw)), "the stream carried pieces: resume covered a carry"


def states_along(docs, kw):
    s = BalancedDocumentStream(docs, **kw)
    out = []
    for _ in s:
        out.append(s.state_dict())
    return out


def test_resume_with_other_geometry_is_refused():
    docs = random_docs([5] * 30)
    s = BalancedDocumentStream(docs, seq_len=16, local_batch_size=2)
    next(iter(s))
    other = BalancedDocumentStream(docs, seq_len=16, local_batch_size=2, dp_rank=0, dp_world_size=2)
    with pytest.raises(ValueError, match="dp_world_size=1 but this stream has dp_world_size=2"):
        other.load_state_dict(s.state_dict())
    replanned = BalancedDocumentStream(docs, seq_len=16, local_batch_size=2, buffer_size=7)
    with pytest.raises(ValueError, match="a resume replans the current buffer"):
        replanned.load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="a resume replans the current buffer"):
        BalancedDocumentStream(docs, seq_len=16, local_batch_size=2, cost=lambda x: x ** 3).load_state_dict(
            s.state_dict())
    with pytest.raises(ValueError, match="steps_done"):
        s.load_state_dict({**s.state_dict(), "steps_done": -1})
    with pytest.raises(ValueError, match="carry"):
        s.load_state_dict({**s.state_dict(), "carry": [[10**6, 0, 0]]})


def test_overlong_policies_and_bad_input():
    docs = [list(range(1, 40)), [3, 4]]
    rows = rows_of(BalancedDocumentStream(docs, seq_len=16, local_batch_size=1))
    assert sorted(len(d) for r in rows for d in documents_in(r)) == [2, 7, 17, 17]
    dropped = BalancedDocumentStream(docs, seq_len=16, local_batch_size=1, overlong="drop")
    assert [d for r in rows_of(dropped) for d in documents_in(r)] == [(3, 4)] and dropped.stats["dropped"] == 1
    with pytest.raises(ValueError, match="position 0 has 38 input tokens, more than seq_len=16"):
        list(BalancedDocumentStream(docs, seq_len=16, local_batch_size=1, overlong="error"))
    with pytest.raises(ValueError, match="overlong must be one of"):
        BalancedDocumentStream(docs, seq_len=16, local_batch_size=1, overlong="truncate")
    with pytest.raises(ValueError, match="dp_rank must be in"):
        BalancedDocumentStream(docs, seq_len=16, local_batch_size=1, dp_rank=2, dp_world_size=2)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        BalancedDocumentStream(docs, seq_len=16.0, local_batch_size=1)
    with pytest.raises(ValueError, match="cost"):
        BalancedDocumentStream(docs, seq_len=16, local_batch_size=1, cost="flops")
    with pytest.raises(ValueError, match="position 1 has a negative token id"):
        list(BalancedDocumentStream([[1, 2], [1, -5]], seq_len=16, local_batch_size=1))
    with pytest.raises(ValueError, match="is text but no tokenizer"):
        list(BalancedDocumentStream(["hello"], seq_len=16, local_batch_size=1))
    with pytest.raises(TypeError, match="1-D sequence of ints"):
        list(BalancedDocumentStream([[0.5, 1.5]], seq_len=16, local_batch_size=1))


# --------------------------------------------------------------------------------------- torchtitan itself
def titan(module):
    return pytest.importorskip(module)


def test_torchtitan_masks_see_packkit_documents():
    attention = titan("torchtitan.models.common.attention")
    lengths = np.random.default_rng(3).integers(2, 30, 60)
    steps = list(BalancedDocumentStream(id_docs(lengths), seq_len=48, local_batch_size=3, buffer_size=60))
    for inputs, _ in steps:
        ids, pos = inputs["input"], inputs["positions"]
        meta = attention.create_varlen_metadata_for_document(pos)
        B, L = ids.shape
        want = [0]
        for b in range(B):  # documents are runs of one id (padding is id 0, one run)
            change = [k for k in range(1, L) if ids[b, k] != ids[b, k - 1]]
            want += [b * L + k for k in change] + [(b + 1) * L]
        assert meta.cu_seq_q.tolist() == meta.cu_seq_k.tolist() == want
        mask_mod = attention.get_document_mask_mod(pos)
        q = torch.arange(L).view(L, 1).expand(L, L)
        kv = torch.arange(L).view(1, L).expand(L, L)
        for b in range(B):
            got = mask_mod(torch.tensor(b), torch.tensor(0), q, kv)
            assert torch.equal(got, ids[b][q] == ids[b][kv])


def test_torchtitan_llama3_forward_equals_documents_alone():
    """One compiled FlexAttention forward of [packed row; each document alone, padded]: same logits."""
    llama3 = titan("torchtitan.models.llama3")
    torch.manual_seed(0)
    cfg = llama3.model_registry("debugmodel").model
    cfg = dataclasses.replace(cfg, layers=cfg.layers[:2])  # the debug model, 2 of its 6 layers (compile time)
    model = cfg.build()
    model.init_states(buffer_device=torch.device("cpu"))
    model.eval()
    docs = random_docs([20, 9, 17, 3], seed=4)
    (inputs, _), = list(BalancedDocumentStream(docs, seq_len=64, local_batch_size=1))
    row, pos = inputs["input"][0], inputs["positions"][0]
    starts = [k for k in range(64) if pos[k] == 0]
    alone_rows, alone_pos = [], []
    for d in docs:
        alone = BalancedDocumentStream([d], seq_len=64, local_batch_size=1)
        (a, _), = list(alone)
        alone_rows.append(a["input"][0])
        alone_pos.append(a["positions"][0])
    tokens = torch.stack([row] + alone_rows)
    positions = torch.stack([pos] + alone_pos)
    with torch.no_grad():
        logits = model(tokens, positions, model.get_attention_masks(positions))
    found = 0
    for j, d in enumerate(docs):
        n = len(d) - 1
        at = [s for s in starts if row[s:s + n].tolist() == d[:-1]]
        assert len(at) == 1
        torch.testing.assert_close(logits[0, at[0]:at[0] + n], logits[1 + j, :n], atol=2e-5, rtol=1e-4)
        found += 1
    assert found == len(docs)
    # control: positions that do not restart (one document over the row) change the later documents' logits
    flat = torch.arange(64).view(1, 64)
    with torch.no_grad():
        leaked = model(tokens[:1], flat, model.get_attention_masks(flat))
    late = max(starts[1:-1] if len(starts) > 2 else starts)
    assert not torch.allclose(leaked[0, late:late + 2], logits[0, late:late + 2], atol=1e-3)


def test_config_build_and_checkpoint_resume():
    loader_mod = titan("packkit.integrations.torchtitan.loader")
    from torchtitan.components.dataloader import BaseDataLoader

    docs = random_docs(np.random.default_rng(5).integers(2, 50, 300))
    config = loader_mod.PackkitDataLoader.Config(source=docs, infinite=False, buffer_size=64, cost=(6.0, 1.0))
    assert isinstance(config, BaseDataLoader.Config)
    kw = dict(dp_world_size=2, dp_rank=1, tokenizer=None, seq_len=64, local_batch_size=2, snapshot_every_n_steps=1)
    full = rows_of(config.build(**kw))
    first = config.build(**kw)
    it = iter(first)
    head = [next(it) for _ in range(7)]
    state = first.state_dict()
    assert set(state) == {"dp_rank_1", "world_size"}
    second = config.build(**kw)
    second.load_state_dict(state)
    assert rows_of(head) + rows_of(second) == full
    with pytest.raises(ValueError, match="num_workers must be 0"):
        dataclasses.replace(config, num_workers=2).build(**kw)
    with pytest.raises(ValueError, match="source= .* or dataset_path="):
        loader_mod.PackkitDataLoader.Config().build(**kw)


def test_torchtitan_cost_of_the_debug_model():
    llama3 = titan("torchtitan.models.llama3")
    from packkit.integrations.torchtitan import torchtitan_cost

    cfg = llama3.model_registry("debugmodel").model
    assert torchtitan_cost(cfg) == packkit.transformer_cost(hidden_size=256, num_layers=6, vocab_size=2048,
                                                           num_heads=16, num_kv_heads=16, head_dim=16,
                                                           intermediate_size=768)
    with pytest.raises(ValueError, match="could not read intermediate_size"):
        torchtitan_cost(dataclasses.replace(cfg, layers=[dataclasses.replace(cfg.layers[0], feed_forward=None)]))


def test_two_dp_ranks_on_gloo(tmp_path):
    titan("packkit.integrations.torchtitan.loader")
    out = tmp_path / "result.json"
    for attempt in range(3):  # the free port can be taken between probing and binding
        codes, logs = run_gloo_workers("torchtitan_dist_worker.py", 2, out, timeout=180)
        if codes == [0, 0] or "Address already in use" not in "".join(logs):
            break
    assert codes == [0, 0], "\n".join(logs)
    result = json.loads(out.read_text())
    ranks = result["ranks"]
    assert len(ranks[0]) == len(ranks[1]) > 3
    got = collections.Counter()
    costs = []
    for s in range(len(ranks[0])):
        step = []
        for steps in ranks:
            ids, pos, labels = steps[s]
            rows = [documents_in(r) for r in zip(ids, pos, labels)]
            for docs in rows:
                got.update(docs)
            step.append(sum(96 * (len(d) - 1) + (len(d) - 1) ** 2 for docs in rows for d in docs))  # the worker's cost
        costs.append(step)
    assert got == collections.Counter(tuple(d) for d in result["docs"])
    costs = np.array(costs)
    assert costs.max(1).sum() / costs.mean(1).sum() < 1.03


class CharTokenizer:
    """torchtitan's BaseTokenizer.encode(text, add_bos=, add_eos=) on characters (BOS 1, EOS 2)."""

    def encode(self, text, add_bos=True, add_eos=True):
        return [1] * add_bos + [3 + ord(c) % 500 for c in text] + [2] * add_eos


def test_config_reads_a_saved_hf_dataset_of_text(tmp_path):
    loader_mod = titan("packkit.integrations.torchtitan.loader")
    datasets = pytest.importorskip("datasets")
    texts = [f"document {i} " + "x" * (i % 23) for i in range(80)]
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "ds"))
    config = loader_mod.PackkitDataLoader.Config(dataset_path=str(tmp_path / "ds"), infinite=False, buffer_size=32)
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=CharTokenizer(), seq_len=64, local_batch_size=2,
                          snapshot_every_n_steps=1)
    got = collections.Counter(d for row in rows_of(loader) for d in documents_in(row))
    assert got == collections.Counter(tuple(CharTokenizer().encode(t)) for t in texts)


class OnlyIterable:
    """A source with no __len__/__getitem__ (like a streaming dataset), counting its passes."""

    def __init__(self, docs):
        self.docs, self.passes = docs, 0

    def __iter__(self):
        self.passes += 1
        return iter(self.docs)


def test_iterable_source_is_scanned_once_per_pass_and_resumes():
    docs = random_docs(np.random.default_rng(6).integers(2, 60, 300))
    kw = dict(seq_len=64, local_batch_size=2, dp_rank=1, dp_world_size=2, buffer_size=16)
    src = OnlyIterable(docs)
    full = rows_of(BalancedDocumentStream(src, **kw))
    assert src.passes == 1
    assert full == rows_of(BalancedDocumentStream(docs, **kw))  # the same stream as from an indexable source
    first = BalancedDocumentStream(OnlyIterable(docs), **kw)
    it = iter(first)
    head = [next(it) for _ in range(9)]
    second = BalancedDocumentStream(OnlyIterable(docs), **kw)
    second.load_state_dict(first.state_dict())
    assert rows_of(head) + rows_of(second) == full


def test_many_ranks_get_full_rows_from_a_small_buffer():
    """buffer_size=8 documents for 16 ranks x 4 rows: the buffer grows to 4 steps of tokens, so the steps before
    the last are full (a buffer of 8 documents would leave 56 of every step's 64 rows empty)."""
    docs = random_docs(np.random.default_rng(7).integers(20, 120, 3000))
    kw = dict(seq_len=256, local_batch_size=4, dp_world_size=16, buffer_size=8)
    ranks = [rows_of(BalancedDocumentStream(docs, dp_rank=r, **kw)) for r in range(16)]
    steps = len(ranks[0]) // 4
    fill = [sum(sum(x != IGNORE for x in row[2]) for rank in ranks for row in rank[4 * s:4 * s + 4]) / (64 * 256)
            for s in range(steps)]
    assert min(fill[:-1]) > 0.9, fill
