"""``install()``: LLaMA-Factory 0.9.5's ``packing`` / ``neat_packing`` planned by packkit.

Two patches, both undone by :func:`uninstall`:

* ``llamafactory.data.loader._get_preprocessed_dataset`` (``get_dataset`` looks it up at call time): for an SFT
  dataset with ``packing``, the examples are tokenized by LLaMA-Factory's own ``SupervisedDatasetProcessor``
  (its templates, truncation and multimodal tokens unchanged), then packed by :func:`.dataset.pack_dataset`:
  one plan over the whole dataset instead of ``greedy_knapsack`` per ``preprocessing_batch_size`` chunk.
* ``CustomSeq2SeqTrainer._get_train_sampler``: a sequential sampler for a packkit-planned train set, so the
  planned step order reaches accelerate's round-robin dealer intact (its random sampler would scatter a
  step's rows over other steps; the plan's steps are already shuffled by ``seed``). There, at train start, the
  line ``packkit: N steps on R ranks, balance B, efficiency E`` goes to LLaMA-Factory's own log (rank 0).
"""
from __future__ import annotations

import copy
import logging

from ...models import prepare_trainer_model
from ..start_line import start_line
from .dataset import is_planned, pack_dataset, planned_figures

LOG = logging.getLogger(__name__)
_SAVED: dict = {}


def _modules():
    try:
        from llamafactory.data import loader
        from llamafactory.train.sft import trainer
    except ImportError as exc:
        raise ImportError("packkit.integrations.llamafactory.install needs llamafactory==0.9.5 "
                          "(see docs/llamafactory.md for a CPU-safe install)") from exc
    return loader, trainer


def install(*, cost="attention", dp_size: int | None = None, seed: int | None = None, shuffle: bool = True) -> None:
    """Plan LLaMA-Factory's packed SFT datasets with packkit from now on (idempotent; see :func:`uninstall`).

    Args:
        cost: the cost model the steps are balanced under, anything :func:`packkit.plan` takes; pass
            ``packkit.transformer_cost(config)`` (or the config) for ``6*h*tokens + sum(l**2)``-like costs.
            ``"attention"`` (sum of squared document lengths) suits FA2's varlen path; with the 4-D mask of
            ``neat_packing`` on eager/sdpa every row costs the same attention, so ``"tokens"`` fits there.
        dp_size: data-parallel ranks of a step; default ``training_args.world_size``.
        seed: the step order's seed; default ``training_args.seed``.
        shuffle: shuffle the examples before planning and the steps after (the train set only).
    """
    if dp_size is not None and (isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1):
        raise ValueError(f"dp_size must be None or an int >= 1, got {dp_size!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
    if not isinstance(shuffle, bool):
        raise TypeError(f"shuffle must be a bool, got {type(shuffle).__name__} {shuffle!r}")
    from ...planning.planner import _cost_model

    _cost_model(cost)  # refuse a bad cost now, not at the first dataset
    loader, trainer = _modules()
    original = _SAVED.get("loader") or loader._get_preprocessed_dataset
    original_sampler = _SAVED.get("sampler") or trainer.CustomSeq2SeqTrainer._get_train_sampler

    def _get_preprocessed_dataset(dataset, data_args, training_args, stage, template, tokenizer, processor=None,
                                  is_eval=False):
        generating = training_args.predict_with_generate and is_eval
        if dataset is None or stage != "sft" or not data_args.packing or generating:
            return original(dataset, data_args, training_args, stage, template, tokenizer, processor, is_eval)
        if data_args.streaming:
            raise ValueError("packkit plans the whole dataset at once and needs streaming=False; with streaming, "
                             "call packkit.integrations.llamafactory.uninstall() to use LLaMA-Factory's packing")
        plain = copy.copy(data_args)  # no __post_init__: only these two change
        plain.packing, plain.neat_packing = False, False
        tokenized = original(dataset, plain, training_args, stage, template, tokenizer, processor, is_eval)
        ranks = 1 if is_eval else (dp_size or training_args.world_size)  # eval: packed, not balanced
        per_rank = 1 if is_eval else training_args.per_device_train_batch_size
        packed, plan = pack_dataset(
            tokenized, data_args.cutoff_len, neat_packing=bool(data_args.neat_packing),
            pad_token_id=tokenizer.pad_token_id, dp_size=ranks, rows_per_rank=per_rank, cost=cost,
            seed=training_args.seed if seed is None else seed, shuffle=shuffle and not is_eval,
            num_proc=data_args.preprocessing_num_workers)
        LOG.info("packkit: %d examples -> %d rows of %d tokens (efficiency %.4f), dp_size=%d, step balance %.5f",
                 len(tokenized), len(plan.rows), data_args.cutoff_len, plan.efficiency, ranks, plan.balance)
        return packed

    def _get_train_sampler(self, *args, **kwargs):
        if is_planned(self.train_dataset):
            import torch

            prepare_trainer_model(self)  # packed batches exact for this model, or a ValueError naming why not
            _log_start(self.train_dataset)
            return torch.utils.data.SequentialSampler(self.train_dataset)
        return original_sampler(self, *args, **kwargs)

    _SAVED["loader"], _SAVED["sampler"] = original, original_sampler
    loader._get_preprocessed_dataset = _get_preprocessed_dataset
    trainer.CustomSeq2SeqTrainer._get_train_sampler = _get_train_sampler


def _log_start(dataset) -> None:
    """The start line, in LLaMA-Factory's logger (its handler prints INFO; ``packkit.*`` loggers are not shown)."""
    figures = planned_figures(dataset)
    if figures is None:
        return
    from llamafactory.extras import logging as lf_logging

    per_step = figures["dp_size"] * figures["rows_per_rank"]
    steps = -(-figures["rows"] // per_step)  # the micro-steps each rank runs (the last step may be short)
    lf_logging.get_logger("llamafactory.packkit").info_rank0(
        start_line(steps, figures["dp_size"], figures["balance"], figures["efficiency"]))


def uninstall() -> None:
    """Restore LLaMA-Factory's own packing and sampler (no-op if :func:`install` was not called)."""
    if not _SAVED:
        return
    loader, trainer = _modules()
    loader._get_preprocessed_dataset = _SAVED.pop("loader")
    trainer.CustomSeq2SeqTrainer._get_train_sampler = _SAVED.pop("sampler")
