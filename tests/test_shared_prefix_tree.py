"""Prefix forests, tree planning and the packed layout: properties over random groups and token trees.

* ``build_tree`` stores every distinct prefix exactly once (the radix trie's token count) and every sequence
  reads back exactly; ``groups_forest`` keeps the order given.
* Planning never loses or duplicates a sequence, keeps every tree that fits whole, splits one that does not
  into sub-trees that each re-carry the prompt and fit, and reports splits and truncations.
* ``pack_groups`` / ``pack_tree``: every sequence's tokens sit at its packed positions with the positions it
  would have alone; bad input is a clear error.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from packkit import shared_prefix as sp
from packkit.shared_prefix.planning import split_oversized, tree_costs

pytestmark = pytest.mark.core

tokens = st.integers(1, 4)  # a tiny vocabulary makes shared prefixes likely
seqs = st.lists(st.lists(tokens, max_size=7), min_size=1, max_size=9)


def distinct_prefixes(sequences, groups=None) -> int:
    groups = [0] * len(sequences) if groups is None else groups
    return len({(g, tuple(s[:k])) for s, g in zip(sequences, groups) for k in range(1, len(s) + 1)})


@settings(max_examples=150, deadline=None)
@given(seqs, st.booleans(), st.integers(0, 3))
def test_build_tree_stores_each_prefix_once_and_reads_back(sequences, grouped, ngroups):
    groups = [i % (ngroups + 1) for i in range(len(sequences))] if grouped else None
    forest = sp.build_tree(sequences, groups)
    assert (forest.parent < np.arange(forest.num_nodes)).all()  # preorder
    for s, seq in enumerate(sequences):
        assert forest.sequence_tokens(s).tolist() == seq
    assert int(forest.length.sum()) == distinct_prefixes(sequences, groups)
    if grouped:  # one tree per group, in order of first appearance
        assert len(forest.roots()) == len(set(groups))
        assert forest.seq_group.tolist() == groups


def test_build_tree_multi_turn_shape():
    system, u1, a1 = [1, 2, 3], [4, 5], [6]
    convs = [system + u1 + a1 + [7, 8], system + u1 + a1 + [9], system + [10, 11], system + u1 + a1 + [7, 8]]
    f = sp.build_tree(convs)
    assert f.length.tolist() == [3, 3, 2, 1, 2]  # system; u1+a1; [7, 8]; [9]; [10, 11]
    assert f.parent.tolist() == [-1, 0, 1, 1, 0]
    assert f.seq_node.tolist() == [2, 3, 4, 2]  # duplicates end at the same node
    assert f.depth().tolist() == [0, 1, 2, 2, 1]


groups_st = st.lists(st.tuples(st.integers(0, 9), st.lists(st.integers(0, 9), min_size=1, max_size=6)),
                     min_size=1, max_size=6)


def make_groups(spec, seed=0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, 50, p).tolist() for p, _ in spec]
    completions = [[rng.integers(1, 50, c).tolist() for c in cs] for _, cs in spec]
    return prompts, completions


@settings(max_examples=150, deadline=None)
@given(groups_st, st.integers(18, 40))
def test_planning_splits_only_what_does_not_fit(spec, capacity):
    prompts, completions = make_groups(spec)
    forest = sp.groups_forest(prompts, completions)
    report = split_oversized(forest, capacity)
    f = report.forest
    for s in range(forest.num_sequences):  # nothing lost, nothing changed
        assert f.sequence_tokens(s).tolist() == forest.sequence_tokens(s).tolist()
    assert (f.tree_tokens() <= capacity).all()
    for g, (p, cs) in enumerate(spec):
        if p + sum(cs) <= capacity:
            assert g not in report.split_groups
        else:  # fewest sub-groups: at least the bound, each re-carrying the prompt
            bound = -(-sum(cs) // (capacity - p))
            k = report.split_groups.get(g, 1)
            assert bound <= k <= -(-11 * bound // 9) + 1  # first-fit decreasing's guarantee against the optimum
    copies = sum((k - 1) * spec[g][0] for g, k in report.split_groups.items())
    assert report.copied_tokens == copies
    plan = sp.plan_trees(forest, capacity)
    placed = np.sort(np.concatenate(plan.rows))
    assert placed.tolist() == plan.forest.roots().tolist()  # every tree in exactly one row


def test_overlong_group_member_policies():
    prompts, completions = [[1] * 6], [[[2] * 3, [3] * 9]]
    with pytest.raises(ValueError, match="sequence 1 needs 15 tokens"):
        sp.plan_trees(sp.groups_forest(prompts, completions), 10)
    plan = sp.plan_trees(sp.groups_forest(prompts, completions), 10, overlong="truncate")
    assert plan.report.truncated == {1: (10, 15)}
    assert plan.report.forest.sequence_tokens(1).tolist() == [1] * 6 + [3] * 4
    with pytest.raises(ValueError, match="unknown overlong policy 'drop'"):
        sp.plan_trees(sp.groups_forest(prompts, completions), 10, overlong="drop")
    with pytest.raises(ValueError, match="leaves no room"):
        sp.plan_trees(sp.groups_forest([[1] * 10], [[[2], [3]]]), 10)


def test_tree_cost_of_a_chain_is_the_sequence_cost_and_branches_add_only_their_part():
    forest = sp.groups_forest([[1] * 5], [[[2] * 3]])
    assert tree_costs(forest, (2.0, 3.0)).tolist() == [2.0 * 8 + 3.0 * 64]
    forest = sp.groups_forest([[1] * 5], [[[2] * 3, [3] * 2]])
    assert tree_costs(forest, (0.0, 1.0)).tolist() == [25 + (64 - 25) + (49 - 25)]
    verl = lambda x: 24576 * x + x ** 2  # noqa: E731  (a callable on lengths telescopes the same way)
    assert tree_costs(forest, verl).tolist() == [24576 * 10 + 25 + 39 + 24]


@settings(max_examples=60, deadline=None)
@given(groups_st, st.sampled_from([None, 12, 25]))
def test_packed_tokens_and_positions_are_each_sequence_alone(spec, capacity):
    prompts, completions = make_groups(spec, seed=1)
    batch, info = sp.pack_groups(prompts, completions, capacity=capacity, overlong="truncate")
    ids = batch["input_ids"].reshape(-1)
    pos = batch["position_ids"].reshape(-1)
    f = info.forest
    for s in range(f.num_sequences):
        where = torch.from_numpy(info.layout.seq_positions[s])
        assert ids[where].tolist() == f.sequence_tokens(s).tolist()
        assert pos[where].tolist() == list(range(len(where)))
    if capacity is None:
        assert tuple(ids.shape) == (sum(p + sum(cs) for p, cs in spec),)
    assert info.tokens_forwarded == int(info.layout.length.sum())


def test_pack_tree_multi_level():
    convs = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 9], [1, 2, 3, 10, 11], [12]]
    batch, info = sp.pack_tree(convs, score_from=[6, 6, 3, 0])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 6, 3, 4, 0]]
    assert info.score.counts.tolist() == [2, 1, 2, 1]
    assert info.tokens_unshared == 8 + 7 + 5 + 1


@pytest.mark.parametrize("prompts, completions, error, match", [
    ([[1]], [[[2]], [[3]]], ValueError, "prompts has 1 groups but completions has 2"),
    ([[1]], [[]], ValueError, "group 0 has no completions"),
    ([[1]], [[[2.5]]], TypeError, "integer token id"),
    ([[1]], [[torch.ones(2, 2, dtype=torch.long)]], ValueError, "1-D token sequence"),
    ([[1]], [torch.tensor([1, 2])], TypeError, "completions\\[0\\] must be a list"),
    ("abc", [[[1]]], TypeError, "prompts must be a list"),
    ([torch.tensor([1.0, 2.0])], [[[3]]], TypeError, "integer token ids, got dtype torch.float32"),
    ([[1]], [[torch.tensor([True])]], TypeError, "integer token ids, got dtype torch.bool"),
])
def test_bad_group_input_is_refused(prompts, completions, error, match):
    with pytest.raises(error, match=match):
        sp.pack_groups(prompts, completions)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        sp.pack_groups([[1]], [[[2]]], capacity=0)
    with pytest.raises(ValueError, match="unknown attention 'fast'"):
        sp.pack_groups([[1]], [[[2]]], attention="fast")
    with pytest.raises(ValueError, match="labels\\[0\\]\\[0\\] has 1 tokens"):
        sp.pack_groups([[1]], [[[2, 3]]], labels=[[[2]]])
    with pytest.raises(ValueError, match="group_ids must be 2 integers"):
        sp.build_tree([[1], [2]], group_ids=["a", "b"])
    with pytest.raises(ValueError, match="score_from\\[0\\] = 5 is outside"):
        sp.build_tree([[1], [2]], score_from=[5, 0])


def test_rl_micro_batches_take_whole_trees_with_tree_costs():
    prompts, completions = make_groups([(9, [5, 9, 3]), (4, [9] * 6), (0, [2]), (7, [1, 1])], seed=4)
    forest = sp.groups_forest(prompts, completions)
    plan, f = sp.tree_micro_batches(forest, 40, dp_size=2, cost=(1.0, 0.01))
    trees = np.concatenate([np.concatenate(rank) for rank in plan.indices])
    assert sorted(trees.tolist()) == list(range(len(f.roots())))  # every (sub-)tree once
    assert plan.tokens.max() <= 40
    assert np.allclose(plan.costs.sum(), tree_costs(f, (1.0, 0.01)).sum())
