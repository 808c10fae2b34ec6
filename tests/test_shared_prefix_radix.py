"""The C++ radix build of ``build_tree`` (``csrc/planner/prefix_forest.cpp``) against the Python reference
(``build_tree_reference``): the same forest, array for array, over random token trees, groups, empty and
duplicate sequences, and every input form (lists, numpy, tensors, flat + lengths); per-token labels through
shared nodes; bad input refused by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from packkit import shared_prefix as sp
from packkit.shared_prefix.radix import build_tree_reference

pytestmark = pytest.mark.core

seqs = st.lists(st.lists(st.integers(0, 3), max_size=8), min_size=0, max_size=12)


def assert_same_forest(got, want):
    for field in ("parent", "length", "src", "seq_node", "score_start", "seq_group"):
        assert np.asarray(getattr(got, field)).tolist() == np.asarray(getattr(want, field)).tolist(), field
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.tokens.dtype == torch.int64


@settings(max_examples=300, deadline=None)
@given(seqs, st.integers(0, 3), st.booleans())
def test_cpp_build_equals_the_python_reference(sequences, ngroups, grouped):
    groups = [(i * 7 + 3) % (ngroups + 1) * 5 - 2 for i in range(len(sequences))] if grouped else None
    want = build_tree_reference(sequences, groups)
    assert_same_forest(sp.build_tree(sequences, groups), want)
    lens = [len(s) for s in sequences]
    flat = [t for s in sequences for t in s]
    # numpy items, tensor items, flat numpy / tensor + lengths: one forest
    assert_same_forest(sp.build_tree([np.array(s, np.int32) for s in sequences], groups), want)
    assert_same_forest(sp.build_tree([torch.tensor(s, dtype=torch.int64) for s in sequences], groups), want)
    assert_same_forest(sp.build_tree(np.array(flat, np.int64), groups, lengths=lens), want)
    assert_same_forest(sp.build_tree(torch.tensor(flat, dtype=torch.int64), groups, lengths=lens), want)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(1, 6)), min_size=1, max_size=30))
def test_deep_multi_turn_trees_equal_the_reference(steps):
    """Trajectories grown turn by turn with branching (the agent shape), in a shuffled order."""
    rng = np.random.default_rng(len(steps))
    trajs = [[9, 9, 9]]
    for parent, token, length in steps:
        base = trajs[parent % len(trajs)]
        trajs.append(base + [token] * length + rng.integers(0, 4, 2).tolist())
    order = rng.permutation(len(trajs))
    trajs = [trajs[i] for i in order]
    assert_same_forest(sp.build_tree(trajs), build_tree_reference(trajs))
    groups = [i % 2 for i in range(len(trajs))]
    assert_same_forest(sp.build_tree(trajs, groups), build_tree_reference(trajs, groups))


def test_many_roots_and_long_chains():
    """Ungrouped roots keyed by first token (thousands of them) and a chain of nested prefixes."""
    rng = np.random.default_rng(0)
    trajs = [rng.integers(0, 5000, int(rng.integers(1, 6))).tolist() for _ in range(3000)]
    assert_same_forest(sp.build_tree(trajs), build_tree_reference(trajs))
    chain = [list(range(k)) for k in range(200, 0, -1)]
    assert_same_forest(sp.build_tree(chain), build_tree_reference(chain))


def test_score_from_and_empty_input():
    assert_same_forest(sp.build_tree([[1, 2, 3], [1, 2]], score_from=[2, 0]),
                       build_tree_reference([[1, 2, 3], [1, 2]], score_from=[2, 0]))
    empty = sp.build_tree([])
    assert empty.num_nodes == 0 and empty.num_sequences == 0 and empty.tokens.numel() == 0


@pytest.mark.parametrize("sequences, kwargs, error, match", [
    ([[1, True]], {}, TypeError, r"sequences\[0\] holds a bool"),
    ([[1, 2.5]], {}, TypeError, r"sequences\[0\]\[1\] is a float: every element must be an integer token id"),
    ([[1], [2, -3]], {}, ValueError, r"sequences\[1\]\[1\] is -3: token ids index the embedding"),
    ([[1], [2**64]], {}, TypeError, r"sequences\[1\]\[0\] does not fit in int64"),
    (np.array([1, 2, 3]), {"lengths": [1, 1]}, ValueError, "lengths sum to 2 but sequences has 3 tokens"),
    (np.array([1, -2, 3]), {"lengths": [1, 2]}, ValueError, r"sequences\[1\] \(sequence 1\) is -2"),
    (np.array([1.0, 2.0]), {"lengths": [2]}, TypeError, "integer token ids, got dtype float64"),
    (np.array([1, 2]), {"lengths": [3, -1]}, ValueError, r"lengths\[1\] is -1"),
    ("abc", {}, TypeError, "sequences must be a list"),
])
def test_bad_sequences_are_refused_by_name(sequences, kwargs, error, match):
    with pytest.raises(error, match=match):
        sp.build_tree(sequences, **kwargs)
