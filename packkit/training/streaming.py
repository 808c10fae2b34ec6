"""``packkit.PackedIterableDataset``: on-the-fly packing of a stream of examples.

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
from __future__ import annotations

import collections
import copy
import itertools
import numbers
import sys
from collections.abc import Mapping
from typing import Iterator, Optional

import numpy as np
import torch
import torch.utils.data

from ..packing.fields import check_pad_values, check_policy
from ..packing.multimodal import mrope_spec
from ..packing.sequences import LAYOUTS, pack_sequences
from ..packing.tensors import first_dim
from ..context_parallel import cp_plan_multiple, parse_context_parallel, shard_context_parallel
from ..planning.planner import ALGORITHMS, OVERLONG_POLICIES, Plan, _as_count, plan as make_plan

__all__ = ["PackedIterableDataset"]

STATE_FORMAT = "packkit.PackedIterableDataset/1"
_HF_BATCH = 256  # rows per read from a datasets.IterableDataset
_STAT_KEYS = ("examples", "dropped", "truncated", "split", "zero_length", "items", "rows", "tokens")

# A piece: (source position, first token, ids int64 array, labels int64 array or None,
#          other fields of the example {name: value} or None; see packkit.fields).


class _Progress:
    """The live state of one pass over a shard (serialised on demand by ``state_dict``)."""

    def __init__(self, epoch: int, shard: int, num_shards: int, next_position: int = 0, stats=None):
        self.epoch = epoch
        self.shard = shard
        self.num_shards = num_shards
        self.next_position = next_position
        self.carry: list = []  # pieces to plan again with the next buffer
        self.carry_ages: list = []  # how many times each was carried already (this carry included)
        self.ready: collections.deque = collections.deque()  # planned rows (lists of pieces) not yet yielded
        self.stats = dict.fromkeys(_STAT_KEYS, 0) if stats is None else dict(stats)
        self.stats.update((key, 0) for key in _STAT_KEYS if key not in self.stats)

    def state(self, capacity: int, overlong: str) -> dict:
        # Between items carry_ages matches carry; after an error while a buffer was being read, the carry
        # also holds that buffer's new pieces (age 0), so a state taken then still loses nothing.
        ages = self.carry_ages + [0] * (len(self.carry) - len(self.carry_ages))
        return {
            "format": STATE_FORMAT, "epoch": self.epoch, "shard": self.shard, "num_shards": self.num_shards,
            "next_position": self.next_position, "capacity": capacity, "overlong": overlong,
            "carry": [[p[0], p[1], age] for p, age in zip(self.carry, ages)],
            "ready": [[[p[0], p[1]] for p in row] for row in self.ready],
            "stats": dict(self.stats),
        }


def _token_array(value, position: int, what: str) -> np.ndarray:
    """A 1-D int64 array of token ids, or TypeError/ValueError naming the example."""
    where = f"example {position}: {what}"
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            raise TypeError(f"{where} must be integer token ids, got a tensor of dtype {value.dtype}")
        if value.dim() != 1:
            raise ValueError(f"{where} must be 1-D, got a tensor of shape {tuple(value.shape)}")
        return value.detach().cpu().to(torch.int64).numpy()
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{where} is a {type(value).__name__}; examples must be tokenized (integer token ids)")
    if isinstance(value, np.ndarray):
        array = value
    else:
        if not hasattr(value, "__len__"):
            raise TypeError(f"{where} must be a list, array or tensor of token ids, got {type(value).__name__}")
        if len(value) == 0:
            return np.zeros(0, np.int64)
        try:
            array = np.asarray(value)
        except (ValueError, OverflowError, TypeError) as exc:
            raise TypeError(f"{where} must be a flat sequence of integer token ids ({exc})") from None
    if array.ndim != 1:
        raise ValueError(f"{where} must be 1-D, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        if array.size == 0:
            return np.zeros(0, np.int64)
        if array.dtype.kind == "O":
            bad = next((i for i, x in enumerate(array)
                        if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral)), None)
            if bad is None:
                raise ValueError(f"{where} token ids must fit in int64")
            raise TypeError(f"{where} must be integer token ids; token {bad} is "
                            f"{type(array[bad]).__name__} {array[bad]!r}")
        raise TypeError(f"{where} must be integer token ids, got dtype {array.dtype}")
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{where} token ids must fit in int64")
    return array.astype(np.int64, copy=False)


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

    Each item is ``packkit.pack_sequences(...)``'s dict for its rows (HF keys ``input_ids, labels,
    position_ids, seq_idx, cu_seq_lens_q/k, max_length_q/k``), so use ``DataLoader(ds, batch_size=None)``.
    ``state_dict()`` / ``load_state_dict()`` resume mid-epoch with every example delivered exactly once.
    """

    def __init__(self, source, capacity: int, *, buffer_size: int = 1024, algorithm: str = "obfd",
                 overlong: str = "error", rows_per_item: Optional[int] = None, layout: str = "padded",
                 pad_token_id: int = 0, ignore_index: int = -100, mask_first_label: bool = True,
                 position_ids_start: int = 0, input_key: str = "input_ids", label_key: Optional[str] = "labels",
                 carry_threshold: float = 0.99, max_carry: Optional[int] = None, max_carries: int = 8,
                 return_example_ids: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None, pad_values: Optional[dict] = None,
                 extra_fields: str = "error", mrope=None, context_parallel=None):
        super().__init__()
        if isinstance(source, (str, bytes, Mapping)) or not (callable(source) or hasattr(source, "__iter__")
                                                            or hasattr(source, "__getitem__")):
            raise TypeError("source must be an iterable of examples (list, datasets.Dataset/IterableDataset, "
                            f"re-iterable object) or a callable returning an iterator; got {type(source).__name__}")
        self.source = source
        self.capacity = _as_count(capacity, "capacity")
        self.buffer_size = _as_count(buffer_size, "buffer_size")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
        if overlong not in OVERLONG_POLICIES:
            raise ValueError(f"unknown overlong policy {overlong!r}; allowed: {', '.join(OVERLONG_POLICIES)}")
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; allowed: {', '.join(LAYOUTS)}")
        self.algorithm, self.overlong, self.layout = algorithm, overlong, layout
        self.rows_per_item = None if rows_per_item is None else _as_count(rows_per_item, "rows_per_item")
        if (self.rows_per_item or 1) * self.capacity >= 2**31:
            raise ValueError(f"rows_per_item * capacity must be < 2**31 (int32 cu_seqlens), got "
                             f"{self.rows_per_item or 1} * {self.capacity}")
        for name, value in (("pad_token_id", pad_token_id), ("ignore_index", ignore_index),
                            ("position_ids_start", position_ids_start)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        self.pad_token_id, self.ignore_index = int(pad_token_id), int(ignore_index)
        self.position_ids_start = int(position_ids_start)
        self.mask_first_label = bool(mask_first_label)
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
        self.return_example_ids = bool(return_example_ids)

        self.pad_values, self.extra_fields = check_pad_values(pad_values), check_policy(extra_fields)
        if mrope is not None:
            mrope = mrope_spec(mrope)
            if self.position_ids_start != 0:
                raise ValueError("mrope= positions start at 0 (as the model's get_rope_index); position_ids_start "
                                 "must be 0")
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
            if self._cp_multiple and self.capacity % self._cp_multiple:
                raise ValueError(f"context_parallel zigzag pads documents to multiples of {self._cp_multiple}; "
                                 f"capacity={self.capacity} must be a multiple of it")
        self._epoch = 0
        self._loaded: Optional[dict] = None  # a state to resume from at the next __iter__
        self._progress: Optional[_Progress] = None  # the running (or last) pass
        self._oneshot_used = False
        self._last_stats = dict.fromkeys(_STAT_KEYS, 0)

    # ----------------------------------------------------------------------------------------- sharding
    def _shard(self) -> tuple[int, int]:
        """(shard, num_shards) for the calling process: rank * num_workers + worker of world * workers."""
        rank, world = self.rank, self.world_size
        if world is None:
            rank, world = 0, 1
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
                if self.context_parallel is not None:  # every rank of a CP group reads the same examples
                    cp = self.context_parallel[0]
                    if world % cp:
                        raise ValueError(f"world size {world} is not a multiple of cp_size {cp}")
                    rank, world = rank // cp, world // cp
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * workers + worker, world * workers

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
            return self._progress.state(self.capacity, self.overlong)
        shard, num_shards = self._shard()
        return _Progress(self._epoch, shard, num_shards).state(self.capacity, self.overlong)

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict`'s output at the next ``iter()`` (same source, capacity, overlong
        policy and sharding; buffer size, algorithm and the rest may change)."""
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a PackedIterableDataset state (expected format {STATE_FORMAT!r})")
        missing = [k for k in ("epoch", "shard", "num_shards", "next_position", "capacity", "overlong", "carry",
                               "ready") if k not in state]
        if missing:
            raise ValueError(f"state is missing {', '.join(missing)}")
        if int(state["capacity"]) != self.capacity or state["overlong"] != self.overlong:
            raise ValueError(f"state was saved with capacity={state['capacity']}, overlong={state['overlong']!r} "
                             f"but this dataset has capacity={self.capacity}, overlong={self.overlong!r}")

        def piece(p, size=2):
            if not isinstance(p, (list, tuple)) or len(p) != size or any(
                    isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0 for x in p):
                what = "[position, start, times carried]" if size == 3 else "[position, start]"
                raise ValueError(f"state pieces must be {what} lists of non-negative ints, got {p!r}")
            return [int(x) for x in p]

        clean = dict(copy.deepcopy(dict(state)))
        for key in ("epoch", "shard", "num_shards", "next_position"):
            value = clean[key]
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"state[{key!r}] must be a non-negative int, got {value!r}")
            clean[key] = int(value)
        if not clean["shard"] < clean["num_shards"]:
            raise ValueError(f"state shard {clean['shard']} is not below num_shards {clean['num_shards']}")
        clean["carry"] = [piece(p, 3) for p in clean["carry"]]
        clean["ready"] = [[piece(p) for p in row] for row in clean["ready"]]
        if any(not row for row in clean["ready"]):
            raise ValueError("state has an empty ready row")
        self._loaded = clean
        self._epoch = clean["epoch"]
        self._progress = None

    # ------------------------------------------------------------------------------------------ source
    def _hf_iterable(self) -> bool:
        datasets = sys.modules.get("datasets")
        return datasets is not None and isinstance(self.source, datasets.IterableDataset)

    def _indexable(self) -> bool:
        s = self.source
        if callable(s) and not hasattr(s, "__len__"):
            return False
        if isinstance(s, torch.utils.data.IterableDataset) or isinstance(s, Mapping):
            return False
        return hasattr(s, "__len__") and hasattr(s, "__getitem__")

    def _stream(self, begin: int, shard: int, num_shards: int, epoch: int) -> Iterator:
        """(position, example) for this shard's positions >= begin, in source order."""
        source = self.source
        if hasattr(source, "set_epoch") and not callable(source):
            source.set_epoch(epoch)
        if self._indexable():
            first = begin + (shard - begin) % num_shards
            return ((p, source[p]) for p in range(first, len(source), num_shards))
        if self._hf_iterable():
            # .iter() reads the whole stream even inside a DataLoader worker (plain iteration would make
            # datasets give each worker only some of its shards); this dataset shards by position instead.
            # No .skip(): its copy drops the shuffling config, so a shuffled epoch would read differently.
            if hasattr(source, "iter"):
                def rows():
                    for batch in source.iter(batch_size=_HF_BATCH):
                        keys = list(batch)
                        columns = [batch[k] for k in keys]
                        for values in zip(*columns):
                            yield dict(zip(keys, values))
                it = rows()
            else:
                it = iter(source)
            it = itertools.islice(it, begin, None)
            positions = itertools.count(begin)
        else:
            if callable(source):
                it = iter(source())
            else:
                it = iter(source)
                if it is source:
                    if self._oneshot_used:
                        raise TypeError("the source is a one-shot iterator (e.g. a generator) and an earlier pass "
                                        "consumed it; pass a list, a re-iterable or a callable returning a fresh "
                                        "iterator")
                    self._oneshot_used = True
            it = itertools.islice(it, begin, None)
            positions = itertools.count(begin)
        if num_shards == 1:
            return zip(positions, it)
        return ((p, ex) for p, ex in zip(positions, it) if p % num_shards == shard)

    def _pieces(self, position: int, example, stats: Optional[dict] = None) -> list:
        """The example's pieces under the over-long policy (none if dropped or empty)."""
        if isinstance(example, Mapping):
            if self.input_key not in example:
                raise ValueError(f"example {position} has no {self.input_key!r} key (keys: "
                                 f"{', '.join(map(repr, example))}); set input_key=... to the token-id field")
            ids = _token_array(example[self.input_key], position, self.input_key)
            labels = example.get(self.label_key) if self.label_key is not None else None
            if labels is not None:
                labels = _token_array(labels, position, self.label_key)
                if len(labels) != len(ids):
                    raise ValueError(f"example {position} has {len(ids)} {self.input_key} but {len(labels)} "
                                     f"{self.label_key}")
            extras = {k: v for k, v in example.items() if k != self.input_key and k != self.label_key} or None
            if extras and "attention_mask" in extras:  # all ones: accepted, not needed (checked here, per example)
                mask = extras.pop("attention_mask")
                if mask is not None and (_token_array(mask, position, "attention_mask") != 1).any() \
                        or mask is not None and len(mask) != len(ids):
                    raise ValueError(f"example {position}: attention_mask is not all ones (padding inside an example); "
                                     f"packed rows need unpadded examples: remove the padding upstream")
                extras = extras or None
        else:
            if isinstance(example, (numbers.Number, str, bytes)) or example is None:
                raise TypeError(f"example {position} is a {type(example).__name__}; examples must be dicts with "
                                f"{self.input_key!r} or sequences of token ids")
            ids, labels, extras = _token_array(example, position, "the token sequence"), None, None
        n, cap = len(ids), self.capacity
        if stats is not None:
            stats["examples"] += 1
        if n == 0:
            if stats is not None:
                stats["zero_length"] += 1
            return []
        if n <= cap:
            return [(position, 0, ids, labels, extras)]
        if self.overlong == "error":
            raise ValueError(f"example {position} has {n} tokens, more than capacity={cap}; pass "
                             f"overlong='drop', 'truncate' or 'split' to handle over-long examples")
        if stats is not None:
            stats[{"drop": "dropped", "truncate": "truncated", "split": "split"}[self.overlong]] += 1
        if self.overlong == "drop":
            return []
        if extras:
            whole = [k for k, v in extras.items() if v is not None and first_dim(v) != n]
            if whole:
                raise ValueError(f"example {position} has {n} tokens, more than capacity={cap}, and field(s) "
                                 f"{', '.join(map(repr, whole))} that are not per-token, so it cannot be "
                                 f"{self.overlong}d (a vision block or per-example value would be cut or repeated); "
                                 f"use overlong='drop' or a larger capacity")
        if self.overlong == "truncate":
            return [(position, 0, ids[:cap], None if labels is None else labels[:cap],
                     extras and {k: None if v is None else v[:cap] for k, v in extras.items()})]
        return [(position, s, ids[s:s + cap], None if labels is None else labels[s:s + cap],
                 extras and {k: None if v is None else v[s:s + cap] for k, v in extras.items()})
                for s in range(0, n, cap)]

    def _open(self, progress: _Progress, pending: list) -> tuple[dict, Iterator]:
        """({(position, start): piece} for the pending pieces, iterator of fresh (position, example))."""
        shard, num_shards, epoch = progress.shard, progress.num_shards, progress.epoch
        wanted = sorted({p for p, _ in pending})
        examples = {}
        if self._indexable():
            n = len(self.source)
            for p in wanted:
                if p >= n:
                    raise ValueError(f"the state names source position {p} but the source has {n} examples")
                examples[p] = self.source[p]
            fresh = self._stream(progress.next_position, shard, num_shards, epoch)
        else:
            stream = self._stream(min(wanted + [progress.next_position]), shard, num_shards, epoch)
            fresh = iter(())
            want = set(wanted)
            for p, ex in stream:
                if p >= progress.next_position:
                    fresh = itertools.chain([(p, ex)], stream)
                    break
                if p in want:
                    examples[p] = ex
            missing = set(wanted) - examples.keys()
            if missing:
                raise ValueError(f"the state names source position {min(missing)} but the source ended before it")
        pieces = {}
        for p in wanted:
            for piece in self._pieces(p, examples[p]):
                pieces[(p, piece[1])] = piece
        for key in pending:
            if tuple(key) not in pieces:
                raise ValueError(f"the state names piece (position {key[0]}, start {key[1]}) which the source's "
                                 f"example {key[0]} does not have: the source changed since the state was saved")
        return pieces, fresh

    # ------------------------------------------------------------------------------------------ output
    def _pack(self, rows: list, num_rows: Optional[int]) -> dict:
        """``pack_sequences`` of ``rows`` (lists of pieces), one row per list."""
        pieces = [p for row in rows for p in row]
        lengths = np.fromiter((len(p[2]) for p in pieces), np.int64, len(pieces))
        offsets = np.zeros(len(rows) + 1, np.int64)
        offsets[1:] = np.cumsum([len(row) for row in rows])
        ids = torch.from_numpy(np.concatenate([p[2] for p in pieces]))
        labels = None
        if any(p[3] is not None for p in pieces):
            labels = torch.from_numpy(np.concatenate([p[2] if p[3] is None else p[3] for p in pieces]))
        padded = self.layout == "padded"
        names = list(dict.fromkeys(k for p in pieces if p[4] for k in p[4]))
        fields = {k: [p[4].get(k) if p[4] else None for p in pieces] for k in names}
        return pack_sequences(
            ids, lengths, labels=labels,
            plan=Plan.from_bins(lengths, np.split(np.arange(len(lengths)), offsets[1:-1]), self.capacity,
                                algorithm=self.algorithm),
            layout=self.layout, num_rows=num_rows if padded else None, row_len=self.capacity if padded else None,
            pad_token_id=self.pad_token_id, ignore_index=self.ignore_index, mask_first_label=self.mask_first_label,
            position_ids_start=self.position_ids_start, fields=fields, pad_values=self.pad_values,
            extra_fields=self.extra_fields, mrope=self.mrope)

    def _add_ids(self, batch: dict, rows: list) -> dict:
        if self.return_example_ids:
            per_row = [[p[0] for p in row] for row in rows]
            if self.rows_per_item is None:
                batch["example_ids"] = per_row[0]
            else:
                if self.layout == "padded":
                    per_row += [[] for _ in range(self.rows_per_item - len(rows))]
                batch["example_ids"] = per_row
        return batch

    def _item(self, rows: list) -> dict:
        """One item: ``pack_sequences`` of its rows (padded to ``rows_per_item`` rows in the padded layout)."""
        return self._add_ids(self._pack(rows, self.rows_per_item), rows)

    def _items(self, rows: list) -> list:
        """``len(rows) // k`` items of ``k`` rows each, equal key by key to :meth:`_item` of each group.

        One ``pack_sequences`` call packs them all (per-call overhead dominates one small row); each item
        is then cut out of it: its rows' tokens, its ``cu_seq_lens`` entries shifted to start at 0 and its
        ``seq_idx`` renumbered from 0. Slices are cloned so an item never keeps the others' memory alive
        (nor ships it to the main process from a DataLoader worker).
        """
        k = self.rows_per_item or 1
        cap = self.capacity
        if self.mrope is not None or any(p[4] for row in rows for p in row):
            # Extra fields (vision tensors, [4, B, L] positions): one pack per item, no slicing to get wrong.
            return [self._item(rows[j * k:(j + 1) * k]) for j in range(len(rows) // k)]
        batch = self._pack(rows, None)
        piece_len = [[len(p[2]) for p in row] for row in rows]
        row_tokens = np.array([sum(r) for r in piece_len], np.int64)
        row_longest = np.array([max(r) for r in piece_len], np.int64)
        padded = self.layout == "padded"
        if padded:  # output segments per row: its pieces, plus one for a padding tail
            segs = np.array([len(r) for r in rows], np.int64) + (row_tokens < cap)
        else:
            segs = np.array([len(r) for r in rows], np.int64)
        seg_cum = np.concatenate(([0], np.cumsum(segs))).tolist()
        tok_cum = np.concatenate(([0], np.cumsum(row_tokens))).tolist()
        ids, labels, pos, seq_idx, cu = (batch[key] for key in ("input_ids", "labels", "position_ids", "seq_idx",
                                                                "cu_seq_lens_q"))
        items = []
        for j in range(len(rows) // k):
            r0, r1 = j * k, (j + 1) * k
            s0, s1 = seg_cum[r0], seg_cum[r1]
            longest = int(row_longest[r0:r1].max())
            if padded:
                window = (slice(r0, r1),)
                shift = r0 * cap
                longest = max(longest, int(cap - row_tokens[r0:r1].min()))
            else:
                window = (slice(None), slice(tok_cum[r0], tok_cum[r1]))
                shift = tok_cum[r0]
            cu_item = cu[s0:s1 + 1] - shift
            item = {"input_ids": ids[window].clone(), "labels": labels[window].clone(),
                    "position_ids": pos[window].clone(), "seq_idx": seq_idx[window] - s0,
                    "cu_seq_lens_q": cu_item, "cu_seq_lens_k": cu_item, "max_length_q": longest,
                    "max_length_k": longest}
            items.append(self._add_ids(item, rows[r0:r1]))
        return items

    # --------------------------------------------------------------------------------------- iteration
    def __iter__(self):
        shard, num_shards = self._shard()
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            if (loaded["shard"], loaded["num_shards"]) != (shard, num_shards):
                raise ValueError(f"the state was saved by shard {loaded['shard']} of {loaded['num_shards']} but this "
                                 f"pass is shard {shard} of {num_shards} (shard = rank * num_workers + worker); "
                                 f"resume with the same world size and number of DataLoader workers")
            progress = _Progress(loaded["epoch"], shard, num_shards, loaded["next_position"], loaded.get("stats"))
            pending = [(p[0], p[1]) for p in loaded["carry"]] + [tuple(p) for row in loaded["ready"] for p in row]
            pieces, fresh = self._open(progress, pending)
            progress.carry = [pieces[(p[0], p[1])] for p in loaded["carry"]]
            progress.carry_ages = [p[2] for p in loaded["carry"]]
            progress.ready.extend([pieces[tuple(p)] for p in row] for row in loaded["ready"])
        else:
            progress = _Progress(self._epoch, shard, num_shards)
            fresh = self._stream(0, shard, num_shards, progress.epoch)
        self._progress = progress
        if self.context_parallel is None:
            yield from self._run(progress, fresh)
        else:
            cp_size, cp_rank, mode = self.context_parallel
            for item in self._run(progress, fresh):
                yield shard_context_parallel(item, cp_size, cp_rank, mode, pad_token_id=self.pad_token_id,
                                             ignore_index=self.ignore_index)
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

    def _drain(self, progress: _Progress, final: bool):
        """Yields the items the ready rows make (all of them, the last one partial, when ``final``).

        A row leaves ``progress.ready`` only as its item is yielded, so ``state_dict`` taken between items
        lists exactly the rows not delivered yet.
        """
        k = self.rows_per_item or 1
        ready, stats = progress.ready, progress.stats
        full = len(ready) // k * k
        if full:
            rows = list(itertools.islice(ready, full))
            for j, item in enumerate(self._items(rows)):
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
            yield self._item(rows)

    def _run(self, progress: _Progress, fresh: Iterator):
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
            planned = make_plan(lengths, capacity, algorithm=self.algorithm, pad_to_multiple_of=self._cp_multiple)
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
            for b in np.flatnonzero(keep):
                ready.append(sorted((pool[i] for i in bins[b].tolist()), key=lambda p: (p[0], p[1])))
            yield from self._drain(progress, exhausted)
        yield from self._drain(progress, True)

    def __repr__(self) -> str:
        return (f"PackedIterableDataset(capacity={self.capacity}, buffer_size={self.buffer_size}, "
                f"algorithm={self.algorithm!r}, overlong={self.overlong!r}, rows_per_item={self.rows_per_item}, "
                f"layout={self.layout!r}, source={type(self.source).__name__})")
