"""Planning from lengths that stay on the device: best-fit decreasing over a fixed number of rows, as torch ops.

``plan_bins(lengths, capacity, num_rows, max_sequences)`` returns each document's row (int64 ``[n]``, -1 where it
has no tokens or did not fit) and the number of documents with tokens that did not fit (a 0-d tensor), both on
``lengths``' device. Nothing is read back to the host: every shape is one of the arguments' (``n``, ``num_rows``),
the loop runs ``n`` times (a shape, not a value), and no op has a data-dependent output size (no ``nonzero``,
``masked_select``, ``unique``, ``bincount``, ``.item()``, ``bool(tensor)``). A document that does not fit is
reported, never dropped silently: the caller reads ``unplaced`` at its own sync point.

The rule (the planner's ``bfd`` over fixed rows): documents longest first (stable: equal lengths in input order),
each into the row it leaves the least room in, among the rows it fits (tokens within ``capacity``) whose slots
allow it, the lowest such row on a tie; so the rows used are always a prefix. A row of ``c`` documents and
``t`` tokens takes ``c + (t < capacity)`` of its ``max_sequences`` slots (its padding tail is a sequence of its own,
:mod:`.static_shapes`): exact, so a document that fills a row to the last token may take the last slot.
"""
from __future__ import annotations

import torch


def plan_bins(lengths: torch.Tensor, capacity: int, num_rows: int, max_sequences: int):
    """(bins int64 [n], unplaced int64 0-d) on ``lengths``' device; arguments already checked (the caller's)."""
    n = lengths.shape[0]
    dev = lengths.device
    lens = lengths.to(torch.int64)
    order = torch.sort(lens, descending=True, stable=True).indices
    sorted_len = lens.index_select(0, order)
    no_room = capacity + 1  # a score above every real one: "does not fit anywhere"
    size = torch.where(sorted_len > 0, sorted_len, no_room)  # an empty document fits nowhere (takes no row or slot)
    take = -torch.stack((size, torch.ones_like(size)), 1).unsqueeze(2)  # [n, 2, 1]: what a placement takes
    left = torch.stack((torch.full((num_rows,), capacity, dtype=torch.int64, device=dev),  # room left per row
                        torch.full((num_rows,), max_sequences, dtype=torch.int64, device=dev)))  # slots left
    placed = torch.empty(n, dtype=torch.int64, device=dev)
    for i in range(n):  # trip count = a shape; each step is ~12 small [num_rows] ops
        room = left[0] - size[i]
        fits = (room >= 0) & (left[1] >= 1 + (room > 0))  # a tail left in the row takes a slot of its own
        best, row = torch.where(fits, room, no_room).min(0)  # best fit; lowest row on a tie
        ok = best <= capacity
        left.index_add_(1, row.view(1), take[i] * ok)
        placed[i] = torch.where(ok, row, -1)
    bins = torch.empty_like(placed).scatter_(0, order, placed)
    unplaced = ((bins < 0) & (lens != 0)).sum()
    return bins, unplaced
