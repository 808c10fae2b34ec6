"""``packkit.plan`` on float sizes: nf / ffd / bfd with LightBinPack 0.1.1's semantics (its example_pack.py passes
floats), a TypeError naming the integer requirement for obfd / ogbfd. Checked against a naive reference of those
semantics (one scan over the open bins per item) and, where it is installed, against LightBinPack itself."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from packkit.planning.float_plan import FloatPlan

pytestmark = pytest.mark.core


def reference(sizes, capacity, algorithm):
    """LightBinPack's nf / ffd / bfd, naively: rooms compared exactly, rooms computed as it does."""
    sizes = [float(x) for x in sizes]
    if algorithm == "nf":
        bins, room = [], capacity
        for i, s in enumerate(sizes):
            if not bins or s > room:
                bins.append([])
                room = capacity
            bins[-1].append(i)
            room -= s
        return bins
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i], i), reverse=True)
    bins, rooms, since = [], [], []  # since: when a bin's room was last set (first come first served)
    for t, i in enumerate(order):
        s = sizes[i]
        fits = [b for b in range(len(bins)) if rooms[b] >= s]
        if fits:
            b = fits[0] if algorithm == "ffd" else min(fits, key=lambda b: (rooms[b], since[b]))
            rooms[b] -= s
            bins[b].append(i)
        else:
            b = len(bins)
            bins.append([i])
            rooms.append(capacity - s)
            since.append(0)
        since[b] = t
    return bins


SIZES = st.lists(st.one_of(st.floats(0, 10, allow_nan=False), st.sampled_from([0.5, 1.0, 2.5, 3.0, 10.0])),
                 max_size=60)


@settings(max_examples=200, deadline=None)
@given(sizes=SIZES, capacity=st.sampled_from([10.0, 12.5, 17.3]), algorithm=st.sampled_from(["nf", "ffd", "bfd"]))
def test_float_bins_are_lightbinpacks_semantics(sizes, capacity, algorithm):
    plan = packkit.plan(sizes, capacity, algorithm=algorithm)
    assert isinstance(plan, FloatPlan)
    bins = [b.tolist() for b in plan.bins]
    assert bins == reference(sizes, capacity, algorithm)
    assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
    assert all(plan.bin_sizes <= capacity + 1e-9)
    assert plan.num_bins >= plan.lower_bound


@pytest.mark.skipif(importlib.util.find_spec("lightbinpack") is None, reason="lightbinpack is not installed")
@settings(max_examples=200, deadline=None)
@given(sizes=SIZES.filter(len), capacity=st.floats(10, 40), algorithm=st.sampled_from(["nf", "ffd", "bfd"]))
def test_float_bins_equal_lightbinpacks_own(sizes, capacity, algorithm):
    import lightbinpack

    ours = [b.tolist() for b in packkit.plan(sizes, capacity, algorithm=algorithm).bins]
    assert ours == getattr(lightbinpack, algorithm)(sizes, capacity)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 100), max_size=80), algorithm=st.sampled_from(["ffd", "bfd"]))
def test_integer_valued_floats_fill_bins_like_the_integer_planner(lengths, algorithm):
    """Equal sizes are interchangeable: ffd's bins hold the same size multisets as the C++ planner's (which leaves
    zero lengths out of its bins). bfd may break a tie between two bins of equal room either way (lengths 1, 32, 38,
    57, 63: the 1 joins 63 + 32 or 57 + 38); either choice leaves the same multiset of rooms, so the bin count and
    the sorted bin loads are the same."""
    floats = packkit.plan([float(x) for x in lengths], 100.0, algorithm=algorithm)
    ints = packkit.plan(lengths, 100, algorithm=algorithm)
    sizes = np.asarray(lengths)
    ours = [b for b in sorted(sorted(int(sizes[i]) for i in b if sizes[i]) for b in floats.bins) if b]
    theirs = sorted(sorted(int(sizes[i]) for i in b) for b in ints.bins)
    if algorithm == "ffd":
        assert ours == theirs
    else:
        assert sorted(map(sum, ours)) == sorted(map(sum, theirs)) and len(ours) == len(theirs)


@pytest.mark.parametrize("lengths", [[1.5, 2.0, 3.25], np.array([1.5, 2.0, 3.25]), torch.tensor([1.5, 2.0, 3.25]),
                                     np.array([1.5, 2.0, 3.25], np.float32)])
def test_float_inputs_of_every_kind(lengths):
    plan = packkit.plan(lengths, 4.0, algorithm="ffd")
    assert [b.tolist() for b in plan.bins] == [[2], [1, 0]] and plan.num_bins == 2
    assert plan.bin_sizes.tolist() == [3.25, 3.5] and plan.lower_bound == 2
    assert np.isclose(plan.efficiency, 6.75 / 8)


def test_integer_lengths_with_a_float_capacity():
    plan = packkit.plan([3, 3, 3], 6.5, algorithm="nf")
    assert [b.tolist() for b in plan.bins] == [[0, 1], [2]]


@pytest.mark.parametrize("algorithm", ["obfd", "ogbfd"])
@pytest.mark.parametrize("lengths, capacity", [([1.5, 2.0], 10), (np.array([1.0, 2.0]), 10), ([1, 2], 10.0)])
def test_obfd_and_ogbfd_name_the_integer_requirement(algorithm, lengths, capacity):
    with pytest.raises(TypeError, match=rf"algorithm='{algorithm}' needs integers.*'nf', 'ffd' or 'bfd'"):
        packkit.plan(lengths, capacity, algorithm=algorithm)


@pytest.mark.parametrize("sizes, capacity, kwargs, error, words", [
    ([1.5, -1.0], 4.0, {}, ValueError, r"negative or not finite \(first at index 1: -1.0\)"),
    ([1.5, float("nan")], 4.0, {}, ValueError, "not finite"),
    ([1.5], float("inf"), {}, ValueError, "capacity must be finite"),
    ([1.5], 0.0, {}, ValueError, "capacity must be finite and > 0"),
    ([1.5, 5.0], 4.0, {}, ValueError, r"1 sequences are longer than capacity 4.0 \(first at index 1, length 5.0\)"),
    ([1.5, 5.0], 4.0, {"overlong": "split"}, ValueError, "needs integer lengths"),
    ([1.5], 4.0, {"dp_size": 2}, ValueError, "dp_size=1"),
    ([1.5], 4.0, {"cost": "attention"}, ValueError, "cost='tokens'"),
])
def test_bad_float_input(sizes, capacity, kwargs, error, words):
    with pytest.raises(error, match=words):
        packkit.plan(sizes, capacity, algorithm="bfd", **kwargs)


def test_drop_leaves_oversized_items_out():
    plan = packkit.plan([1.5, 5.0, 2.0], 4.0, algorithm="bfd", overlong="drop")
    assert plan.dropped.tolist() == [1] and [b.tolist() for b in plan.bins] == [[2, 0]]


def test_no_sizes_no_bins():
    plan = packkit.plan(np.zeros(0), 4.0, algorithm="ffd")
    assert plan.num_bins == 0 and plan.efficiency == 1.0 and plan.lower_bound == 0
