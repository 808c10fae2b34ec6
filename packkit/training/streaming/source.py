"""Reading the source for one shard: by index when it is indexable, else as a stream that every shard
reads whole and keeps only its own positions of (worker and rank sharding by source position)."""
from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping
from typing import Callable, Iterator, Optional

import torch
import torch.utils.data

_HF_BATCH = 256  # rows per read from a datasets.IterableDataset


def shard_of(rank: Optional[int], world_size: Optional[int], cp_size: int = 1) -> tuple[int, int]:
    """(shard, num_shards) for the calling process: rank * num_workers + worker of world * workers;
    rank and world_size default to ``torch.distributed`` when initialised, else one rank. With context
    parallelism every rank of a CP group (``cp_size`` consecutive ranks) reads the same examples."""
    world = world_size
    if world is None:
        rank, world = 0, 1
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            if cp_size > 1:
                if world % cp_size:
                    raise ValueError(f"world size {world} is not a multiple of cp_size {cp_size}")
                rank, world = rank // cp_size, world // cp_size
    info = torch.utils.data.get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank * workers + worker, world * workers


class SourceReader:
    """The source of a :class:`~packkit.PackedIterableDataset`, read as ``(position, example)`` pairs."""

    def __init__(self, source):
        self.source = source
        self._oneshot_used = False  # a one-shot iterator can serve one pass only

    def hf_iterable(self) -> bool:
        datasets = sys.modules.get("datasets")
        return datasets is not None and isinstance(self.source, datasets.IterableDataset)

    def indexable(self) -> bool:
        s = self.source
        if callable(s) and not hasattr(s, "__len__"):
            return False
        if isinstance(s, torch.utils.data.IterableDataset) or isinstance(s, Mapping):
            return False
        return hasattr(s, "__len__") and hasattr(s, "__getitem__")

    def stream(self, begin: int, shard: int, num_shards: int, epoch: int, must_reach: int = 0) -> Iterator:
        """(position, example) for this shard's positions >= begin, in source order. ValueError (while
        iterating) if the source holds fewer than ``must_reach`` examples (a resumed ``next_position``)."""
        source = self.source
        if hasattr(source, "set_epoch") and not callable(source):
            source.set_epoch(epoch)
        if self.indexable():
            first = begin + (shard - begin) % num_shards
            return ((p, source[p]) for p in range(first, len(source), num_shards))
        if self.hf_iterable():
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
            it = _skip(it, begin, must_reach)
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
            it = _skip(it, begin, must_reach)
            positions = itertools.count(begin)
        if num_shards == 1:
            return zip(positions, it)
        return ((p, ex) for p, ex in zip(positions, it) if p % num_shards == shard)

    def reopen(self, progress, pending: list, pieces_of: Callable) -> tuple[dict, Iterator]:
        """On resume: ({(position, start): piece} for the pending pieces, read again and cut by
        ``pieces_of(position, example)``, and the iterator of fresh (position, example) after them)."""
        shard, num_shards, epoch = progress.shard, progress.num_shards, progress.epoch
        wanted = sorted({p for p, _ in pending})
        examples = {}
        if self.indexable():
            n = len(self.source)
            if progress.next_position > n:
                raise ValueError(f"the state's next_position is {progress.next_position} but the source has {n} "
                                 f"examples: the state is not of this source")
            for p in wanted:
                if p >= n:
                    raise ValueError(f"the state names source position {p} but the source has {n} examples")
                examples[p] = self.source[p]
            fresh = self.stream(progress.next_position, shard, num_shards, epoch)
        else:
            stream = self.stream(min(wanted + [progress.next_position]), shard, num_shards, epoch,
                                 must_reach=progress.next_position)
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
            for piece in pieces_of(p, examples[p]):
                pieces[(p, piece[1])] = piece
        for key in pending:
            if tuple(key) not in pieces:
                raise ValueError(f"the state names piece (position {key[0]}, start {key[1]}) which the source's "
                                 f"example {key[0]} does not have: the source changed since the state was saved")
        return pieces, fresh


def _skip(it: Iterator, begin: int, must_reach: int) -> Iterator:
    """``it`` from its ``begin``-th item on; ValueError once it ends if it held fewer than ``must_reach`` items
    (a resumed state read further than this source goes: otherwise the epoch would silently be empty)."""
    count = sum(1 for _ in itertools.islice(it, begin))
    for item in it:
        count += 1
        yield item
    if count < must_reach:
        raise ValueError(f"the state's next_position is {must_reach} but the source ended after {count} examples: "
                         f"the state is not of this source (or the source changed since it was saved)")
