"""Point ``swift sft --packing true`` at packkit's planned packing (imports ms-swift).

Why a patch and not a strategy name: ``--packing_strategy`` is typed ``Literal['binpack', 'sequential']`` in
ms-swift's arguments, so a new name is refused at parsing; and a dataset alone cannot keep a step's rows together,
because the trainer's ``BatchSamplerShard`` shuffles rows. So :func:`install` swaps these names, nothing else:

* ``swift.pipelines.train.sft.PackingDataset`` / ``IterablePackingDataset`` (the names ``swift sft`` builds its
  packed datasets from) -> :class:`PlannedPackingDataset` / :class:`PlannedIterablePackingDataset`;
* inside ``DataLoaderMixin.get_train_dataloader`` (ms-swift's trainers inherit it), and only while its
  ``train_dataset`` is a :class:`PlannedPackingDataset`, ``BatchSamplerShard`` -> :class:`PlannedBatchSamplerShard`
  (shuffles steps, not rows). Any other dataset gets ms-swift's own sampler. At that call (train start) the
  planned dataset's line ``packkit: N steps on R ranks, balance B, efficiency E`` goes to ms-swift's log.
* ``SftArguments._check_padding_free``: ms-swift refuses ``--packing`` / ``--padding_free`` unless ``--attn_impl``
  is a flash-attn one. A packed row is exact on ``sdpa`` and ``eager`` too: ms-swift's padding-free collator gives
  per-document ``position_ids`` and no attention mask, its trainer sets ``use_cache=False``, and transformers then
  builds the per-document causal mask from the restarting positions (checked in fp64 against the samples run one by
  one, through ``swift sft`` itself: tests/test_swift_entry.py). So those two are let through, and
  ``packkit_varlen`` (registered by the plugin file), which reads the collator's ``cu_seq_lens_q`` (ms-swift's
  Qwen-VL templates give them) or else the same restarting ``position_ids``; every other implementation keeps
  ms-swift's refusal. At train start :func:`check_exact_attention` checks what the
  model really runs (the implementation, ``position_ids`` reaching its forward, no KV cache) and refuses otherwise.
* ``Seq2SeqTrainer.compute_loss``: for a padding-free Qwen-VL batch on those implementations, the text position row
  (which it pops before the model call) goes in front of the mRoPE rows (:func:`with_text_positions`).

Load it with ``--external_plugins`` (ms-swift imports those files in every rank before building datasets).
"""
from __future__ import annotations

import functools
import os
import threading

_LOCK = threading.Lock()
_STATE: dict = {}
FLASH_IMPLS = ("flash_attn", "flash_attention_2", "flash_attention_3", "flash_attention_4")  # ms-swift's own list
# Attention implementations whose packed row equals its documents run alone when transformers sees per-document
# position_ids, no attention_mask and no KV cache (create_causal_mask's packed-sequence detection).
POSITION_MASKED_IMPLS = ("sdpa", "eager")
# packkit's per-document attention: documents from the batch's cu_seq_lens_q, or else from the same position_ids.
VARLEN_IMPL = "packkit_varlen"
EXACT_IMPLS = POSITION_MASKED_IMPLS + (VARLEN_IMPL,)


def check_padding_free_args(args, original) -> None:
    """``SftArguments._check_padding_free`` with ``sdpa`` / ``eager`` / ``packkit_varlen`` allowed (see the module
    docstring)."""
    if (args.padding_free or args.packing) and args.attn_impl in EXACT_IMPLS:
        if args.packing:
            args.padding_free = True  # as ms-swift's check does: packing implies the padding-free collator
        return
    try:
        original(args)
    except ValueError as exc:
        raise ValueError(f"{exc} With packkit's plugin, also {', '.join(map(repr, EXACT_IMPLS))} "
                         f"(documents separated by their position_ids); got attn_impl={args.attn_impl!r}") from None


def _attention_of(model) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None)


def check_exact_attention(trainer) -> None:
    """Refuse a padding-free (packed) batch whose documents the model would not keep apart: an attention
    implementation other than flash-attn / sdpa / eager, a base model whose forward takes no ``position_ids``
    (ms-swift's ``pre_forward_hook`` then drops them), or a model that runs with a KV cache (transformers builds
    the per-document mask only without one)."""
    template = getattr(trainer, "template", None)
    if template is None or not getattr(template, "padding_free", False):
        return
    import inspect

    impl = _attention_of(trainer.model)
    if impl in FLASH_IMPLS or (impl or "").startswith("flash"):
        return  # ms-swift's own path: flash-attn reads the same position_ids
    if impl not in EXACT_IMPLS:
        raise ValueError(f"packing / padding_free: the model runs attn_implementation={impl!r}, which does not "
                         f"separate packed documents by their position_ids; use one of "
                         f"{FLASH_IMPLS + EXACT_IMPLS}")
    base = template.get_base_model(trainer.model)
    if "position_ids" not in inspect.signature(base.forward).parameters:
        raise ValueError(f"packing / padding_free on {impl}: {type(base).__name__}.forward takes no position_ids, so "
                         "the packed documents would attend to each other; use a flash-attn implementation")
    for model in (trainer.model, base):
        if getattr(getattr(model, "config", None), "use_cache", False):
            raise ValueError(f"packing / padding_free on {impl}: the model config has use_cache=True; transformers "
                             "separates packed documents only without a KV cache (set use_cache=False)")


def with_text_positions(template, model, inputs: dict) -> dict:
    """A padding-free Qwen-VL batch on sdpa / eager / packkit_varlen, with the text position row in front of the 3
    mRoPE rows (``[4, 1, T]``). ms-swift's Qwen-VL collator splits it off as ``text_position_ids`` and its trainer's
    ``compute_loss`` pops that key before the model call; with only the mRoPE rows transformers builds no
    per-document mask, so on sdpa / eager the packed samples attend to each other (flash-attn reads the collator's
    ``cu_seq_lens_q`` instead). The 4-row form is the one transformers documents for packed Qwen-VL input."""
    text, pos = inputs.get("text_position_ids"), inputs.get("position_ids")
    if (text is None or pos is None or pos.dim() != 3 or pos.shape[0] != 3
            or not getattr(template, "padding_free", False) or _attention_of(model) not in EXACT_IMPLS):
        return inputs
    import torch

    return {**inputs, "position_ids": torch.cat([text.to(pos.device).reshape(1, *pos.shape[1:]), pos])}


def _log_start(dataset, dataloader) -> None:
    from swift.utils import get_logger

    from ..start_line import start_line

    rows, slots = len(dataset.packed_idx), len(dataset.packed_idx) * dataset.packing_length
    efficiency = sum(dataset.packed_length) / slots if slots else 0.0
    get_logger().info(start_line(len(dataloader), dataset.dp_size, dataset.balance or 1.0, efficiency))


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
    from swift.arguments import sft_args
    from swift.pipelines.train import sft
    from swift.trainers import mixin
    from swift.trainers.seq2seq_trainer import Seq2SeqTrainer

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

        original_check = sft_args.SftArguments._check_padding_free
        original_loss = Seq2SeqTrainer.compute_loss

        @functools.wraps(original_loss)
        def compute_loss(self, model, inputs, *args, **kwargs):
            inputs = with_text_positions(self.template, self.model, inputs)  # self.model: not a DDP wrapper
            return original_loss(self, model, inputs, *args, **kwargs)

        @functools.wraps(original_check)
        def _check_padding_free(self):
            check_padding_free_args(self, original_check)

        @functools.wraps(original_loader)
        def get_train_dataloader(self, *args, **kwargs):
            check_exact_attention(self)
            if not isinstance(self.train_dataset, PlannedPackingDataset):
                return original_loader(self, *args, **kwargs)
            prepare_trainer_model(self)  # packed batches exact for this model, or a ValueError naming why not
            with _LOCK:  # the module name is read inside the call; nobody else swaps it meanwhile
                mixin.BatchSamplerShard = _sampler_for(self.train_dataset)
                try:
                    dataloader = original_loader(self, *args, **kwargs)
                finally:
                    mixin.BatchSamplerShard = original_sampler
            if not kwargs.get("skip_batches") and not (args and args[0]):  # train start, not a resume's rebuild
                _log_start(self.train_dataset, dataloader)
            return dataloader

        _STATE.update(installed=True, sft=(sft.PackingDataset, sft.IterablePackingDataset),
                      loader=original_loader, check=original_check, loss=original_loss)
        sft.PackingDataset, sft.IterablePackingDataset = SftPackingDataset, SftIterablePackingDataset
        mixin.DataLoaderMixin.get_train_dataloader = get_train_dataloader
        sft_args.SftArguments._check_padding_free = _check_padding_free
        Seq2SeqTrainer.compute_loss = compute_loss


def uninstall() -> None:
    """Restore ms-swift's own packing datasets and dataloader."""
    from swift.arguments import sft_args
    from swift.pipelines.train import sft
    from swift.trainers import mixin
    from swift.trainers.seq2seq_trainer import Seq2SeqTrainer

    with _LOCK:
        if not _STATE.get("installed"):
            return
        sft.PackingDataset, sft.IterablePackingDataset = _STATE["sft"]
        mixin.DataLoaderMixin.get_train_dataloader = _STATE["loader"]
        sft_args.SftArguments._check_padding_free = _STATE["check"]
        Seq2SeqTrainer.compute_loss = _STATE["loss"]
        _STATE.clear()
