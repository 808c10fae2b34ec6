"""``packkit.PackedBatchSampler``: a ``batch_sampler`` that packs a map-style dataset for data parallelism.

Each epoch is planned as a whole with :func:`packkit.plan` (``ogbfd`` by default, ``dp_size =
world_size``), from the dataset's lengths in a seeded per-epoch permutation. Every rank computes the
same plan from the same inputs (no communication) and yields its own rows: one yielded item is the
list of dataset indices packed into one row of ``capacity`` tokens, for

    DataLoader(dataset, batch_sampler=sampler, collate_fn=packkit.PackingCollator(capacity, layout="padded"))

Guarantees, per epoch: every rank yields the same number of steps; with ``drop_last=False`` every
sample with ``1 <= length <= capacity`` (and, with ``overlong="truncate"``, every longer one) is
yielded exactly once over all ranks; a rank whose row at the last step is empty yields ``[]`` (the
collator turns it into a row of pure padding), so no rank skips a collective. Per-step rank costs
are balanced by the planner under ``cost``.
"""
from __future__ import annotations

import hashlib
import numbers
from collections.abc import Mapping
from typing import Callable, Iterator, Optional, Union

import numpy as np
import torch
from torch.utils.data import Sampler

from ...context_parallel import cp_plan_multiple, parse_context_parallel
from ...context_parallel.shard import check_cp_capacity
from ...packing.static_shapes import check_max_sequences, documents_per_row
from ...planning.planner import ALGORITHMS, CostSpec, Plan, _cost_model, as_extra_cost, as_lengths
from .args import cost_tag, int_arg
from .epoch import EpochPlan, plan_epoch
from .ranks import cp_data_parallel_rank, resolve_rank, verify_same_plan

SAMPLER_OVERLONG = ("error", "drop", "truncate")
STATE_VERSION = 1
MAX_ROWS_PER_STEP = 2**24
ROWS_PER_STEP_FLOOR = 2**16


class PackedBatchSampler(Sampler[list[int]]):
    """Packs a map-style dataset into rows of ``capacity`` tokens, balanced across data-parallel ranks.

    Args:
        lengths: token count of every dataset item (list, tuple, numpy integer array or 1-D integer
            tensor), in dataset index order. :meth:`from_dataset` reads them from a dataset.
        capacity: tokens per row.
        rank, world_size: this process's data-parallel rank and the number of data-parallel ranks.
            Default: from ``torch.distributed`` (``group``, default the world) when initialised,
            else 0 and 1. With tensor/pipeline parallelism pass the *data-parallel* rank and size
            (or the data-parallel ``group``): ranks of one model replica must get the same rows.
        group: process group to read rank/world_size from (ignored when both are given).
        shuffle: per-epoch permutation of the dataset from ``np.random.default_rng((seed, epoch))``
            (changes which equal-length samples share rows) and a permutation of the order of steps
            (the planner emits steps sorted by cost, so without it an epoch runs its longest
            sequences first). The incomplete last step, if any, stays last. ``shuffle=False``:
            dataset index order, and the steps in the dataset order of their longest sample (not the
            planner's order, a length sort; not their first sample, which is early by chance in a step of
            many short samples): for a dataset in random order, no length trend either way.
        seed: shuffle seed; must be the same on every rank.
        drop_last: ``False`` (default): every sample is used exactly once; a rank with no row at
            the last step yields ``[]``. ``True``: the last step is dropped if any rank's row in it
            is empty (its samples are listed in :attr:`dropped_last`).
        algorithm: planner algorithm (``"ogbfd"``, the only one that balances ranks, by default).
        cost: cost model the per-step rank costs are balanced under (see :func:`packkit.plan`).
        overlong: samples longer than ``capacity``: ``"error"`` (ValueError at construction),
            ``"drop"`` (never yielded; :attr:`dropped`) or ``"truncate"`` (yielded and planned as
            ``capacity`` tokens; the collator must truncate them, e.g.
            ``PackingCollator(capacity, overlong="truncate")``; :attr:`truncated`). ``"split"`` is
            refused: a sampler yields whole samples.
        rows_per_step: rows each rank gets per optimizer step (gradient accumulation). The epoch is
            planned with ``world_size * rows_per_step`` rows per step and each step's rows are dealt
            ``rows_per_step`` to a rank so that the ranks' *sums* are level (costliest row first to
            the rank with the least so far). One yielded item is still one row: a rank yields its
            ``k`` rows of a step one after another, so ``DataLoader(batch_sampler=sampler)`` gives
            ``k`` micro-batches per optimizer step, as HF ``Trainer(gradient_accumulation_steps=k)``
            and torchtune expect. ``len(sampler) = num_steps * k``; ``drop_last`` drops a whole step.
        context_parallel: ``(cp_size, cp_rank)`` or ``(cp_size, cp_rank, mode)``: rows are planned with
            ``pad_to_multiple_of=2 * cp_size`` in zigzag mode (capacity must be a multiple), so each row still
            fits once its documents are CP-padded; give the collator the same ``context_parallel=`` to get the
            rank's shard. Every rank of a CP group gets the same rows: ``rank``/``world_size`` are
            data-parallel; taken from ``torch.distributed`` they are ``global rank // cp_size`` and
            ``world size // cp_size`` (CP groups of consecutive ranks).
        extra_cost: per-sample cost added to each sample's ``cost`` in the balance (one finite value >= 0 per
            sample, dataset order, the cost's units), e.g. ``packkit.vision_cost(config).per_sample(grids)``
            for a VLM's images: see :func:`packkit.plan`. Part of the resume fingerprint.
        max_sequences: the static-shape contract (docs/packing.md "Static shapes"): every yielded row collates
            under ``PackingCollator(max_sequences=N)``: rows are planned with at most ``N - 1`` samples (a row's
            padding takes a slot; ``N=1``: one sample per row), by every algorithm (ogbfd keeps balancing within
            it). Part of the resume fingerprint.

    Zero-length samples hold no tokens, are planned into no row and are never yielded
    (:attr:`zero_length`).
    """

    def __init__(self, lengths, capacity: int, *, rank: Optional[int] = None, world_size: Optional[int] = None,
                 group=None, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 algorithm: str = "ogbfd", cost: CostSpec = "attention", overlong: str = "error",
                 rows_per_step: int = 1, context_parallel=None, extra_cost=None, max_sequences=None):
        self.context_parallel = parse_context_parallel(context_parallel)
        self._cp_multiple = cp_plan_multiple(self.context_parallel)
        if self.context_parallel is not None and rank is None and world_size is None:
            rank, world_size = cp_data_parallel_rank(group, self.context_parallel[0])
        self.max_sequences = check_max_sequences(max_sequences)
        self.lengths = as_lengths(lengths).copy()
        self.lengths.flags.writeable = False
        self.extra_cost = as_extra_cost(extra_cost, len(self.lengths))
        if self.extra_cost is not None:
            self.extra_cost.flags.writeable = False
        if (self.lengths < 0).any():
            i = int(np.flatnonzero(self.lengths < 0)[0])
            raise ValueError(f"lengths must be >= 0; index {i} is {int(self.lengths[i])}")
        self.capacity = int_arg(capacity, "capacity")
        if self.capacity <= 0:
            raise ValueError(f"capacity must be a positive int, got {self.capacity}")
        check_cp_capacity(self._cp_multiple, self.capacity)
        self.rank, self.world_size = resolve_rank(rank, world_size, group)
        for name, value in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.seed = int_arg(seed, "seed")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0 (numpy SeedSequence), got {self.seed}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
        self.algorithm = algorithm
        if overlong == "split":
            raise ValueError("overlong='split' is not supported by PackedBatchSampler: it yields whole samples, "
                             f"so a split sample would appear in several rows; allowed: {', '.join(SAMPLER_OVERLONG)}")
        if overlong not in SAMPLER_OVERLONG:
            raise ValueError(f"unknown overlong policy {overlong!r}; allowed: {', '.join(SAMPLER_OVERLONG)}")
        self.overlong = overlong
        a, b, cost_fn = _cost_model(cost)  # validates now rather than at the first plan
        # a transformers config becomes its (a, b), so the state fingerprint names the numbers
        self.cost = (a, b) if cost_fn is None and not isinstance(cost, (str, tuple, list)) else cost
        self.rows_per_step = int_arg(rows_per_step, "rows_per_step")
        if self.rows_per_step < 1:
            raise ValueError(f"rows_per_step must be >= 1, got {self.rows_per_step}")
        # The planner's dp_size limit, and rows a step can fill: rows_per_step=2**20 for 5 samples took over 20 s
        # dealing a million empty rows (found by tools/api_fuzz.py). 65,536 rows per step stay allowed always.
        limit = min(MAX_ROWS_PER_STEP, max(ROWS_PER_STEP_FLOOR, len(self.lengths)))
        if self.world_size * self.rows_per_step > limit:
            raise ValueError(f"world_size * rows_per_step = {self.world_size} * {self.rows_per_step} rows per step; "
                             f"at most {limit} for {len(self.lengths)} samples")
        over = np.flatnonzero(self.lengths > self.capacity)
        if overlong == "error" and len(over):
            i = int(over[0])
            raise ValueError(f"{len(over)} samples are longer than capacity {self.capacity} (first: index {i}, "
                             f"{int(self.lengths[i])} tokens); pass overlong='drop' or 'truncate'")
        self.dropped = over if overlong == "drop" else np.zeros(0, np.int64)
        self.truncated = over if overlong == "truncate" else np.zeros(0, np.int64)
        self.zero_length = np.flatnonzero(self.lengths == 0)
        self._lengths_digest = hashlib.blake2b(self.lengths.tobytes(), digest_size=16).hexdigest()
        self._cost_tag: Optional[str] = None
        self.epoch = 0
        self._epoch_data: Optional[EpochPlan] = None
        self._steps_done = 0
        self._resume_from: Optional[int] = None

    # -- construction helpers --------------------------------------------------------------------
    @classmethod
    def from_dataset(cls, dataset, capacity: int, *, length_key: Union[str, Callable] = "input_ids",
                     **kwargs) -> "PackedBatchSampler":
        """Reads the lengths from a map-style dataset, then as the constructor (keyword arguments).

        ``length_key``: a callable mapping an item to its length, or a key whose value is the
        length (an int) or a sequence whose ``len`` is. A Hugging Face ``datasets.Dataset`` column of
        that name is read in one go. This touches every item once; precompute a length column for
        large datasets.
        """
        def length_of(value, where):
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                return int(value)
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                return int_arg(value, where)
            try:
                return len(value)
            except TypeError:
                raise TypeError(f"{where}: expected a length (int) or a sequence, got {type(value).__name__}") from None

        if callable(length_key):
            values = [length_key(dataset[i]) for i in range(len(dataset))]
            lengths = [length_of(v, f"length_key(dataset[{i}])") for i, v in enumerate(values)]
        elif isinstance(length_key, str):
            if length_key in (getattr(dataset, "column_names", None) or ()):
                column = dataset[length_key]
                lengths = [length_of(v, f"dataset[{length_key!r}][{i}]") for i, v in enumerate(column)]
            else:
                lengths = []
                for i in range(len(dataset)):
                    item = dataset[i]
                    if not isinstance(item, Mapping) or length_key not in item:
                        raise ValueError(f"dataset[{i}] has no {length_key!r} key; pass length_key= a key or a callable")
                    lengths.append(length_of(item[length_key], f"dataset[{i}][{length_key!r}]"))
        else:
            raise TypeError(f"length_key must be a str or a callable, got {type(length_key).__name__}")
        return cls(np.asarray(lengths, dtype=np.int64), capacity, **kwargs)

    # -- epochs ----------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's permutation. A pending resume (from :meth:`load_state_dict`) is kept
        only if ``epoch`` is the resumed epoch."""
        epoch = int_arg(epoch, "epoch")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self._resume_from = None
            self._steps_done = 0
        self.epoch = epoch

    def _data(self) -> EpochPlan:
        if self._epoch_data is None or self._epoch_data.epoch != self.epoch:
            self._epoch_data = plan_epoch(self.lengths, self.capacity, epoch=self.epoch, seed=self.seed,
                                          shuffle=self.shuffle, drop_last=self.drop_last, algorithm=self.algorithm,
                                          cost=self.cost, overlong=self.overlong, world_size=self.world_size,
                                          rows_per_step=self.rows_per_step,
                                          pad_to_multiple_of=self._cp_multiple, extra_cost=self.extra_cost,
                                          max_sequences=documents_per_row(self.max_sequences))
        return self._epoch_data

    def __len__(self) -> int:
        """Items (rows) this rank yields in the current epoch: ``num_steps * rows_per_step``; the same
        on every rank."""
        return self._data().num_items()

    def __iter__(self) -> Iterator[list[int]]:
        data = self._data()
        start = self._resume_from if self._resume_from is not None else 0
        self._resume_from = None
        self._steps_done = start
        return self._rows(data, start)

    def _rows(self, data: EpochPlan, start: int) -> Iterator[list[int]]:
        for item in range(start, data.num_items()):
            self._steps_done = item + 1  # counted when handed out, so state_dict() includes this row
            yield data.row(item, self.rank)

    def batches(self, rank: Optional[int] = None) -> list[list[int]]:
        """All of ``rank``'s rows (default this rank) for the current epoch, in yielded order."""
        rank = self.rank if rank is None else int_arg(rank, "rank")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        data = self._data()
        return [data.row(item, rank) for item in range(data.num_items())]

    # -- plan figures ----------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        """Optimizer steps in the current epoch (``len(self) // rows_per_step``)."""
        return len(self._data().step_order)

    @property
    def plan(self) -> Plan:
        """The current epoch's :class:`~packkit.Plan`. Its indices are positions in
        :attr:`permutation` (``sampler.permutation[i]`` is the dataset index) and its steps are in
        planner order (yielded step ``k`` is plan step ``sampler.step_order[k]``)."""
        return self._data().plan

    @property
    def permutation(self) -> np.ndarray:
        return self._data().permutation

    @property
    def step_order(self) -> np.ndarray:
        return self._data().step_order

    @property
    def dropped_last(self) -> np.ndarray:
        """Dataset indices in the last step dropped by ``drop_last=True`` this epoch (sorted)."""
        return self._data().dropped_last

    @property
    def rank_costs(self) -> np.ndarray:
        """float64 ``[num_steps, world_size]``: each rank's cost (sum of its ``rows_per_step`` rows) at each
        yielded step."""
        return self._data().rank_costs

    @property
    def balance(self) -> float:
        """Sum over steps of the slowest rank's cost / sum of the step means (>= 1; 1 is perfect)."""
        costs = self.rank_costs
        mean_total = float(costs.mean(axis=1).sum()) if len(costs) else 0.0
        return float(costs.max(axis=1).sum()) / mean_total if mean_total > 0 else 1.0

    @property
    def rank_balance(self) -> float:
        """max / mean of the ranks' total costs over the epoch (>= 1)."""
        totals = self.rank_costs.sum(axis=0)
        return float(totals.max() / totals.mean()) if len(self.rank_costs) and totals.mean() > 0 else 1.0

    # -- resume ----------------------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        # context_parallel: its (cp_size, mode) changes the plan (documents padded to 2 * cp_size); cp_rank does
        # not (every rank of a CP group has the same rows), so a state moves between the ranks of a group.
        cp = None if self.context_parallel is None else [self.context_parallel[0], self.context_parallel[2]]
        if self._cost_tag is None:  # a callable cost is named by what it returns on this dataset's lengths
            self._cost_tag = cost_tag(self.cost, np.unique(np.append(self.lengths, self.capacity)))
        return {"capacity": self.capacity, "world_size": self.world_size, "num_samples": len(self.lengths),
                "lengths_digest": self._lengths_digest, "algorithm": self.algorithm, "cost": self._cost_tag,
                "overlong": self.overlong, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "rows_per_step": self.rows_per_step, "context_parallel": cp, "max_sequences": self.max_sequences,
                "extra_cost": None if self.extra_cost is None else
                hashlib.blake2b(self.extra_cost.tobytes(), digest_size=16).hexdigest()}

    def state_dict(self, steps_done: Optional[int] = None) -> dict:
        """``{"version", "epoch", "seed", "steps_done", "config"}``: the same on every rank.

        ``steps_done`` defaults to the rows this sampler has handed out in the current epoch (with
        ``rows_per_step=k`` it counts rows, i.e. micro-batches, not optimizer steps). A
        DataLoader fetches ahead of training (``prefetch_factor * num_workers`` batches, or one with
        no workers), so pass the number of steps your loop actually consumed.
        """
        if steps_done is None:
            steps_done = self._resume_from if self._resume_from is not None else self._steps_done
        steps_done = int_arg(steps_done, "steps_done")
        if not 0 <= steps_done <= len(self):
            raise ValueError(f"steps_done must be in [0, {len(self)}] (steps in epoch {self.epoch}), got {steps_done}")
        return {"version": STATE_VERSION, "epoch": self.epoch, "seed": self.seed, "steps_done": steps_done,
                "config": self._fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        """Restores the epoch; the next ``__iter__`` starts right after ``steps_done`` rows.

        Raises ValueError if the state was saved with a different configuration (capacity,
        world_size, lengths, algorithm, cost, overlong, shuffle, drop_last, rows_per_step, context_parallel
        size and mode, extra_cost, max_sequences, seed). A callable ``cost`` is compared by its values on this dataset's lengths.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        missing = [k for k in ("version", "epoch", "seed", "steps_done", "config") if k not in state]
        if missing:
            raise ValueError(f"state is missing {missing}; expected a dict from PackedBatchSampler.state_dict()")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"unsupported state version {state['version']!r} (this packkit reads {STATE_VERSION})")
        if not isinstance(state["config"], Mapping):
            raise ValueError(f"state['config'] must be the dict state_dict() saved, got {type(state['config']).__name__}")
        mine = self._fingerprint()
        theirs = dict(state["config"])
        theirs.setdefault("rows_per_step", 1)  # states saved before rows_per_step existed
        theirs.setdefault("context_parallel", None)  # ... and before context_parallel did
        theirs.setdefault("extra_cost", None)  # ... and before extra_cost did
        theirs.setdefault("max_sequences", None)  # ... and before max_sequences did
        if isinstance(theirs["context_parallel"], tuple):  # a state kept in memory rather than serialised
            theirs["context_parallel"] = list(theirs["context_parallel"])
        diff = {k: (theirs.get(k), mine[k]) for k in mine if theirs.get(k) != mine[k]}
        if int_arg(state["seed"], "seed") != self.seed:
            diff["seed"] = (state["seed"], self.seed)
        if diff:
            detail = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"state does not match this sampler ({detail})")
        epoch = int_arg(state["epoch"], "epoch")
        steps_done = int_arg(state["steps_done"], "steps_done")
        self.set_epoch(epoch)
        if not 0 <= steps_done <= len(self):
            raise ValueError(f"steps_done must be in [0, {len(self)}], got {steps_done}")
        self._resume_from = steps_done
        self._steps_done = steps_done

    # -- multi-process check -----------------------------------------------------------------------
    def plan_digest(self) -> str:
        """Hash of the current epoch's rows on every rank (configuration, epoch and layout)."""
        data = self._data()
        h = hashlib.blake2b(digest_size=16)
        h.update(repr(sorted(self._fingerprint().items())).encode())
        h.update(repr((self.epoch, self.seed)).encode())
        for array in (data.permutation, data.step_order, data.plan.segments.seq_index, data.plan.segments.bin_offsets):
            h.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
        return h.hexdigest()

    def verify(self, group=None) -> None:
        """Collective: checks that every rank of ``group`` has the same plan for the current epoch
        and a distinct rank (RuntimeError otherwise). Call it on every rank, e.g. once after
        construction; it needs an initialised ``torch.distributed``."""
        verify_same_plan(self.rank, self.world_size, self.epoch, self.plan_digest(), group)

    def __repr__(self) -> str:
        return (f"PackedBatchSampler(samples={len(self.lengths)}, capacity={self.capacity}, rank={self.rank}, "
                f"world_size={self.world_size}, epoch={self.epoch}, algorithm={self.algorithm!r}, "
                f"shuffle={self.shuffle}, drop_last={self.drop_last}, rows_per_step={self.rows_per_step})")
