"""ms-swift 4.6 drop-in: ``swift sft --packing true`` packed by one global packkit plan, steps balanced across ranks.

* :func:`plan_packed_idx` (``layout.py``, no ms-swift import): the ``packed_idx`` ms-swift's ``PackingDataset``
  reads, from one global obfd plan, or ogbfd with ``dp_size`` laid out step-major.
* :class:`PlannedPackingDataset`, :class:`PlannedIterablePackingDataset` (``dataset.py``): ms-swift's packing
  datasets with that plan; the template and its padding-free collator unchanged.
* :class:`PlannedBatchSamplerShard` (``sampler.py``): ms-swift's ``BatchSamplerShard`` shuffling whole steps.
* :func:`install` / :func:`uninstall` (``patch.py``): point ``swift sft`` at them; ``plugin.py`` is the file to pass
  to ``--external_plugins``. See docs/ms_swift.md.

ms-swift is imported only when the classes or :func:`install` are used (``pip install ms-swift==4.6.0``).
"""
from .layout import PackedIndex, plan_buffer, plan_packed_idx

__all__ = ["PackedIndex", "plan_buffer", "plan_packed_idx", "PlannedPackingDataset", "PlannedIterablePackingDataset",
           "PlannedBatchSamplerShard", "install", "uninstall"]

_LAZY = {"PlannedPackingDataset": "dataset", "PlannedIterablePackingDataset": "dataset",
         "PlannedBatchSamplerShard": "sampler", "install": "patch", "uninstall": "patch"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
