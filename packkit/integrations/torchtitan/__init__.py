"""torchtitan 0.3 drop-in: a dataloader of best-fit packed rows (no document cut at row ends), every step
balanced across the data-parallel ranks, resumable exactly per rank.

* :class:`BalancedDocumentStream` (``stream.py`` + ``documents.py``, no torchtitan import): the stream of ``({"input",
  "positions"}, labels)`` batches.
* :class:`PackkitDataLoader` and :func:`torchtitan_cost` (``loader.py``): torchtitan's ``BaseDataLoader``
  config/loader and the balance cost of a torchtitan model config; these import torchtitan on first use
  (``pip install 'packkit[torchtitan]'``).
* :func:`guard_pipeline_stages` / :func:`check_stage_kwargs` (``pipeline.py``) and :class:`PackkitTrainer`
  (``trainer.py``): packkit's check on every pipeline stage's micro-batch metadata, and torchtitan's ``Trainer``
  with it (docs/torchtitan.md "Pipeline parallelism").
"""
from .stream import BalancedDocumentStream

__all__ = ["BalancedDocumentStream", "PackkitDataLoader", "torchtitan_cost", "PackkitTrainer", "guard_pipeline_stages",
           "check_stage_kwargs"]


def __getattr__(name):
    if name in ("PackkitDataLoader", "torchtitan_cost"):
        from . import loader

        return getattr(loader, name)
    if name in ("guard_pipeline_stages", "check_stage_kwargs"):
        from . import pipeline

        return getattr(pipeline, name)
    if name == "PackkitTrainer":
        from . import trainer

        return trainer.PackkitTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
