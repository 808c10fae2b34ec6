"""``pack_dataset`` on an ``IterableDataset``: packed lazily, buffer by buffer, each buffer planned alone.

``"wrapped"`` is cut exactly where ``trl.pack_dataset`` cuts it: within each ``IterableDataset.map`` batch of
``map_kwargs["batch_size"]`` rows (1,000; ``None`` or ``<= 0``: the whole stream), so its buffer is one map batch
(or a whole number of them) and its rows are TRL's. ``"bfd"`` / ``"bfd_split"`` plan a buffer of 10,000 rows
(``buffer_size``) at once, where TRL plans each 1,000-row map batch: the same documents, fewer or equal rows.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..planning.planner import _as_count, as_extra_cost
from .global_plan import extra_cost_column, extra_cost_values, plan_rows
from .trl_rows import pack_column_names, trl_row_order, wrapped_segments

# Rows per buffer of a streamed "bfd" / "bfd_split" (planned alone, in memory); "wrapped" uses TRL's map batch.
DEFAULT_BUFFER_ROWS = 10_000


def stream_buffer_size(buffer_size, batch_size: Optional[int], *, wrapped: bool, bfd_batch) -> Optional[int]:
    """Rows per buffer of a streamed dataset (``None``: the whole stream, one ``map`` batch).

    ``batch_size``: the map batch as resolved (``None`` = one batch); ``bfd_batch``: ``map_kwargs["batch_size"]``
    as given. ``"wrapped"``: the map batch, or ``buffer_size`` if it is a whole number of map batches (any other
    buffer would cut the stream where TRL does not: ValueError naming buffer_size)."""
    if buffer_size is not None:
        buffer_size = _as_count(buffer_size, "buffer_size")
    if wrapped:
        if buffer_size is None:
            return batch_size
        if batch_size is None or buffer_size % batch_size:
            raise ValueError(f'buffer_size={buffer_size} with strategy="wrapped" must be a multiple of the map batch '
                             f'(map_kwargs["batch_size"]={batch_size}; None is the whole stream, which takes no '
                             f'buffer_size): "wrapped" is cut within each map batch, as trl.pack_dataset cuts it')
        return buffer_size
    if buffer_size is not None:
        return buffer_size
    return bfd_batch if bfd_batch is not None and bfd_batch > 0 else DEFAULT_BUFFER_ROWS


class BufferPacker:
    """The function an ``IterableDataset.map(batched=True, with_indices=True)`` calls on each buffer (a pyarrow
    Table): plans the buffer alone and returns its packed rows. A picklable object, so streamed datasets can
    run in DataLoader workers."""

    def __init__(self, *, chosen, seq_length, wrapped, batch_size, algorithm, overlong, dp_size, cost, shuffle, seed,
                 position_ids, extra_cost, buffer_size):
        self.__dict__.update(chosen=chosen, seq_length=seq_length, wrapped=wrapped, batch_size=batch_size,
                             algorithm=algorithm, overlong=overlong, dp_size=dp_size, cost=cost, shuffle=shuffle,
                             seed=seed, position_ids=position_ids, extra_cost=extra_cost, buffer_size=buffer_size)

    def __call__(self, table, indices):
        from .arrow_packing import check_row_lengths, pack_table, token_column

        chosen = self.chosen if self.chosen is not None else pack_column_names(
            [c for c in table.column_names if c != self.extra_cost], None, wrapped=self.wrapped,
            position_ids=self.position_ids)
        first = int(indices[0]) if len(indices) else 0
        buffer = first // self.buffer_size if self.buffer_size else 0
        seed = int(np.random.SeedSequence([self.seed, buffer]).generate_state(1)[0])  # one seed per buffer
        cols = [token_column(name, table.column(name), row_offset=first, generic=True) for name in chosen]
        lead = chosen.index("input_ids") if "input_ids" in chosen else 0
        lengths = check_row_lengths(cols, row_offset=first, lead=lead, negative="warn")
        if self.wrapped:  # the buffer starts at a map batch (a whole number of batches): TRL's cuts
            segments, _ = wrapped_segments(lengths, self.seq_length, self.batch_size, shuffle=self.shuffle,
                                           seed=seed)
        else:
            extra = None
            if self.extra_cost is not None:
                extra = as_extra_cost(extra_cost_values(table.column(self.extra_cost), self.extra_cost), len(lengths))
            _, segments, _ = plan_rows(lengths, self.seq_length, algorithm=self.algorithm, overlong=self.overlong,
                                       dp_size=self.dp_size, cost=self.cost, shuffle=self.shuffle, seed=seed,
                                       extra_cost=extra)
            segments = trl_row_order(segments)
        return pack_table(cols, segments, position_ids=self.position_ids, seq_lengths=not self.wrapped)


def pack_iterable(dataset, *, seq_length, wrapped, batch_size, algorithm, overlong, columns, dp_size, cost, shuffle,
                  seed, position_ids, extra_cost, buffer_size):
    """An ``IterableDataset`` packed buffer by buffer, lazily; returns an ``IterableDataset`` in its format."""
    if extra_cost is not None and not isinstance(extra_cost, str):
        raise TypeError("extra_cost for a streamed dataset is the name of a column (there is no row count to match "
                        "an array against)")
    names = dataset.column_names  # None when the stream's features are unknown
    chosen = None
    if names is not None:
        if isinstance(extra_cost, str):
            extra_cost_column(extra_cost, names)
        chosen = pack_column_names([c for c in names if c != extra_cost], columns, wrapped=wrapped,
                                   position_ids=position_ids)
    elif columns is not None:
        raise ValueError("columns=[...] needs a stream with known features (its column_names are None)")
    packer = BufferPacker(chosen=chosen, seq_length=seq_length, wrapped=wrapped, batch_size=batch_size,
                          algorithm=algorithm, overlong=overlong, dp_size=dp_size, cost=cost, shuffle=shuffle,
                          seed=seed, position_ids=position_ids, extra_cost=extra_cost, buffer_size=buffer_size)
    formatting = dataset._formatting
    fmt_type = formatting.format_type if formatting is not None else None
    source = dataset.with_format("arrow")
    out = source.map(packer, batched=True, batch_size=buffer_size, with_indices=True,
                     remove_columns=names if names is not None and chosen != names else None)
    return out.with_format(fmt_type)
