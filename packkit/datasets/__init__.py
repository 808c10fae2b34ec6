"""Stage 4, whole datasets: one global plan over a ``datasets.Dataset`` or a Ray dataset, written in TRL's
pre-packed format. ``datasets``, ``pyarrow`` and ``ray`` are imported on first call, never by ``import packkit``."""
from .global_plan import PackReport
from .hf_datasets import PackedRowsCollator, pack_dataset, read_report

__all__ = ["PackReport", "PackedRowsCollator", "pack_dataset", "read_report"]
