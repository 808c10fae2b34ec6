"""LLaMA-Factory 0.9.5 drop-in for ``packing`` / ``neat_packing``: one global packkit plan instead of
``greedy_knapsack`` over 1,000-example chunks, rows of a step balanced across data-parallel ranks.

* :func:`install` / :func:`uninstall` (``hook.py``, imports llamafactory on call): patch the SFT dataset loader
  and the trainer's sampler (docs/llamafactory.md says why this hook and not the v1 batching plugin).
* :func:`pack_dataset` (``dataset.py``, needs ``datasets``): an unpacked tokenized dataset -> LLaMA-Factory's
  packed columns, for LLaMA-Factory's own ``SFTDataCollatorWith4DAttentionMask`` unchanged.
* :func:`plan_rows`, :func:`build_rows` (``rows.py``, numpy only): the plan in rank order; one row's columns.
"""
from .dataset import is_planned, pack_dataset
from .hook import install, uninstall
from .rows import RowPlan, build_rows, plan_rows

__all__ = ["RowPlan", "build_rows", "install", "is_planned", "pack_dataset", "plan_rows", "uninstall"]
