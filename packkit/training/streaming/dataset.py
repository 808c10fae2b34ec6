"""The streaming dataset itself: fills a buffer from the source, plans it, carries the pieces of
under-filled rows into the next buffer and yields the full rows as items (see the package docstring)."""
from __future__ import annotations

import copy
import itertools
import numbers
from collections.abc import Mapping
from typing import Iterator, Optional

import numpy as np
import torch
import torch.utils.data

from ...context_parallel import cp_plan_multiple, parse_context_parallel
from ...context_parallel.shard import check_cp_capacity
from ...packing.checks import check_bool, check_int, check_pack_scalars, check_static_shape
from ...packing.fields import check_pad_values, check_policy
from ...packing.multimodal import mrope_spec
from ...packing.multimodal.mrope import check_mrope_start
from ...packing.sequences import check_layout
from ...packing.static_shapes import check_max_sequences
from ...planning import step_order
from ...planning.planner import _as_count, check_plan_choices, plan as make_plan
from .examples import example_pieces
from .items import item_of, items_of, pieces_per_row
from .source import SourceReader, shard_of
from .state import STAT_KEYS, Progress, checked_state

__all__ = ["PackedIterableDataset"]


class PackedIterableDataset(torch.utils.data.IterableDataset):
    """Packs a stream of examples into rows of ``capacity`` tokens, on the fly.

    Args:
        source: the examples: dicts with ``input_key`` (and optionally ``label_key``) holding token ids
            (list, numpy array or 1-D integer tensor), or bare token sequences. Any re-iterable (list,
            ``datasets.Dataset``, ``datasets.IterableDataset``, a class whose ``__iter__`` starts over),
            or a callable returning a fresh iterator per pass. A one-shot iterator (a generator object)
            works for one pass only. Indexable sources (``__len__`` + ``__getitem__``) are read by index.
            The source must not shard itself by DataLoader worker: this dataset does.
        capacity: tokens per row.
        buffer_size: pieces (examples, or split pieces of examples) planned together, carry included.
        algorithm, overlong: as in :func:`packkit.plan`. ``overlong`` is applied as examples are read:
            ``"error"`` raises ValueError naming the example's source position.
        rows_per_item: None yields one row per item; ``k`` yields ``k`` rows per item (``[k, capacity]``
            in the padded layout; the last item is padded with empty rows).
        layout: ``"padded"`` (``[rows, capacity]``) or ``"flat"`` (``[1, T]``, the item's rows one after
            another, no padding).
        carry_threshold: rows filled below this fraction of ``capacity`` are carried into the next buffer
            (their examples are planned again), unless the source is exhausted.
        max_carry: most pieces carried into the next buffer (default ``buffer_size // 2``; every buffer
            reads at least ``buffer_size - max_carry`` new pieces).
        max_carries: most times one piece is carried, so no example waits more than ``max_carries``
            extra buffers (default 8; 0 turns carrying off).
        shuffle, seed: the order of each buffer's rows: a random permutation drawn from ``(seed, epoch, shard,
            buffer)`` (default), or with ``shuffle=False`` the source order of each row's longest example. Never
            the planner's order, which runs from the longest examples to the shortest in every buffer. The
            rows waiting to be yielded are in the state, so a resume continues the same order.
        return_example_ids: add ``example_ids`` (source positions of each row's segments, in row order) to
            every item; off by default since models reject unknown keyword arguments.
        rank, world_size: data-parallel sharding; default: ``torch.distributed`` when initialised, else
            one rank. Pass the unsplit source: shard ``rank * num_workers + worker`` of
            ``world_size * num_workers`` takes the examples at positions congruent to it.
        pad_values, extra_fields, mrope: as in :class:`packkit.PackingCollator`: other example fields are
            packed (per-token fields like the ids, vision inputs in packed order) or refused, never dropped
            silently; ``mrope=config`` gives ``[4, B, L]`` Qwen-VL positions. An example with fields other
            than per-token ones cannot be truncated or split (ValueError).
        context_parallel: ``(cp_size, cp_rank)`` or ``(cp_size, cp_rank, mode)``: every item is this
            context-parallel rank's shard (:func:`packkit.shard_context_parallel`), rows planned with
            ``pad_to_multiple_of=2 * cp_size`` in zigzag mode (capacity must be a multiple). The ranks of one
            CP group must read the same examples: ``rank``/``world_size`` are data-parallel; taken from
            ``torch.distributed`` they are ``global rank // cp_size`` and ``world size // cp_size`` (CP
            groups of consecutive ranks). Not with ``mrope``.
        max_sequences: the static-shape contract (docs/packing.md "Static shapes"): every item has N sequence
            slots per row, ``cu_seq_lens_q/k`` ``rows * N + 1`` long as :func:`packkit.pack_sequences` gives them
            (unused slots repeat the last offset). Rows are planned with at most ``N - 1`` pieces in the padded
            layout (a row's padding takes a slot), ``N // rows_per_item`` in the flat one (an item's rows share
            its N slots; N must be >= rows_per_item). Never truncated: an item that does not fit (rows planned
            under a larger N before a resume) is refused by name. With ``context_parallel``: N slots for the
            item's rank shard (as ``pack_context_parallel(max_sequences=N)``), rows planned so that every row's
            pieces and padding tails (and contiguous mode's end CP padding) fit them.

    Each item is ``packkit.pack_sequences(...)``'s dict for its rows (HF keys ``input_ids, labels,
    position_ids, seq_idx, cu_seq_lens_q/k, max_length_q/k``), so use ``DataLoader(ds, batch_size=None)``.
    ``state_dict()`` / ``load_state_dict()`` resume mid-epoch with every example delivered exactly once.
    """

    def __init__(self, source, capacity: int, *, buffer_size: int = 1024, algorithm: str = "obfd",
                 overlong: str = "error", rows_per_item: Optional[int] = None, layout: str = "padded",
                 pad_token_id: int = 0, ignore_index: int = -100, mask_first_label: bool = True,
                 position_ids_start: int = 0, input_key: str = "input_ids", label_key: Optional[str] = "labels",
                 carry_threshold: float = 0.99, max_carry: Optional[int] = None, max_carries: int = 8,
                 return_example_ids: bool = False, shuffle: bool = True, seed: int = 0,
                 rank: Optional[int] = None, world_size: Optional[int] = None, pad_values: Optional[dict] = None,
                 extra_fields: str = "error", mrope=None, context_parallel=None, max_sequences=None):
        super().__init__()
        if isinstance(source, (str, bytes, Mapping)) or not (callable(source) or hasattr(source, "__iter__")
                                                            or hasattr(source, "__getitem__")):
            raise TypeError("source must be an iterable of examples (list, datasets.Dataset/IterableDataset, "
                            f"re-iterable object) or a callable returning an iterator; got {type(source).__name__}")
        self.source = source
        self._reader = SourceReader(source)
        self.capacity = _as_count(capacity, "capacity")
        self.buffer_size = _as_count(buffer_size, "buffer_size")
        check_plan_choices(algorithm, overlong)
        check_layout(layout)
        self.algorithm, self.overlong, self.layout = algorithm, overlong, layout
        self.rows_per_item = None if rows_per_item is None else _as_count(rows_per_item, "rows_per_item")
        if layout == "padded":
            check_static_shape(self.rows_per_item or 1, self.capacity, "rows_per_item x capacity")
        if (self.rows_per_item or 1) * self.capacity >= 2**31:
            raise ValueError(f"rows_per_item * capacity must be < 2**31 (int32 cu_seqlens), got "
                             f"{self.rows_per_item or 1} * {self.capacity}")
        self.pad_token_id, self.ignore_index, self.position_ids_start, self.mask_first_label = check_pack_scalars(
            pad_token_id, ignore_index, position_ids_start, mask_first_label)
        if not isinstance(input_key, str) or not (label_key is None or isinstance(label_key, str)):
            raise TypeError(f"input_key must be a str and label_key a str or None, got {input_key!r}, {label_key!r}")
        self.input_key, self.label_key = input_key, label_key
        if isinstance(carry_threshold, bool) or not isinstance(carry_threshold, numbers.Real) \
                or not 0.0 <= float(carry_threshold) <= 1.0:
            raise ValueError(f"carry_threshold must be a number in [0, 1], got {carry_threshold!r}")
        self.carry_threshold = float(carry_threshold)
        if max_carry is None:
            max_carry = self.buffer_size // 2
        elif isinstance(max_carry, bool) or not isinstance(max_carry, numbers.Integral) or max_carry < 0:
            raise ValueError(f"max_carry must be a non-negative int or None, got {max_carry!r}")
        if max_carry >= self.buffer_size:
            raise ValueError(f"max_carry must be < buffer_size ({self.buffer_size}) so every buffer reads new "
                             f"examples, got {max_carry}")
        self.max_carry = int(max_carry)
        if isinstance(max_carries, bool) or not isinstance(max_carries, numbers.Integral) or max_carries < 0:
            raise ValueError(f"max_carries must be a non-negative int, got {max_carries!r}")
        self.max_carries = int(max_carries)
        self.return_example_ids = check_bool(return_example_ids, "return_example_ids")
        self.shuffle = check_bool(shuffle, "shuffle")
        self.seed = check_int(seed, "seed", 0)

        self.pad_values, self.extra_fields = check_pad_values(pad_values), check_policy(extra_fields)
        if mrope is not None:
            mrope = mrope_spec(mrope)
        check_mrope_start(mrope, self.position_ids_start)
        self.mrope = mrope
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank and world_size, or neither (then torch.distributed decides)")
        if world_size is not None:
            world_size = _as_count(world_size, "world_size")
            if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < world_size:
                raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
            rank = int(rank)
        self.rank, self.world_size = rank, world_size
        self.context_parallel = parse_context_parallel(context_parallel)
        self._cp_multiple = cp_plan_multiple(self.context_parallel)
        if self.context_parallel is not None:
            if mrope is not None:
                raise ValueError("context_parallel= does not support mrope=")
            check_cp_capacity(self._cp_multiple, self.capacity)
        self.max_sequences = check_max_sequences(max_sequences)
        self._per_row = pieces_per_row(self.max_sequences, self.layout, self.rows_per_item, self.context_parallel,
                                       self.capacity)
        self._epoch = 0
        self._loaded: Optional[dict] = None  # a state to resume from at the next __iter__
        self._progress: Optional[Progress] = None  # the running (or last) pass
        self._last_stats = dict.fromkeys(STAT_KEYS, 0)

    # ------------------------------------------------------------------------------------------- state
    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next pass (passed on to ``source.set_epoch`` when the source has one)."""
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self._epoch = int(epoch)
        if self._progress is not None and self._progress.epoch != self._epoch:
            self._progress = None  # a pass of another epoch: state_dict now describes the start of this one

    def state_dict(self) -> dict:
        """Where this shard's pass stands: a small dict of ints (no tokens), safe for ``torch.save``/JSON.

        Keys: ``epoch``, ``shard``/``num_shards``, ``next_position`` (the next source position to read;
        this shard's examples before it were read), ``carry`` and ``ready`` (``[position, start]`` of the
        pieces read but not yet yielded: the carry of under-filled rows, and planned rows waiting to be
        yielded; carry entries are ``[position, start, times carried]``), ``capacity``/``overlong`` (must
        match on resume) and ``stats`` (counters: examples read, dropped, truncated, split, zero_length,
        and items, rows, tokens yielded).
        Taken between items it describes exactly the items yielded so far.
        """
        if self._loaded is not None:
            return copy.deepcopy(self._loaded)
        if self._progress is not None:
            return self._progress.state(self.capacity, self.overlong, self._cp_multiple or 1)
        shard, num_shards = self._shard()
        return Progress(self._epoch, shard, num_shards).state(self.capacity, self.overlong, self._cp_multiple or 1)

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict`'s output at the next ``iter()`` (same source, capacity, overlong
        policy and sharding; buffer size, algorithm and the rest may change)."""
        clean = checked_state(state, self.capacity, self.overlong, self._cp_multiple or 1)
        self._loaded = clean
        self._epoch = clean["epoch"]
        self._progress = None

    # ------------------------------------------------------------------------------------------ source
    def _shard(self) -> tuple[int, int]:
        return shard_of(self.rank, self.world_size, self.context_parallel[0] if self.context_parallel else 1)

    def _pieces(self, position: int, example, stats: Optional[dict] = None) -> list:
        return example_pieces(position, example, stats, input_key=self.input_key, label_key=self.label_key,
                              capacity=self.capacity, overlong=self.overlong)

    # --------------------------------------------------------------------------------------- iteration
    def __iter__(self):
        shard, num_shards = self._shard()
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            if (loaded["shard"], loaded["num_shards"]) != (shard, num_shards):
                raise ValueError(f"the state was saved by shard {loaded['shard']} of {loaded['num_shards']} but this "
                                 f"pass is shard {shard} of {num_shards} (shard = rank * num_workers + worker); "
                                 f"resume with the same world size and number of DataLoader workers")
            progress = Progress(loaded["epoch"], shard, num_shards, loaded["next_position"], loaded.get("stats"))
            pending = [(p[0], p[1]) for p in loaded["carry"]] + [tuple(p) for row in loaded["ready"] for p in row]
            pieces, fresh = self._reader.reopen(progress, pending, self._pieces)
            progress.carry = [pieces[(p[0], p[1])] for p in loaded["carry"]]
            progress.carry_ages = [p[2] for p in loaded["carry"]]
            progress.ready.extend([pieces[tuple(p)] for p in row] for row in loaded["ready"])
        else:
            progress = Progress(self._epoch, shard, num_shards)
            fresh = self._reader.stream(0, shard, num_shards, progress.epoch)
        self._progress = progress
        yield from self._run(progress, fresh)  # with context_parallel=, items are the rank's shards (items.py)
        self._epoch = progress.epoch + 1
        self._progress = None
        self._last_stats = dict(progress.stats)

    @property
    def stats(self) -> dict:
        """Counters of the running pass, else of the last finished one (in this process): examples read,
        dropped, truncated, split, zero_length; items, rows and tokens yielded."""
        if self._progress is not None:
            return dict(self._progress.stats)
        return dict(self._last_stats)

    def _drain(self, progress: Progress, final: bool):
        """Yields the items the ready rows make (all of them, the last one partial, when ``final``).

        A row leaves ``progress.ready`` only as its item is yielded, so ``state_dict`` taken between items
        lists exactly the rows not delivered yet.
        """
        k = self.rows_per_item or 1
        ready, stats = progress.ready, progress.stats
        full = len(ready) // k * k
        if full:
            rows = list(itertools.islice(ready, full))
            for j, item in enumerate(items_of(self, rows)):
                for row in rows[j * k:(j + 1) * k]:
                    ready.popleft()
                    stats["tokens"] += sum(len(p[2]) for p in row)
                stats["items"] += 1
                stats["rows"] += k
                yield item
        if final and ready:
            rows = list(ready)
            ready.clear()
            stats["items"] += 1
            stats["rows"] += len(rows)
            stats["tokens"] += sum(len(p[2]) for row in rows for p in row)
            yield item_of(self, rows)

    def _run(self, progress: Progress, fresh: Iterator):
        capacity = self.capacity
        ready, stats = progress.ready, progress.stats
        yield from self._drain(progress, False)  # rows planned before a resume come first, as they would have
        exhausted = False
        while not exhausted:
            pool = progress.carry
            while len(pool) < self.buffer_size:
                nxt = next(fresh, None)
                if nxt is None:
                    exhausted = True
                    break
                position, example = nxt
                pool.extend(self._pieces(position, example, stats))
                progress.next_position = position + 1
            if not pool:
                break
            ages = progress.carry_ages + [0] * (len(pool) - len(progress.carry_ages))  # times carried so far
            lengths = np.fromiter((len(p[2]) for p in pool), np.int64, len(pool))
            planned = make_plan(lengths, capacity, algorithm=self.algorithm, pad_to_multiple_of=self._cp_multiple,
                                max_sequences=self._per_row)
            bins = planned.bins
            keep = np.ones(len(bins), bool)
            if not exhausted and self.max_carry and self.max_carries and self.carry_threshold > 0:
                fill = planned.bin_tokens / capacity
                budget = self.max_carry
                for b in np.argsort(fill, kind="stable"):
                    if fill[b] >= self.carry_threshold:
                        break
                    members = bins[b].tolist()
                    if len(members) <= budget and max(ages[i] for i in members) < self.max_carries:
                        keep[b] = False
                        budget -= len(members)
            carry = [i for b in np.flatnonzero(~keep) for i in bins[b].tolist()]
            progress.carry = [pool[i] for i in carry]
            progress.carry_ages = [ages[i] + 1 for i in carry]
            for b in self._row_order(progress, bins, np.flatnonzero(keep), lengths, pool):
                ready.append(sorted((pool[i] for i in bins[b].tolist()), key=lambda p: (p[0], p[1])))
            yield from self._drain(progress, exhausted)
        yield from self._drain(progress, True)

    def _row_order(self, progress: Progress, bins, kept: np.ndarray, lengths: np.ndarray, pool: list) -> np.ndarray:
        """The kept rows of a buffer in the order they are yielded (see ``shuffle``). The generator is keyed by
        where the buffer ends in the source, so a resumed pass draws the same orders."""
        keys = None
        if not self.shuffle:
            members = [bins[b] for b in kept]
            step_of = np.repeat(np.arange(len(kept), dtype=np.int64), [len(m) for m in members])
            flat = np.concatenate(members) if members else np.zeros(0, np.int64)
            positions = np.fromiter((pool[i][0] for i in flat.tolist()), np.int64, len(flat))
            keys = step_order.source_keys(step_of, lengths[flat], positions, len(kept))
        rng = np.random.default_rng((self.seed, progress.epoch, progress.shard, progress.next_position))
        return kept[step_order.order_steps(len(kept), shuffle=self.shuffle, rng=rng, keys=keys)]

    def __repr__(self) -> str:
        return (f"PackedIterableDataset(capacity={self.capacity}, buffer_size={self.buffer_size}, "
                f"algorithm={self.algorithm!r}, overlong={self.overlong!r}, rows_per_item={self.rows_per_item}, "
                f"layout={self.layout!r}, source={type(self.source).__name__})")
