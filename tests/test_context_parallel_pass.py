"""packkit.pack_context_parallel_pass / iter_context_parallel (issue 54 part 3): one rank's batch for one pass of
a dynamic CP plan. (a) Every backend equals a plain-PyTorch reference (concatenate the pass's documents by hand,
split with tests/cp_reference.py) bit for bit into poisoned memory; hypothesis: over all passes and ranks of a
plan every token of every sequence appears exactly once, positions are global, no label crosses a document.
(b) Ring attention over each pass's group, emulated in one process in fp64 (blockwise, online log-sum-exp,
ring order), reassembled, equals per-document causal attention; swapping two ranks' cp_rank does not. (c) A
tiny fp64 Llama whose attention is that ring across a group's rows: loss and gradients summed over all passes
equal each document run alone; a rank given another's cp_rank does not."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpu_gate
import packkit
from cp_reference import reference_shard
from gpu_gate import on

pytestmark = pytest.mark.core

BACKENDS = ["cpu", pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
            pytest.param("triton", marks=gpu_gate.needs_triton_gpu)]
# Planned on 8 ranks at 24 local tokens: CP sizes 4 (one pass of two documents), 2 and 1; a 0- and a 1-token
# sequence share a single-rank pass (the test asserts this mix, so a planner change that loses it is seen).
LENGTHS = [86, 37, 52, 56, 11, 15, 8, 13, 13, 5, 2, 2, 18, 11, 10, 5, 0, 1]
WORLD, CAP = 8, 24
VOCAB = 97
# cp_sizes="any" on 6 ranks: groups of 3 and a group of 2 at ranks 3-4, whose cp_rank is not rank % 2.
ANY_LENGTHS = [55, 36, 31, 19, 5, 7, 13, 16, 13]


def any_size_plan():
    plan = packkit.plan_context_parallel(ANY_LENGTHS, 6, CAP, cp_comm=1.0, pass_overhead=1.0, cp_sizes="any")
    assert any(len(r) > 1 and r.start % len(r) for r, _ in plan.passes), plan.passes
    return plan


def mixed_plan():
    plan = packkit.plan_context_parallel(LENGTHS, WORLD, CAP, cp_comm=1.0, pass_overhead=1.0)
    sizes = {len(ranks) for ranks, _ in plan.passes}
    assert {1, 2, 4} <= sizes and any(len(r) > 1 and len(s) > 1 for r, s in plan.passes), plan.passes
    return plan


def make_sources(seed=0, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    seqs = [torch.from_numpy(rng.integers(1, VOCAB, n)) for n in lengths]
    labels = [torch.from_numpy(np.where(rng.random(n) < 0.2, -100, rng.integers(1, VOCAB, n))) for n in lengths]
    return seqs, labels


def poison_allocator(device):
    """Fill and free blocks of the sizes the outputs take, so unwritten output elements show as 0x5A bytes (small
    CPU blocks go back to malloc's free lists, not to the OS)."""
    bufs = [torch.full((n,), 0x5A, dtype=torch.uint8, device=device) for n in (64, 256, 1024, 4096) for _ in range(4)]
    del bufs


def reference_pass(seqs, labels, plan, index, rank, pad_id=0):
    """The pass's row built by hand (documents in plan order, empty ones skipped, first label of each masked,
    positions from 0), split by tests/cp_reference.py with the group's size and the rank's index in it."""
    ranks, docs = plan.passes[index]
    ids, lab, pos, cu = [], [], [], [0]
    for i in docs.tolist():
        n = len(seqs[i])
        if n == 0:
            continue
        ids += seqs[i].tolist()
        lab += [-100] + labels[i][1:].tolist()
        pos += list(range(n))
        cu.append(cu[-1] + n)
    c = len(ranks)
    mode = "zigzag" if c > 1 else "contiguous"
    ids, lab, pos = (torch.tensor(x, dtype=torch.int64) for x in (ids, lab, pos))
    ref, local_cu, padded_cu = reference_shard(ids, lab, pos, cu, c, rank - ranks.start, mode, pad_id)
    return ref, (local_cu if c > 1 else cu), (padded_cu if c > 1 else cu)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sizes", ["pow2", "any"])
def test_every_pass_and_rank_matches_the_reference_bit_for_bit(backend, sizes):
    device = on(backend)
    plan = mixed_plan() if sizes == "pow2" else any_size_plan()
    seqs, labels = make_sources(1, plan.lengths.tolist())
    for index, (ranks, _) in enumerate(plan.passes):
        for rank in ranks:
            poison_allocator(device)
            out = packkit.pack_context_parallel_pass(seqs, plan, index, rank, labels=labels, device=device,
                                                     backend=backend, pad_token_id=3)
            ref, local_cu, padded_cu = reference_pass(seqs, labels, plan, index, rank, pad_id=3)
            for key in ("input_ids", "labels", "shift_labels", "position_ids", "seq_idx"):
                assert out[key].shape == (1, plan.pass_local_tokens[index]), key
                assert out[key].device.type == torch.device(device).type, key
                assert out[key][0].cpu().to(torch.int64).tolist() == ref[key].tolist(), (index, rank, key)
            assert out["cu_seq_lens_q"].tolist() == local_cu and out["cu_seq_lens_k"] is out["cu_seq_lens_q"]
            assert out["cu_seqlens_padded"].tolist() == padded_cu
            assert out["max_length_q"] == out["max_length_k"] == max(np.diff(local_cu), default=0)
            assert out["local_cp_size"] == len(ranks) and out["cp_rank"] == rank - ranks.start
            if device != "cpu":  # the device path equals the CPU path, key by key
                cpu = packkit.pack_context_parallel_pass(seqs, plan, index, rank, labels=labels, pad_token_id=3)
                for key, value in cpu.items():
                    assert torch.equal(value, out[key].cpu()) if torch.is_tensor(value) else value == out[key], key


@pytest.mark.parametrize("source", ["host", "device"])
@pytest.mark.parametrize("backend", [pytest.param("cuda", marks=gpu_gate.needs_cuda_kernels),
                                     pytest.param("triton", marks=gpu_gate.needs_triton_gpu)])
def test_a_pass_on_the_gpu_needs_no_host_sync(backend, source):
    """Sequences from the host (a loader's) or already on the GPU: sizes come from the plan, never a read-back."""
    plan = mixed_plan()
    seqs, labels = make_sources(2)
    if source == "device":
        seqs, labels = [s.cuda() for s in seqs], [s.cuda() for s in labels]
    run = lambda: packkit.pack_context_parallel_pass(seqs, plan, 2, 5, labels=labels, device="cuda",  # noqa: E731
                                                     backend=backend)
    run()  # warm up: Triton compilation, the allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out["input_ids"].is_cuda and out["local_cp_size"] == 4 and out["cp_rank"] == 1


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 70), min_size=1, max_size=14), world=st.integers(1, 8),
       cap=st.integers(8, 48), cp_comm=st.sampled_from([0.0, 0.5, 4.0]), any_size=st.booleans())
def test_property_all_passes_and_ranks_cover_every_token_once(lengths, world, cap, cp_comm, any_size):
    try:
        plan = packkit.plan_context_parallel(lengths, world, cap, cp_comm=cp_comm, pass_overhead=0.5,
                                             cp_sizes="any" if any_size else "pow2")
    except ValueError:  # a sequence no allowed group holds at this cap: nothing to shard
        return
    seqs, labels = make_sources(sum(lengths) + world, lengths)
    seen = [np.zeros(n, np.int64) for n in lengths]
    for index, (ranks, docs) in enumerate(plan.passes):
        starts = np.concatenate(([0], np.cumsum([lengths[i] for i in docs.tolist()])))
        for rank in ranks:
            out, info = packkit.pack_context_parallel_pass(seqs, plan, index, rank, labels=labels, return_info=True)
            assert out["input_ids"].shape[1] == plan.pass_local_tokens[index] <= cap
            src = info.src_index.numpy()
            ids, lab, pos = (out[k][0].numpy() for k in ("input_ids", "shift_labels", "position_ids"))
            real = src >= 0
            assert (ids[~real] == 0).all() and (lab[~real] == -100).all()
            doc = np.searchsorted(starts, src[real], side="right") - 1  # the row's document of every real token
            for d, s, t, p, y in zip(doc.tolist(), src[real].tolist(), ids[real].tolist(), pos[real].tolist(),
                                     lab[real].tolist()):
                seq, offset = int(docs[d]), s - int(starts[d])
                seen[seq][offset] += 1
                assert t == int(seqs[seq][offset]) and p == offset  # the token, its global position
                # the next label of the same document, never the next document's
                assert y == (int(labels[seq][offset + 1]) if offset + 1 < lengths[seq] else -100)
    assert all((s == 1).all() for s in seen), "a token missing or sharded twice"


def test_iter_context_parallel_runs_a_ranks_passes_in_order():
    plan = mixed_plan()
    seqs, _ = make_sources(3)
    for rank in range(WORLD):
        got = list(packkit.iter_context_parallel(seqs, plan, rank, pad_token_id=1))
        want = plan.rank_passes(rank)
        assert [len(plan.passes[i][0]) for i, _ in got] == [len(group) for group, _, _ in want]
        for (index, batch), (group, cp_rank, docs) in zip(got, want):
            assert plan.passes[index][0] == group and np.array_equal(plan.passes[index][1], docs)
            assert batch["cp_rank"] == cp_rank and batch["local_cp_size"] == len(group)
            one = packkit.pack_context_parallel_pass(seqs, plan, index, rank, pad_token_id=1)
            assert all(torch.equal(v, batch[k]) if torch.is_tensor(v) else v == batch[k] for k, v in one.items())


def test_flat_source_equals_the_list():
    plan = mixed_plan()
    seqs, labels = make_sources(4)
    flat, flat_labels = torch.cat(seqs), torch.cat(labels)
    for index, (ranks, _) in enumerate(plan.passes):
        a = packkit.pack_context_parallel_pass(seqs, plan, index, ranks[-1], labels=labels)
        b = packkit.pack_context_parallel_pass(flat, plan, index, ranks[-1], labels=flat_labels)
        assert all(torch.equal(v, b[k]) if torch.is_tensor(v) else v == b[k] for k, v in a.items())


def test_bad_arguments_name_the_parameter():
    plan = mixed_plan()
    seqs, _ = make_sources(0)
    ranks = plan.passes[0][0]
    outside = next(r for r in range(WORLD) if r not in ranks)
    with pytest.raises(ValueError, match=rf"rank {outside} is not in pass 0's ranks {ranks.start}\.\.{ranks.stop - 1}"):
        packkit.pack_context_parallel_pass(seqs, plan, 0, outside)
    with pytest.raises(ValueError, match="rank must be < the plan's world_size"):
        packkit.pack_context_parallel_pass(seqs, plan, 0, WORLD)
    with pytest.raises(TypeError, match="rank must be an int"):
        packkit.pack_context_parallel_pass(seqs, plan, 0, 1.0)
    with pytest.raises(ValueError, match="pass_index must be <"):
        packkit.pack_context_parallel_pass(seqs, plan, plan.num_passes, 0)
    with pytest.raises(TypeError, match="pass_index must be an int"):
        packkit.pack_context_parallel_pass(seqs, plan, True, 0)
    with pytest.raises(TypeError, match="plan must be a packkit.ContextParallelPlan"):
        packkit.pack_context_parallel_pass(seqs, packkit.plan(LENGTHS, 128), 0, 0)
    with pytest.raises(ValueError, match="sequences has 17 sequences but the plan is for 18"):
        packkit.pack_context_parallel_pass(seqs[:-1], plan, 0, 0)
    short = list(seqs)
    short[0] = seqs[0][:-1]
    with pytest.raises(ValueError, match=r"sequences\[0\] has 85 tokens but the plan has lengths\[0\] = 86"):
        packkit.pack_context_parallel_pass(short, plan, 0, 0)
    with pytest.raises(ValueError, match="labels: a flat source must be 1-D with the plan's"):
        packkit.pack_context_parallel_pass(seqs, plan, 0, 0, labels=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(TypeError, match="sequences must be the list"):
        packkit.pack_context_parallel_pass("abc", plan, 0, 0)
    with pytest.raises(ValueError, match="rank must be >= 0"):
        packkit.iter_context_parallel(seqs, plan, -1)  # checked at the call, not at the first next()


# --- (b) ring attention over each pass's group, in one process ------------------------------------------------------
MASKED = -1e300  # finite: a fully masked block gets weight exp(MASKED - lse) = 0 exactly, and no NaN gradient


def ring_attention(q, k, v, doc, pos, scaling):
    """Each row r of ``[c, H, n, D]`` (one CP rank's local tokens) attends to the K/V blocks of all c rows in ring
    order (r, r-1, ...: the block rank r holds after s ring steps is rank r-s's), causal by (document, global
    position), merging each block into a running log-sum-exp and output (flash / ring attention's update)."""
    c = q.shape[0]
    outs = []
    for r in range(c):
        lse = out = None
        for step in range(c):
            src = (r - step) % c
            scores = torch.matmul(q[r], k[src].transpose(-1, -2)) * scaling  # [H, n, n]
            allowed = (doc[r][:, None] == doc[src][None, :]) & (pos[src][None, :] <= pos[r][:, None])
            scores = scores.masked_fill(~allowed, MASKED)
            block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            block = torch.matmul(torch.exp(scores - block_lse), v[src])
            if lse is None:  # the rank's own block: every query sees at least itself, so lse is finite
                lse, out = block_lse, block
            else:
                new = torch.logaddexp(lse, block_lse)
                out = torch.exp(lse - new) * out + torch.exp(block_lse - new) * block
                lse = new
        outs.append(out)
    return torch.stack(outs)


def group_batches(seqs, plan, index, cp_rank_of=None, **kw):
    """The group's batches of pass ``index`` in rank order; ``cp_rank_of[i]``: which group index rank i is given."""
    ranks, _ = plan.passes[index]
    order = list(range(len(ranks))) if cp_rank_of is None else cp_rank_of
    return [packkit.pack_context_parallel_pass(seqs, plan, index, ranks.start + order[i], return_info=True, **kw)
            for i in range(len(ranks))]


def _ring_outputs(plan, tables, seqs, swap=False):
    """Per sequence ``[H, L, D]`` outputs of ring attention over every pass, reassembled with
    unshard_context_parallel from the group's outputs in rank order (what an all-gather returns)."""
    q_t, k_t, v_t = tables
    heads, dim = q_t[0].shape[0], q_t[0].shape[2]
    result = {}
    for index, (ranks, docs) in enumerate(plan.passes):
        order = list(range(len(ranks)))
        if swap and len(ranks) > 1:
            order[0], order[1] = 1, 0
        batches = group_batches(seqs, plan, index, order)
        starts = np.concatenate(([0], np.cumsum([LENGTHS[i] for i in docs.tolist()])))
        row_doc = np.repeat(docs, np.diff(starts))
        row_off = np.arange(starts[-1]) - np.repeat(starts[:-1], np.diff(starts))
        local = []
        for out, info in batches:
            src = info.src_index.numpy()
            gen = torch.Generator().manual_seed(index)  # padding tokens: random values, to be masked out
            per = []
            for table in (q_t, k_t, v_t):
                x = torch.randn(len(src), heads, dim, generator=gen, dtype=torch.float64)
                for t in np.flatnonzero(src >= 0).tolist():
                    x[t] = table[row_doc[src[t]]][:, row_off[src[t]]]
                per.append(x.transpose(0, 1))  # [H, n, D]
            local.append(per)
        q, k, v = (torch.stack([p[j] for p in local]) for j in range(3))
        doc = torch.stack([o["seq_idx"][0] for o, _ in batches])
        pos = torch.stack([o["position_ids"][0] for o, _ in batches])
        att = ring_attention(q, k, v, doc, pos, dim ** -0.5)  # [c, H, n, D]
        gathered = att.permute(0, 2, 1, 3).reshape(len(ranks), -1, heads * dim)
        row = packkit.unshard_context_parallel(gathered, batches[0][1]).reshape(-1, heads, dim)  # [T, H, D]
        for i, a, b in zip(docs.tolist(), starts[:-1], starts[1:]):
            result[i] = row[a:b].transpose(0, 1)
    return result


def test_ring_attention_over_each_group_equals_per_document_attention():
    plan = mixed_plan()
    seqs, _ = make_sources(5)
    gen = torch.Generator().manual_seed(0)
    heads, dim = 2, 8
    tables = tuple([torch.randn(heads, n, dim, generator=gen, dtype=torch.float64) for n in LENGTHS] for _ in range(3))
    ring = _ring_outputs(plan, tables, seqs)
    swapped = _ring_outputs(plan, tables, seqs, swap=True)
    worst_swapped = 0.0
    for i, n in enumerate(LENGTHS):
        q, k, v = (t[i] for t in tables)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        scores = (q @ k.transpose(-1, -2) * dim ** -0.5).masked_fill(~causal, float("-inf"))
        ref = torch.softmax(scores, dim=-1) @ v
        # Both are convex combinations of v's rows computed in fp64 with O(n + D + c) roundings each (dot products,
        # the softmax sum, c log-sum-exp merges): |difference| <= ~(n + D + 4c) * 2**-53 * max|v| < 2e-14 * max|v|
        # here (n <= 86, c <= 4), whatever the summation order or vector width; 1e-12 leaves 50x headroom.
        scale = float(v.abs().max()) if n else 1.0
        assert ring[i].shape == ref.shape and torch.allclose(ring[i], ref, rtol=0, atol=1e-12 * scale), i
        if n:
            worst_swapped = max(worst_swapped, float((swapped[i] - ref).abs().max()) / scale)
    # The control: two ranks of every group swap cp_rank, so the all-gather order no longer matches the shards
    # unshard expects (a rank that takes its group index from the wrong place).
    assert worst_swapped > 1e-2, worst_swapped


# --- (c) a tiny fp64 Llama over all passes, attention a ring across the group's rows -------------------------------
CTX: dict = {}


def _ring_llama_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention: the batch's rows are one pass's CP ranks (queries, keys [c, H, n, D])."""
    heads = query.shape[1]
    if key.shape[1] != heads:  # grouped-query attention
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    out = ring_attention(query, key, value, CTX["doc"], CTX["pos"], scaling)
    return out.transpose(1, 2).contiguous(), None


@pytest.fixture
def fp64_llamas(monkeypatch):
    pytest.importorskip("transformers")
    from transformers import AttentionInterface

    from llama_helpers import tiny_llama
    from model_zoo import fp64_everywhere

    AttentionInterface.register("packkit_cp_pass_ring", _ring_llama_attention)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add contention
    ring = tiny_llama(seed=0, attn="packkit_cp_pass_ring", dtype=torch.float64)
    reference = tiny_llama(seed=0, attn="sdpa", dtype=torch.float64)
    # Patches the Llama classes both models share: RMSNorm / rotary would round to fp32 in the comparison otherwise.
    fp64_everywhere(ring, monkeypatch)
    yield ring, reference
    torch.set_num_threads(threads)


def _loss_and_grads(model, run):
    model.zero_grad(set_to_none=True)
    loss = run()
    loss.backward()
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _rel(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) / max(float(b[n].abs().max()), 1e-300) for n in a)


def test_llama_loss_and_gradients_over_all_passes_equal_per_document(fp64_llamas):
    ring_model, ref_model = fp64_llamas
    plan = mixed_plan()
    seqs, _ = make_sources(6)
    count = sum(max(n - 1, 0) for n in LENGTHS)  # predicted tokens of the whole batch: every rank's denominator

    def reference():
        total = 0.0
        for s in seqs:
            if len(s) > 1:
                logits = ref_model(input_ids=s[None], use_cache=False).logits[0]
                total = total + torch.nn.functional.cross_entropy(logits[:-1], s[1:], reduction="sum")
        return total / count

    def over_passes(cp_rank_of=None):
        def run():
            total, predicted = 0.0, 0
            for index, (ranks, _) in enumerate(plan.passes):
                order = cp_rank_of(len(ranks)) if cp_rank_of else None
                batches = [b for b, _ in group_batches(seqs, plan, index, order)]
                CTX["doc"] = torch.cat([b["seq_idx"] for b in batches])
                CTX["pos"] = torch.cat([b["position_ids"] for b in batches])
                logits = ring_model(input_ids=torch.cat([b["input_ids"] for b in batches]), position_ids=CTX["pos"],
                                    use_cache=False).logits
                target = torch.cat([b["shift_labels"] for b in batches])
                predicted += int((target != -100).sum())
                total = total + torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                                  target.reshape(-1), reduction="sum")
            assert cp_rank_of or predicted == count
            return total / count
        return run

    ref_loss, ref_grads = _loss_and_grads(ref_model, reference)
    loss, grads = _loss_and_grads(ring_model, over_passes())
    # fp64 throughout (fp64_everywhere): the two differ by summation order only; measured ~1e-15.
    assert abs(loss - ref_loss) <= 1e-10 * abs(ref_loss) and _rel(grads, ref_grads) <= 1e-10, (loss, ref_loss)
    # The control: in every group wider than 1, rank 1 is given cp_rank 0 (its shard duplicates rank 0's, and
    # rank 1's tokens are never trained on).
    bad_loss, bad_grads = _loss_and_grads(ring_model, over_passes(lambda c: [0, 0, *range(2, c)] if c > 1 else None))
    assert abs(bad_loss - ref_loss) > 1e-3 * abs(ref_loss) and _rel(bad_grads, ref_grads) > 1e-3, bad_loss


def test_pack_context_parallel_takes_a_pass_by_position_or_keyword():
    """The issue's name: pack_context_parallel(sequences, cp_plan, pass_index, rank) is the pass's batch, as is
    plan=, pass_index=, rank=; the static form is unchanged; mixing the two is refused by name."""
    lengths = [5, 40, 3, 12, 70, 9]
    seqs = [torch.arange(1, n + 1) for n in lengths]
    plan = packkit.plan_context_parallel(lengths, 4, 32)
    for index, (ranks, _) in enumerate(plan.passes):
        for rank in ranks:
            want = packkit.pack_context_parallel_pass(seqs, plan, index, rank)
            for got in (packkit.pack_context_parallel(seqs, plan, index, rank),
                        packkit.pack_context_parallel(seqs, plan=plan, pass_index=index, rank=rank)):
                assert got.keys() == want.keys()
                for key in want:
                    assert torch.equal(got[key], want[key]) if torch.is_tensor(want[key]) else got[key] == want[key]
    static = packkit.pack_context_parallel(seqs, 2, 1, "zigzag")
    fused = packkit.context_parallel.fused.pack_context_parallel(seqs, 2, 1, "zigzag")
    assert all(torch.equal(static[k], fused[k]) if torch.is_tensor(fused[k]) else static[k] == fused[k] for k in fused)
    with pytest.raises(ValueError, match="capacity= is an option of static CP"):
        packkit.pack_context_parallel(seqs, plan, 0, plan.passes[0][0].start, capacity=64)
    with pytest.raises(ValueError, match="pass_index= and rank= select a pass"):
        packkit.pack_context_parallel(seqs, 2, 0, pass_index=0)
    with pytest.raises(TypeError, match="needs cp_size and cp_rank"):
        packkit.pack_context_parallel(seqs)
    with pytest.raises(TypeError, match="needs pass_index and rank"):
        packkit.pack_context_parallel(seqs, plan=plan, pass_index=0)
    with pytest.raises(ValueError, match="not cp_size / cp_rank"):
        packkit.pack_context_parallel(seqs, 2, 0, plan=plan, pass_index=0, rank=0)
