"""``MultipackBatchSampler``: axolotl's multipack batch sampler, planned by packkit so every step is balanced.

axolotl 0.19 packs in the sampler's random order by first fit and hands the items to accelerate's
``BatchSamplerShard``, which deals them round-robin (item ``s*W + r`` to rank ``r``); nothing levels the ranks'
work, so a synchronous step waits for its costliest rank. Here one epoch is one :func:`packkit.plan`
(``ogbfd``, ``dp_size * batch_size`` rows per step, balanced under ``cost``) and the items are emitted step by
step, rank 0 to ``W - 1``: the round-robin dealer then lands each row on the rank it was planned for.

No axolotl import: this module is usable (and tested) without axolotl installed.
"""
from __future__ import annotations

import hashlib
import logging
import os
from typing import Iterable, Iterator, Optional, Union

import numpy as np
from torch.utils.data import BatchSampler, RandomSampler, Sampler, SequentialSampler

from ...planning.arg_rules import MAX_RANKS, Bool, Choice, Int, Real, check_args, check_rows_per_step
from ...planning.planner import as_lengths
from ...planning.planner import plan as packkit_plan
from ...training.sampler import PackedBatchSampler
from ...training.sampler.args import int_arg
from .fill import fill_last_step, split_in_order
from .rows import item_cost_fn, rows_of

LOG = logging.getLogger(__name__)
STATE_VERSION = 1
# axolotl arguments that tune its own packer (process pool, repeated length estimates, numba grouping); packkit
# plans the whole epoch at once, so they change nothing here.
_AXOLOTL_TUNING = ("packing_efficiency_estimate", "num_count_samples", "group_size", "num_processes", "safe_mode",
                   "mp_start_method")


def default_dp_size() -> int:
    """Data-parallel ranks accelerate deals to: ``torch.distributed``'s world size, else ``$WORLD_SIZE``, else 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


class _EpochForwarder(Sampler[int]):
    """What ``sampler.sampler`` holds: the index set, and ``set_epoch`` forwarded to the batch sampler.

    accelerate's ``DataLoaderShard.set_epoch`` reaches a batch sampler only through
    ``batch_sampler.batch_sampler.sampler.set_epoch`` (it wraps ours in ``BatchSamplerShard``, which has none), and
    it swaps a plain ``RandomSampler`` found there for its own seedable one; this class is neither."""

    def __init__(self, owner: "MultipackBatchSampler"):
        self._owner = owner

    def __iter__(self):
        return iter(self._owner.indices.tolist())

    def __len__(self) -> int:
        return len(self._owner.indices)

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)


class MultipackBatchSampler(BatchSampler):
    """axolotl's ``MultipackBatchSampler`` signature, packkit's DP-balanced plan.

    Args (axolotl's):
        sampler: the dataset indices to pack (axolotl passes ``RandomSampler`` or ``SequentialSampler`` over the
            dataset). Its index set is read once; the order is packkit's own seeded per-epoch permutation (the
            same on every rank without communication), or the dataset order for a ``SequentialSampler`` or
            ``sequential=True``.
        batch_size: rows (bins) per yielded item; one item per rank per step.
        batch_max_len: tokens per row (the capacity).
        lengths: token count of every dataset item (indexed by dataset index).
        bin_size: most samples per row (axolotl's ``sample_packing_bin_size``), or None/0 for no cap: every sample
            is planned at no less than ``ceil(batch_max_len / bin_size)`` tokens, so no row can hold more.
        drop_last: kept for the signature; every step is yielded whole (see ``dropped_last``).
        sequential: keep the sampler's order (axolotl's ``sample_packing_sequentially``; None, an unset key, is
            False): next-fit rows in order, dealt round-robin, not balanced.
        packing_efficiency_estimate, num_count_samples, group_size, num_processes, safe_mode, mp_start_method:
            tune axolotl's own packer; accepted and unused.
    Args (packkit's):
        dp_size: data-parallel ranks the items are dealt to (default :func:`default_dp_size`).
        cost: what a row costs (see :func:`packkit.plan`); the plugin passes ``transformer_cost`` of the model
            config. Default ``"attention"``.
        seed: permutation seed, the same on every rank (the plugin passes the trainer's ``args.seed``).

    Per epoch, every index of the sampler is yielded exactly once: over-long samples (more than
    ``batch_max_len`` tokens) follow axolotl's rule, one alone in its own row, listed in :attr:`overlong`; a
    zero-length one rides in some row. The last step's empty rows are filled by splitting rows that hold two or
    more samples (:func:`fill_last_step`); only if no row anywhere holds two is that step dropped, its samples
    listed in :attr:`dropped_last`. ``len()`` = yielded items = steps * dp_size, the same on every rank.
    """

    def __init__(self, sampler: Union[Sampler[int], Iterable[int]], batch_size: int, batch_max_len: int,
                 lengths, bin_size: Optional[int], packing_efficiency_estimate: float = 1.0, drop_last: bool = True,
                 num_count_samples: int = 4, sequential: bool = False, group_size: int = 100_000,
                 num_processes: Optional[int] = None, safe_mode: bool = True, mp_start_method: str = "fork", *,
                 dp_size: Optional[int] = None, cost="attention", seed: int = 0):
        super().__init__(sampler, batch_size, drop_last)  # validates batch_size and drop_last as torch does
        if not hasattr(sampler, "__iter__"):
            raise TypeError(f"sampler must be a torch Sampler or an iterable of dataset indices, got "
                            f"{type(sampler).__name__}")
        # axolotl's own packer knobs: unused here, but a wrong one is still refused, by name (it was a typo there too).
        # None is what axolotl's own entry points pass for an unset config key (calculate_total_num_steps hands over
        # cfg.sample_packing_group_size, None unless set; its sampler reads `packing_efficiency_estimate or 1.0`).
        check_args(Int("batch_size", 1, MAX_RANKS), Real("packing_efficiency_estimate", 0.0, 1.0, optional=True),
                   Int("num_count_samples", 1, optional=True), Int("group_size", 1, optional=True),
                   Int("num_processes", 1, optional=True), Bool("safe_mode", optional=True),
                   Choice("mp_start_method", ("fork", "spawn", "forkserver")),
                   values=(batch_size, packing_efficiency_estimate, num_count_samples, group_size, num_processes,
                           safe_mode, mp_start_method))
        self.batch_max_len = int_arg(batch_max_len, "batch_max_len")
        if self.batch_max_len <= 0:
            raise ValueError(f"batch_max_len must be a positive int, got {self.batch_max_len}")
        self.lengths = as_lengths(lengths).copy()
        if (self.lengths < 0).any():
            i = int(np.flatnonzero(self.lengths < 0)[0])
            raise ValueError(f"lengths must be >= 0; index {i} is {int(self.lengths[i])}")
        if isinstance(bin_size, (bool, np.bool_)):  # False == 0 read as "no cap"
            raise TypeError(f"bin_size must be a positive int, 0 or None (no cap), got {bin_size!r}")
        self.bin_size = None if bin_size in (None, 0) else int_arg(bin_size, "bin_size")
        if self.bin_size is not None and self.bin_size < 0:
            raise ValueError(f"bin_size must be a positive int, 0 or None (no cap), got {self.bin_size}")
        sequential = False if sequential is None else sequential  # an unset cfg key, as axolotl reads it
        if not isinstance(sequential, (bool, np.bool_)):
            raise TypeError(f"sequential must be a bool, got {type(sequential).__name__} {sequential!r}")
        self.sequential = bool(sequential)
        self.dp_size = default_dp_size() if dp_size is None else int_arg(dp_size, "dp_size")
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        self.seed = int_arg(seed, "seed")
        self.indices = self._index_set(sampler)
        check_rows_per_step(self.dp_size * batch_size, len(self.indices),
                            f"dp_size * batch_size = {self.dp_size} * {batch_size}")
        self.shuffle = not self.sequential and not isinstance(sampler, SequentialSampler)
        real = self.lengths[self.indices]
        self.overlong = self.indices[real > self.batch_max_len]
        if len(self.overlong):
            LOG.warning("%d samples are longer than batch_max_len=%d (first: index %d, %d tokens); as in axolotl each "
                        "is packed alone in its own row (see sampler.overlong)", len(self.overlong),
                        self.batch_max_len, int(self.overlong[0]), int(self.lengths[self.overlong[0]]))
        # The planned length: at least ceil(capacity / bin_size) (the per-row sample cap) and at least 1 (a
        # zero-length sample still gets a row to ride in, so it is yielded once).
        floor = 1 if self.bin_size is None else max(1, -(-self.batch_max_len // self.bin_size))
        self.planned_lengths = np.maximum(real, floor)
        self.planned_lengths.flags.writeable = False
        self.cost = cost
        self._item_cost = item_cost_fn(cost)
        self._inner = PackedBatchSampler(self.planned_lengths, self.batch_max_len, rank=0, world_size=self.dp_size,
                                         shuffle=self.shuffle, seed=self.seed, drop_last=False, algorithm="ogbfd",
                                         cost=cost,
                                         overlong="truncate", rows_per_step=self.batch_size)
        self.sampler = _EpochForwarder(self)
        self.epoch = 0
        self._epoch_cache: Optional[tuple] = None  # (epoch, items, dropped_last, step costs)
        self._resume_from: Optional[int] = None
        self._items_done = 0

    def _index_set(self, sampler) -> np.ndarray:
        n = len(self.lengths)
        if isinstance(sampler, (RandomSampler, SequentialSampler)) and len(sampler) == n and \
                not getattr(sampler, "replacement", False):
            return np.arange(n, dtype=np.int64)  # all of the dataset; no need to draw its random order
        try:
            indices = np.fromiter((int_arg(i, "sampler index") for i in sampler), dtype=np.int64)
        except TypeError as exc:
            if "sampler index" in str(exc):
                raise
            raise TypeError(f"sampler must be a torch Sampler or an iterable of dataset indices ({exc})") from None
        if len(indices) and (indices.min() < 0 or indices.max() >= n):
            bad = int(indices[(indices < 0) | (indices >= n)][0])
            raise ValueError(f"sampler yields index {bad}, outside the {n} lengths given")
        unique = np.unique(indices)
        if len(unique) != len(indices):
            raise ValueError("sampler yields an index more than once (sampling with replacement); a packed epoch "
                             "holds each sample once")
        return indices

    # -- epochs -----------------------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's permutation (accelerate calls it through ``sampler.sampler``)."""
        epoch = int_arg(epoch, "epoch")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self._resume_from = None
            self._items_done = 0
        self.epoch = epoch

    def _epoch(self) -> tuple:
        if self._epoch_cache is None or self._epoch_cache[0] != self.epoch:
            k, w = self.batch_size, self.dp_size
            if self.sequential:  # rows in the sampler's order, consecutive rows per item (positions)
                plan = packkit_plan(self.planned_lengths, self.batch_max_len, algorithm="nf", overlong="truncate")
                rows, dropped = split_in_order(rows_of(plan, np.arange(plan.num_bins), None), w * k)
            else:
                self._inner.set_epoch(self.epoch)
                data = self._inner._data()
                # yielded (step, rank, j) -> plan bin, as EpochPlan.row computes it one row at a time
                bins = (data.step_order[:, None, None] * data.plan.dp_size + data.rank_rows[data.step_order])
                rows = rows_of(data.plan, bins.reshape(-1), data.permutation)
                steps = [[rows[(s * w + r) * k:(s * w + r + 1) * k] for r in range(w)]
                         for s in range(len(rows) // (w * k))]
                steps, dropped = fill_last_step(steps, self.planned_lengths, self._item_cost)
                rows = [row for step in steps for item in step for row in item]
            items, costs = self._items_and_costs(rows)
            dropped = np.sort(self.indices[np.asarray(dropped, dtype=np.int64)])
            self._epoch_cache = (self.epoch, items, dropped, costs)
        return self._epoch_cache

    def _items_and_costs(self, rows: list) -> tuple[list, np.ndarray]:
        """Rows of positions -> items of ``batch_size`` rows of dataset indices, and the ``[steps, dp_size]`` rank
        costs under ``cost`` at the real lengths (one vectorised pass)."""
        k, w = self.batch_size, self.dp_size
        counts = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        flat = self.indices[np.fromiter((p for r in rows for p in r), dtype=np.int64, count=int(counts.sum()))]
        ends = np.cumsum(counts)
        as_list = flat.tolist()
        index_rows = [as_list[e - c:e] for c, e in zip(counts.tolist(), ends.tolist())]
        items = [index_rows[i * k:(i + 1) * k] for i in range(len(rows) // k)]
        item_costs = np.concatenate(([0.0], np.cumsum(self._item_cost(self.lengths[flat]))))
        row_costs = item_costs[ends] - item_costs[ends - counts]
        return items, row_costs.reshape(-1, w, k).sum(axis=2) if len(rows) else np.zeros((0, w))

    def __len__(self) -> int:
        """Items yielded this epoch (steps * dp_size): exact, the same on every rank, no collective."""
        return len(self._epoch()[1])

    def __iter__(self) -> Iterator[list[list[int]]]:
        items = self._epoch()[1]
        start = self._resume_from if self._resume_from is not None else 0
        self._resume_from = None
        self._items_done = start
        return self._yield(items, start)

    def _yield(self, items, start) -> Iterator[list[list[int]]]:
        for i in range(start, len(items)):
            self._items_done = i + 1
            yield items[i]

    def generate_batches(self, set_stats: bool = False) -> list[list[list[int]]]:
        """The epoch's items in yield order (axolotl's method name)."""
        return list(self._epoch()[1])

    # -- figures ----------------------------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return len(self) // self.dp_size

    @property
    def dropped_last(self) -> np.ndarray:
        """Dataset indices of a last step that could not be filled (every row held one sample); usually empty."""
        return self._epoch()[2]

    @property
    def rank_costs(self) -> np.ndarray:
        """float64 ``[num_steps, dp_size]``: each rank's cost at each step under ``cost`` (real lengths), as the
        items are dealt."""
        return self._epoch()[3]

    @property
    def balance(self) -> float:
        """Sum over steps of the costliest rank / sum of the step means (>= 1)."""
        costs = self.rank_costs
        mean = float(costs.mean(axis=1).sum()) if costs.size else 0.0
        return float(costs.max(axis=1).sum()) / mean if mean > 0 else 1.0

    def efficiency(self) -> float:
        """Real tokens / (rows * batch_max_len) this epoch (axolotl's method; the LR-schedule count reads it)."""
        items = self._epoch()[1]
        rows = [row for item in items for row in item]
        if not rows:
            return 0.0
        tokens = sum(int(self.lengths[row].sum()) for row in rows)
        return float(tokens / (len(rows) * self.batch_max_len))

    # -- resume -----------------------------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(self.lengths.tobytes())
        h.update(self.indices.tobytes())
        h.update(repr((self.batch_size, self.batch_max_len, self.bin_size, self.sequential, self.shuffle,
                       self.dp_size, self._inner._fingerprint()["cost"])).encode())
        return h.hexdigest()

    def state_dict(self, items_done: Optional[int] = None) -> dict:
        """``{"version", "epoch", "seed", "items_done", "config"}``; ``items_done`` (default: items handed out this
        epoch, all ranks' items counted) is where the next ``__iter__`` after :meth:`load_state_dict` starts."""
        if items_done is None:
            items_done = self._resume_from if self._resume_from is not None else self._items_done
        items_done = int_arg(items_done, "items_done")
        if not 0 <= items_done <= len(self):
            raise ValueError(f"items_done must be in [0, {len(self)}], got {items_done}")
        return {"version": STATE_VERSION, "epoch": self.epoch, "seed": self.seed, "items_done": items_done,
                "config": self._fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        missing = [k for k in ("version", "epoch", "seed", "items_done", "config") if k not in state]
        if missing:
            raise ValueError(f"state is missing {missing}; expected a dict from MultipackBatchSampler.state_dict()")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"unsupported state version {state['version']!r} (this packkit reads {STATE_VERSION})")
        if state["seed"] != self.seed or state["config"] != self._fingerprint():
            raise ValueError("state does not match this sampler (different lengths, indices, batch_size, "
                             "batch_max_len, bin_size, sequential, dp_size, cost or seed)")
        self.set_epoch(state["epoch"])
        items_done = int_arg(state["items_done"], "items_done")
        if not 0 <= items_done <= len(self):
            raise ValueError(f"items_done must be in [0, {len(self)}], got {items_done}")
        self._resume_from = self._items_done = items_done

    def __repr__(self) -> str:
        return (f"packkit MultipackBatchSampler(samples={len(self.indices)}, batch_size={self.batch_size}, "
                f"batch_max_len={self.batch_max_len}, dp_size={self.dp_size}, bin_size={self.bin_size}, "
                f"sequential={self.sequential}, epoch={self.epoch})")
