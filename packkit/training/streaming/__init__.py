"""``packkit.PackedIterableDataset``: on-the-fly packing of a stream of examples.

Modules: ``dataset`` (buffer filling, carry, iteration), ``source`` (reading the source, sharded by
position across ranks and DataLoader workers), ``examples`` (an example's token ids and pieces),
``items`` (items from planned rows), ``state`` (resume state).

The dataset reads its source a buffer at a time, plans each buffer with :func:`packkit.plan`, yields the
full rows as :func:`packkit.pack_sequences` batches and carries the examples of under-filled rows into the
next buffer; the end of the source flushes everything.

Exactly-once, sharding and resume all rest on one idea: every example is named by its **position** in
the source (0, 1, 2, ... in source order), and a piece of an example by ``(position, start token)``.

* Sharding: with ``W`` DataLoader workers and ``R`` ranks, shard ``rank * W + worker`` takes the examples
  whose position is congruent to it modulo ``R * W``. Indexable sources are read only at the shard's own
  positions; other sources are read whole by every shard, which skips the others' examples.
* State: the epoch, the shard, the next source position to read, and the positions of the pieces that
  were read but not yet yielded (the carry and the rows waiting for a full item). No tokens are stored:
  on resume the pending examples are read again from the source, which must therefore give the same
  examples in the same order when read again (a deterministic source for a given epoch).
* The stream after a resume is item for item the stream an uninterrupted run would have yielded.
"""
from .dataset import PackedIterableDataset

__all__ = ["PackedIterableDataset"]
