"""The order in which planned steps are emitted: a seeded shuffle of whole steps, or the source order.

The planner emits steps by decreasing cost (best fit decreasing places the longest sequences first), so a
trainer that takes them as planned sees a length curriculum: long documents first, short ones last, within every
buffer or epoch. Every path that emits planned steps reorders them here, whole steps at a time (a step's rows, one
per rank, stay together, so rank balance is untouched):

* ``shuffle=True``: a permutation drawn from the caller's seeded generator;
* ``shuffle=False``: the source order of each step's **longest** item (ties: its earliest). Not the step's first
  item: a step of many short documents has an early first member by chance alone (the minimum of many positions),
  so ordering by it would put short-document steps first, a length bias of its own. Each step has exactly one
  longest item, whose position is as random as the source's order is.

A step holding no item (the planner's last step can have empty rows; a step of only empty rows has none) sorts
after every other under ``shuffle=False``.
"""
from __future__ import annotations

import numpy as np


def source_keys(step_of: np.ndarray, length: np.ndarray, position: np.ndarray, num_steps: int) -> np.ndarray:
    """int64 ``[num_steps]``: the source position of each step's longest item (ties: the earliest position);
    ``step_of``, ``length``, ``position``: one entry per item (a step's items in any order). A step with no item
    gets the int64 maximum. O(items) when the items come grouped by step, as every caller's do."""
    step_of = np.asarray(step_of, np.int64)
    never = np.iinfo(np.int64).max
    keys = np.full(num_steps, never, np.int64)
    if not len(step_of):
        return keys
    length, position = np.asarray(length, np.int64), np.asarray(position, np.int64)
    if (step_of[1:] < step_of[:-1]).any():
        by_step = np.argsort(step_of, kind="stable")
        step_of, length, position = step_of[by_step], length[by_step], position[by_step]
    counts = np.bincount(step_of, minlength=num_steps)
    present = np.flatnonzero(counts)
    starts = np.concatenate(([0], np.cumsum(counts[present])[:-1]))
    longest = np.repeat(np.maximum.reduceat(length, starts), counts[present])
    keys[present] = np.minimum.reduceat(np.where(length == longest, position, never), starts)
    return keys


def order_steps(num_steps: int, *, shuffle: bool, rng=None, keys=None) -> np.ndarray:
    """int64 permutation of ``range(num_steps)``: emitted step ``k`` is planned step ``order[k]``.

    ``shuffle``: ``rng.permutation`` (``rng`` a ``numpy.random.Generator`` seeded by the caller, so a resume
    draws the same order); else the steps sorted by ``keys`` (:func:`source_keys`), stably."""
    if shuffle:
        return rng.permutation(num_steps).astype(np.int64)
    return np.argsort(np.asarray(keys, np.int64), kind="stable").astype(np.int64)


def bins_keys(bins, length_of, position_of, per_step: int) -> np.ndarray:
    """:func:`source_keys` of steps of ``per_step`` consecutive bins, each bin a sequence of item indices;
    ``length_of(i)`` / ``position_of(i)``: the length and source position of item ``i``."""
    num_steps = -(-len(bins) // per_step)
    items = [(b // per_step, i) for b, members in enumerate(bins) for i in members]
    step_of = np.fromiter((s for s, _ in items), np.int64, len(items))
    length = np.fromiter((length_of(i) for _, i in items), np.int64, len(items))
    position = np.fromiter((position_of(i) for _, i in items), np.int64, len(items))
    return source_keys(step_of, length, position, num_steps)
