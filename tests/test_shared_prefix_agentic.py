"""Agent trajectories through the tree with per-token labels (issue 49): interleaved assistant turns (scored) and
tool output (label -100) give the log-probs, PPO-style loss and gradients of each trajectory run alone, in fp64, on
a tiny random-init Llama and Qwen3; a reference that scores a tool turn disagrees (the control); labels that disagree
on a shared node, ragged labels and labels that are not the token are refused by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from packkit import shared_prefix as sp
from shared_prefix_models import VOCAB, fp64_norms, tiny

pytestmark = [pytest.mark.core, pytest.mark.exactness]

IGNORE = -100


def trajectories(seed=0, n=7, turns=3):
    """A system prompt, then turns of (assistant tokens, tool tokens) on a branching tree; labels score the
    assistant tokens only. Equal paths give equal tokens and labels."""
    rng = np.random.default_rng(seed)
    system = rng.integers(1, VOCAB, 6).tolist()
    nodes, seqs, labels = {}, [], []
    for _ in range(n):
        path, toks, labs = (), list(system), [IGNORE] * len(system)
        for _t in range(int(rng.integers(1, turns + 1))):
            path += (int(rng.integers(2)),)
            if path not in nodes:
                a = rng.integers(1, VOCAB, int(rng.integers(1, 4))).tolist()
                tool = rng.integers(1, VOCAB, int(rng.integers(0, 3))).tolist()
                nodes[path] = (a + tool, a + [IGNORE] * len(tool))
            toks, labs = toks + nodes[path][0], labs + nodes[path][1]
        seqs.append(toks)
        labels.append(labs)
    return seqs, labels


def alone(model, head, seq, labs):
    """One trajectory run alone: log-prob and value (before the token) of every labelled token, in order."""
    ids = torch.tensor([seq])
    out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
    logp = torch.log_softmax(out.logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
    values = head(out.hidden_states[-1][0])[:, 0]
    scored = [j for j in range(1, len(seq)) if labs[j] != IGNORE]
    return logp[[j - 1 for j in scored]], values[[j - 1 for j in scored]], scored


def per_trajectory_loss(model, head, seqs, labels, adv, old_shift, returns):
    """PPO token-mean over every scored token of every trajectory, each trajectory forwarded alone."""
    terms, count = [], 0
    for s, (seq, labs) in enumerate(zip(seqs, labels)):
        logp, values, scored = alone(model, head, seq, labs)
        ratio = torch.exp(logp - (logp.detach() + old_shift))
        pol = -torch.minimum(ratio * adv[s], ratio.clamp(0.8, 1.2) * adv[s])
        val = 0.5 * 0.5 * (values - returns) ** 2
        terms.append((pol + val).sum())
        count += len(scored)
    return torch.stack(terms).sum() / count


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_labelled_trajectories_equal_each_run_alone_fp64(kind, monkeypatch):
    fp64_norms(monkeypatch)
    model = tiny(kind)
    torch.manual_seed(1)
    head = torch.nn.Linear(model.config.hidden_size, 1, dtype=torch.float64)
    seqs, labels = trajectories()
    batch, info = sp.pack_tree(seqs, labels=labels)
    assert info.tokens_forwarded < info.tokens_unshared  # the trajectories do share prefixes
    model.set_attn_implementation(sp.register_attention())
    out = model(**batch, use_cache=False, output_hidden_states=True)
    lp = sp.completion_logprobs(out.logits, info)
    values, vmask = sp.completion_values(head(out.hidden_states[-1])[..., 0], info)
    assert torch.equal(vmask, lp.mask)
    model.set_attn_implementation("sdpa")
    start = info.forest.score_start
    for s, (seq, labs) in enumerate(zip(seqs, labels)):
        want_lp, want_v, scored = alone(model, head, seq, labs)
        cols = [j - int(start[s]) for j in scored]
        assert lp.mask[s].nonzero().flatten().tolist() == cols  # exactly the labelled tokens, no tool token
        torch.testing.assert_close(lp.padded[s, cols], want_lp, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(values[s, cols], want_v, rtol=1e-10, atol=1e-12)

    # PPO loss with old log-probs and a value head: the same gradients as the per-trajectory loss.
    adv = torch.linspace(-1.0, 1.0, len(seqs), dtype=torch.float64)
    old_shift, returns = 0.05, 0.3
    params = list(model.parameters()) + list(head.parameters())

    def grads(loss):
        return torch.autograd.grad(loss, params)

    model.set_attn_implementation(sp.register_attention())
    out = model(**batch, use_cache=False, output_hidden_states=True)
    lp = sp.completion_logprobs(out.logits, info)
    values, _ = sp.completion_values(head(out.hidden_states[-1])[..., 0], info)
    old = (lp.padded.detach() + old_shift).masked_fill(~lp.mask, 0)
    loss = sp.ppo_token_mean_loss(lp, adv, old, values=values, returns=torch.full_like(values, returns),
                                  value_coef=0.5)
    got = grads(loss)
    model.set_attn_implementation("sdpa")
    ref_loss = per_trajectory_loss(model, head, seqs, labels, adv, old_shift, returns)
    want = grads(ref_loss)
    torch.testing.assert_close(loss.detach(), ref_loss.detach(), rtol=1e-10, atol=0)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)

    # Control: a reference that also scores the tool output disagrees with the packed loss (the check can fail).
    scored_tools = [[t if j else IGNORE for j, t in enumerate(seq)] for seq in seqs]
    with torch.no_grad():
        bad = per_trajectory_loss(model, head, seqs, scored_tools, adv, old_shift, returns)
    assert abs(float(bad) - float(loss.detach())) > 1e-4


def test_shared_nodes_must_agree_on_labels_and_bad_labels_are_refused():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5]]
    with pytest.raises(ValueError, match=r"sequences 0 and 1 share token 2 .*labels differ there \(3 vs -100\)"):
        sp.pack_tree(seqs, labels=[[-100, 2, 3, 4], [-100, 2, -100, 5]])
    with pytest.raises(ValueError, match=r"labels\[1\] has 3 labels but sequences\[1\] has 4 tokens"):
        sp.build_tree(seqs, labels=[[1, 2, 3, 4], [1, 2, 3]])
    with pytest.raises(ValueError, match="labels has 1 entries but there are 2 sequences"):
        sp.build_tree(seqs, labels=[[1, 2, 3, 4]])
    with pytest.raises(ValueError, match=r"labels\[0\]\[3\] is 9 but sequences\[0\]\[3\] is token 4"):
        sp.build_tree(seqs, labels=[[1, 2, 3, 9], [1, 2, 3, 5]])
    with pytest.raises(TypeError, match=r"labels\[0\] holds a bool"):
        sp.build_tree(seqs, labels=[[True, 2, 3, 4], [1, 2, 3, 5]])
    with pytest.raises(ValueError, match="labels and score_from"):
        sp.build_tree(seqs, labels=[[1, 2, 3, 4], [1, 2, 3, 5]], score_from=[1, 1])
    forest = sp.build_tree(seqs)
    with pytest.raises(ValueError, match="PrefixForest and labels"):
        sp.pack_tree(forest, labels=[[1, 2, 3, 4], [1, 2, 3, 5]])
    # Agreeing labels: shared tokens labelled once; a sequence with no label scores nothing.
    f = sp.build_tree(seqs + [[7, 8]], labels=[[-100, 2, 3, 4], [-100, 2, 3, 5], [-100, -100]])
    assert f.labels.tolist() == [-100, 2, 3, 4, 5, -100, -100]
    assert f.score_start.tolist() == [1, 1, 2]
    _, info = sp.pack_tree(seqs + [[7, 8]], labels=[[-100, 2, 3, 4], [-100, 2, 3, 5], [-100, -100]])
    assert info.score.counts.tolist() == [3, 3, 0]
    assert info.valid.tolist() == [True] * 6
    # flat tokens + lengths, labels flat too
    flat = sp.build_tree(np.array([1, 2, 3, 4, 1, 2, 3, 5]), labels=np.array([-100, 2, 3, 4, -100, 2, 3, 5]),
                         lengths=[4, 4])
    assert flat.labels.tolist() == [-100, 2, 3, 4, 5]
    # an empty trajectory list is an empty batch
    batch, info = sp.pack_tree([], labels=[])
    assert tuple(batch["input_ids"].shape) == (1, 0) and info.num_sequences == 0


def test_agent_trees_planned_across_ranks():
    """pack_tree(..., capacity, dp_size): many small trees balance to <= 1.01; a tree larger than a row is split at
    node boundaries, each part re-carrying its ancestors (reported); every trajectory reads back at its positions;
    a trajectory longer than capacity is refused with overlong='error'."""
    rng = np.random.default_rng(3)
    trajs, labels, groups = [], [], []
    for task in range(48):
        seqs, labs = trajectories(seed=task, n=6)
        trajs += seqs
        labels += labs
        groups += [task] * len(seqs)
    batch, info = sp.pack_tree(trajs, groups, labels=labels, capacity=64, dp_size=4, algorithm="ogbfd")
    plan = info.plan.plan
    assert plan.balance <= 1.01, plan.balance
    assert info.plan.report.copied_tokens == 0
    flat = batch["input_ids"].reshape(-1)
    for s in range(len(trajs)):
        assert flat[torch.from_numpy(info.layout.seq_positions[s])].tolist() == trajs[s]
    # One big tree over a row: split at node boundaries, ancestors (the system prompt) re-carried and reported.
    seqs, labs = trajectories(seed=1, n=40, turns=3)
    unique = int(sp.build_tree(seqs).length.sum())
    capacity = max(map(len, seqs)) + 4
    assert unique > capacity
    batch, info = sp.pack_tree(seqs, labels=labs, capacity=capacity, dp_size=2)
    report = info.plan.report
    assert report.split_groups and report.copied_tokens > 0
    assert info.tokens_forwarded == unique + report.copied_tokens
    flat = batch["input_ids"].reshape(-1)
    for s in range(len(seqs)):
        assert flat[torch.from_numpy(info.layout.seq_positions[s])].tolist() == seqs[s]
    assert info.score.counts.sum() > 0
    with pytest.raises(ValueError, match="shared prefix of 6 tokens .* no room for its continuations in capacity=5"):
        sp.pack_tree(seqs, labels=labs, capacity=5)
    with pytest.raises(ValueError, match="sequence 1 needs 9 tokens .* more than capacity=8; raise capacity or pass "
                                         "overlong='truncate'"):
        sp.pack_tree([[1, 2, 3], [4] * 9], labels=[[-100, 2, 3], [4] * 9], capacity=8)
    del rng
