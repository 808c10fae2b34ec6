"""Point ``swift sft --packing true`` at packkit's planned packing (imports ms-swift).

Why a patch and not a strategy name: ``--packing_strategy`` is typed ``Literal['binpack', 'sequential']`` in
ms-swift's arguments, so a new name is refused at parsing; and a dataset alone cannot keep a step's rows together,
because the trainer's ``BatchSamplerShard`` shuffles rows. So :func:`install` swaps two names, nothing else:

* ``swift.pipelines.train.sft.PackingDataset`` / ``IterablePackingDataset`` (the names ``swift sft`` builds its
  packed datasets from) -> :class:`PlannedPackingDataset` / :class:`PlannedIterablePackingDataset`;
* inside ``DataLoaderMixin.get_train_dataloader`` (ms-swift's trainers inherit it), and only while its
  ``train_dataset`` is a :class:`PlannedPackingDataset`, ``BatchSamplerShard`` -> :class:`PlannedBatchSamplerShard`
  (shuffles steps, not rows). Any other dataset gets ms-swift's own sampler.

Load it with ``--external_plugins`` (ms-swift imports those files in every rank before building datasets).
"""
from __future__ import annotations

import functools
import os
import threading

_LOCK = threading.Lock()
_STATE: dict = {}


def options_from_env(environ=None) -> dict:
    """``install``'s keywords from ``PACKKIT_SWIFT_DP_SIZE`` (a positive int), ``PACKKIT_SWIFT_COST``
    (``attention``, ``tokens`` or ``a,b``) and ``PACKKIT_SWIFT_ALGORITHM`` (``obfd``, ``ogbfd``); unset: None."""
    environ = os.environ if environ is None else environ
    dp_size, cost = environ.get("PACKKIT_SWIFT_DP_SIZE"), environ.get("PACKKIT_SWIFT_COST") or None
    algorithm = environ.get("PACKKIT_SWIFT_ALGORITHM") or None
    if dp_size is not None:
        if not dp_size.strip().isdigit() or int(dp_size) < 1:
            raise ValueError(f"PACKKIT_SWIFT_DP_SIZE must be a positive integer, got {dp_size!r}")
        dp_size = int(dp_size)
    if cost is not None and cost not in ("attention", "tokens"):
        try:
            a, b = (float(x) for x in cost.split(","))
        except ValueError:
            raise ValueError(f"PACKKIT_SWIFT_COST must be 'attention', 'tokens' or two numbers 'a,b', got {cost!r}") \
                from None
        cost = (a, b)
    if algorithm not in (None, "obfd", "ogbfd"):
        raise ValueError(f"PACKKIT_SWIFT_ALGORITHM must be 'obfd' or 'ogbfd', got {algorithm!r}")
    return {"dp_size": dp_size, "cost": cost, "algorithm": algorithm}


def _sampler_for(dataset):
    from .sampler import PlannedBatchSamplerShard

    return functools.partial(PlannedBatchSamplerShard, planned_dp_size=dataset.dp_size)


def install(*, dp_size=None, cost=None, algorithm=None) -> None:
    """Make ``swift sft --packing true`` (and every trainer built on ms-swift's ``DataLoaderMixin``) use packkit.

    ``dp_size``, ``cost``, ``algorithm``: defaults for the planned datasets (see :class:`PlannedPackingDataset`).
    Idempotent: a second call only updates those defaults. :func:`uninstall` restores ms-swift's names.
    """
    from swift.pipelines.train import sft
    from swift.trainers import mixin

    from ...models import prepare_trainer_model
    from .dataset import PlannedIterablePackingDataset, PlannedPackingDataset

    options = {"dp_size": dp_size, "cost": cost, "algorithm": algorithm}
    with _LOCK:
        _STATE["options"] = options
        if _STATE.get("installed"):
            return

        class SftPackingDataset(PlannedPackingDataset):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**_STATE["options"], **kwargs})

        class SftIterablePackingDataset(PlannedIterablePackingDataset):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**_STATE["options"], **kwargs})

        original_loader = mixin.DataLoaderMixin.get_train_dataloader
        original_sampler = mixin.BatchSamplerShard

        @functools.wraps(original_loader)
        def get_train_dataloader(self, *args, **kwargs):
            if not isinstance(self.train_dataset, PlannedPackingDataset):
                return original_loader(self, *args, **kwargs)
            prepare_trainer_model(self)  # packed batches exact for this model, or a ValueError naming why not
            with _LOCK:  # the module name is read inside the call; nobody else swaps it meanwhile
                mixin.BatchSamplerShard = _sampler_for(self.train_dataset)
                try:
                    return original_loader(self, *args, **kwargs)
                finally:
                    mixin.BatchSamplerShard = original_sampler

        _STATE.update(installed=True, sft=(sft.PackingDataset, sft.IterablePackingDataset),
                      loader=original_loader)
        sft.PackingDataset, sft.IterablePackingDataset = SftPackingDataset, SftIterablePackingDataset
        mixin.DataLoaderMixin.get_train_dataloader = get_train_dataloader


def uninstall() -> None:
    """Restore ms-swift's own packing datasets and dataloader."""
    from swift.pipelines.train import sft
    from swift.trainers import mixin

    with _LOCK:
        if not _STATE.get("installed"):
            return
        sft.PackingDataset, sft.IterablePackingDataset = _STATE["sft"]
        mixin.DataLoaderMixin.get_train_dataloader = _STATE["loader"]
        _STATE.clear()
