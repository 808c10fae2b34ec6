"""ms-swift's packing datasets with the packing step planned by packkit (imports ms-swift).

* :class:`PlannedPackingDataset` (``PackingDataset``'s constructor + ``dp_size``, ``cost``, ``algorithm``): the same
  ``packed_idx`` / ``packed_length`` contract ``__getitem__`` and ``swift sft``'s statistics read, built by one
  global plan (:func:`~packkit.integrations.swift.layout.plan_packed_idx`) instead of ``binpacking`` over
  1,000-sample chunks in worker processes; the plan is made on the master rank and broadcast, as ms-swift does.
* :class:`PlannedIterablePackingDataset` (``IterablePackingDataset``'s constructor + the same three): each
  ``packing_interval`` buffer is planned by packkit and its rows are yielded in the order ms-swift's
  ``DataLoaderDispatcher`` scatters batches (``batch_size`` rows per rank, ranks 0..W-1), so with ``dp_size`` the
  rows of a planned step reach their ranks in the same micro-step. Rows that do not complete a step are carried
  into the next buffer (ms-swift carries its last, unfinished pack the same way).

The template and its padding-free collator are ms-swift's, unchanged: ``__getitem__`` still returns the encoded
samples of one row, ``template.data_collator`` concatenates them.
"""
from __future__ import annotations

import torch.distributed as dist
from swift.dataset import IterablePackingDataset, PackingDataset
from swift.utils import get_logger, is_dist, is_master

from .layout import _check_int, plan_buffer, plan_packed_idx

logger = get_logger()


def default_dp_size() -> int:
    """The data-parallel world ms-swift's sampler deals to when tp_size is 1: the process group's size."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def template_cost(template):
    """The step cost to balance: the template's model config (:func:`packkit.transformer_cost`), else attention."""
    config = getattr(template, "config", None)
    if config is not None and (hasattr(config, "hidden_size") or hasattr(config, "text_config")):
        return config
    return "attention"


class PlannedPackingDataset(PackingDataset):
    """``swift.dataset.PackingDataset`` whose ``packed_idx`` comes from one global packkit plan.

    Extra keywords: ``dp_size`` (default: the process group's size), ``cost`` (default: the template's model
    config, see :func:`template_cost`), ``algorithm`` (``"obfd"`` or ``"ogbfd"``; default ``"ogbfd"`` when
    ``dp_size > 1``). ``packing_num_proc`` and ``packing_strategy`` are accepted and not used (one plan of all
    lengths takes milliseconds to seconds on one core). ``dropped_idx`` lists samples in no row (only when fewer
    samples than ranks are left over, see :func:`plan_packed_idx`); ``balance`` is the plan's step balance.
    """

    def __init__(self, template, dataset, num_proc: int = 1, *, strict: bool = False, load_from_cache_file: bool = True,
                 packing_length=None, packing_num_proc: int = 1, packing_strategy: str = "binpack",
                 multiprocessing_context=None, dp_size=None, cost=None, algorithm=None, **kwargs):
        # The attributes PackingDataset.__init__ sets, without its worker processes.
        template.packing = True
        template.padding_free = True
        self.template = template
        self.dataset = dataset
        self.num_proc = num_proc
        self.strict = strict
        self.load_from_cache_file = load_from_cache_file
        self.packing_strategy = packing_strategy
        self.multiprocessing_context = multiprocessing_context
        self.packing_length = _check_int(packing_length or template.max_length, "packing_length")
        self.packing_num_proc = 1
        self.dp_size = _check_int(default_dp_size() if dp_size is None else dp_size, "dp_size")
        self.cost = template_cost(template) if cost is None else cost
        state = None
        if is_master():
            packed = plan_packed_idx(dataset["lengths"], self.packing_length, dp_size=self.dp_size, cost=self.cost,
                                     algorithm=algorithm)
            if packed.dropped:
                logger.warning(f"packkit: {len(packed.dropped)} samples fit in no row of a full step of "
                               f"{self.dp_size} ranks and are not trained (first: {packed.dropped[:5]})")
            state = (packed.packed_idx, packed.packed_length, packed.dropped, packed.balance)
        if dist.is_initialized() and is_dist():
            obj_list = [state]
            dist.broadcast_object_list(obj_list)
            state = obj_list[0]
        if state is None:  # not the master, and no process group to receive the plan from
            self.packed_idx = self.packed_length = None
            self.dropped_idx, self.balance = None, None
        else:
            self.packed_idx, self.packed_length, self.dropped_idx, self.balance = state


class PlannedIterablePackingDataset(IterablePackingDataset):
    """``swift.dataset.IterablePackingDataset`` whose buffers are packed by packkit.

    Extra keywords: ``dp_size`` (ranks ``DataLoaderDispatcher`` scatters to; default the process group's size),
    ``batch_size`` (rows per rank per micro-step: ``per_device_train_batch_size``; default 1), ``cost`` and
    ``algorithm`` as :class:`PlannedPackingDataset`; ``shuffle``, ``seed``: each buffer's steps in a random order
    drawn from ``(seed, pass, buffer)`` (default), or with ``shuffle=False`` in the order of each step's longest
    sample (never the planner's, longest first). Use ``dataloader_num_workers=0`` (more workers interleave their
    rows, which keeps every row but mixes steps).
    """

    def __init__(self, template, dataset, num_proc: int = 1, *, dp_size=None, batch_size: int = 1, cost=None,
                 algorithm=None, shuffle: bool = True, seed: int = 0, **kwargs):
        super().__init__(template, dataset, num_proc, **kwargs)
        self.dp_size = _check_int(default_dp_size() if dp_size is None else dp_size, "dp_size")
        self.batch_size = _check_int(batch_size, "batch_size")
        self.cost = template_cost(template) if cost is None else cost
        self.algorithm = algorithm or ("ogbfd" if self.dp_size > 1 else "obfd")
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {type(shuffle).__name__} {shuffle!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int >= 0, got {type(seed).__name__} {seed!r}")
        if seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed}")
        self.shuffle, self.seed = shuffle, seed
        self._order_key = [0, 0]  # (pass, buffer) of the next buffer's step order

    def _plan_buffer(self, data: list, finished: bool) -> tuple[list, list]:
        """``calculate_matched_group``'s contract on ``(sample, length)`` pairs: (rows in dispatch order, carry)."""
        key = (self.seed, *self._order_key)
        self._order_key[1] += 1
        return plan_buffer(data, self.packing_length, finished, dp_size=self.dp_size, batch_size=self.batch_size,
                           cost=self.cost, algorithm=self.algorithm, shuffle=self.shuffle, seed=key)

    def __iter__(self):  # IterablePackingDataset.__iter__ with packkit's planner in place of calculate_matched_group
        try:
            next(iter(self.dataset))
        except StopIteration:
            return
        iterator = self.cyclic_iter(self.dataset) if self.cyclic else iter(self.dataset)
        self._order_key = [self._order_key[0] + 1, 0]
        data = []
        while True:
            num_samples = self._put_data_in_queue(iterator)
            finished = num_samples != self.packing_interval
            data = self._fetch_data_out_queue(data, num_samples)
            rows, data = self._plan_buffer(data, finished)
            yield from ([item[0] for item in row] for row in rows)
            if finished:
                break
