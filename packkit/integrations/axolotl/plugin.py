"""``PackkitPlugin``: axolotl 0.19's plugin that plans its multipack sampler with packkit.

In the YAML::

    sample_packing: true
    plugins:
      - packkit.integrations.axolotl.PackkitPlugin

What it changes (nothing else):

* the trainer (``get_trainer_cls``): axolotl's ``AxolotlTrainer`` whose ``_create_multipack_sampler`` builds
  :class:`~packkit.integrations.axolotl.MultipackBatchSampler` from the same arguments axolotl passes, plus
  ``dp_size`` = accelerate's process count, ``cost`` = :func:`packkit.transformer_cost` of the model config and
  ``seed`` = ``args.seed``;
* the LR schedule's step count (``axolotl.utils.trainer.calculate_total_num_steps`` builds a second sampler):
  ``register`` points that module's ``MultipackBatchSampler`` at packkit's, with the same dp size, cost and seed,
  so the schedule counts the steps the trainer runs;
* with ``packkit_collator: true`` (a key it adds to the schema, ``args.py``), the collator
  (``get_collator_cls_and_kwargs``): :class:`~packkit.integrations.axolotl.collator.AxolotlPackingCollator`.

Streaming pretraining (``axolotl.utils.data.streaming``) keeps axolotl's own sampler: there it packs each stream
buffer into fixed rows before any dealing, and the step count is ``max_steps``.
"""
from __future__ import annotations

import logging

from axolotl.integrations.base import BasePlugin

from ...models import prepare_trainer_model
from ...planning.cost_model import transformer_cost
from ..start_line import start_line
from .sampler import MultipackBatchSampler, default_dp_size

# Under "axolotl.": axolotl's logging config (axolotl.logging_config) drops INFO records of every other logger (its
# root handler's AxolotlOrWarnErrorFilter and root level WARNING); the "axolotl" logger prints INFO to stdout.
LOG = logging.getLogger("axolotl.integrations.packkit")
HF_DEFAULT_SEED = 42  # transformers.TrainingArguments.seed, what the trainer gets when the YAML sets none


class PackkitPlugin(BasePlugin):
    """axolotl plugin: packkit's DP-balanced multipack sampler for the trainer and the LR-schedule count."""

    def __init__(self):
        super().__init__()
        self.cfg = None
        self.cost = None  # (a, b), resolved once, so the schedule's count and the trainer plan agree

    # -- hooks ------------------------------------------------------------------------------------------------
    def register(self, cfg):
        self._check(cfg)
        self.cfg = cfg
        import axolotl.utils.trainer as schedule

        schedule.MultipackBatchSampler = self.schedule_sampler

    def get_input_args(self):
        return "packkit.integrations.axolotl.args.PackkitArgs"

    def get_collator_cls_and_kwargs(self, cfg, is_eval=False):
        """packkit's collator when the YAML sets ``packkit_collator: true``; else None (axolotl's own)."""
        if not cfg.get("packkit_collator"):
            return None
        from .collator import AxolotlPackingCollator

        return AxolotlPackingCollator, {}

    def get_trainer_cls(self, cfg):
        self._check(cfg)
        if self.cfg is None:
            self.cfg = cfg
        from axolotl.core.trainers.base import AxolotlTrainer

        return trainer_class(AxolotlTrainer, self)

    # -- shared by both samplers ------------------------------------------------------------------------------
    @staticmethod
    def _check(cfg) -> None:
        """Refuse the configurations whose trainer or loader this plugin does not replace (named, not ignored)."""
        if not cfg.get("sample_packing"):
            raise ValueError("PackkitPlugin plans axolotl's multipack sampler: set sample_packing: true "
                             "(or remove the plugin)")
        for key in ("rl", "reward_model", "process_reward_model", "trainer_cls", "pretraining_dataset"):
            if cfg.get(key):
                raise ValueError(f"PackkitPlugin supports axolotl's supervised trainer (AxolotlTrainer); the config "
                                 f"sets {key}={cfg.get(key)!r}, which selects another trainer or loader")
        if cfg.get("model_config_type") == "mamba":
            raise ValueError("PackkitPlugin: mamba uses axolotl's AxolotlMambaTrainer, not replaced here")

    def resolve_cost(self, model_config=None) -> tuple[float, float]:
        """``transformer_cost`` of the model config (given, else read from ``base_model_config`` or ``base_model``)."""
        if self.cost is None:
            if model_config is None:
                from transformers import AutoConfig

                name = self.cfg.get("base_model_config") or self.cfg.get("base_model")
                remote = bool(self.cfg.get("trust_remote_code"))
                model_config = AutoConfig.from_pretrained(name, trust_remote_code=remote)
            self.cost = transformer_cost(model_config)
        return self.cost

    def seed(self) -> int:
        seed = self.cfg.get("seed") if self.cfg is not None else None
        return HF_DEFAULT_SEED if seed is None else int(seed)

    def schedule_sampler(self, sampler, **kwargs) -> MultipackBatchSampler:
        """What ``calculate_total_num_steps`` constructs in place of axolotl's sampler (its keyword arguments)."""
        return MultipackBatchSampler(sampler, dp_size=default_dp_size(), cost=self.resolve_cost(), seed=self.seed(),
                                     **kwargs)


def trainer_class(base, plugin: PackkitPlugin):
    """``base`` (axolotl's trainer) with packkit's sampler in ``_create_multipack_sampler``."""

    class PackkitTrainer(base):
        def _create_multipack_sampler(self, base_sampler, dataset):
            from axolotl.utils.samplers import get_dataset_lengths

            prepare_trainer_model(self)  # packed batches exact for this model, or a ValueError naming why not

            # As axolotl 0.19's AxolotlTrainer._create_multipack_sampler, plus dp_size, cost and seed.
            if self.args.multipack_real_batches:
                batch_size = self.args.per_device_train_batch_size
                batch_max_len = self.args.max_seq_length
            else:
                batch_size = 1
                train_batch_size = self.state.train_batch_size or self.args.per_device_train_batch_size
                batch_max_len = train_batch_size * self.args.max_seq_length
            sampler = MultipackBatchSampler(
                base_sampler, lengths=get_dataset_lengths(dataset),
                packing_efficiency_estimate=self.args.sample_packing_efficiency, batch_max_len=batch_max_len,
                batch_size=batch_size, group_size=self.args.sample_packing_group_size,
                bin_size=self.args.sample_packing_bin_size, sequential=self.args.sample_packing_sequentially,
                drop_last=True, num_processes=self.args.dataset_num_proc,
                mp_start_method=self.args.sample_packing_mp_start_method or "fork",
                dp_size=self.accelerator.num_processes, cost=plugin.resolve_cost(_model_config(self.model)),
                seed=self.args.seed)
            if self.accelerator.is_main_process:  # one line, not one per rank
                line = start_line(sampler.num_steps, sampler.dp_size, sampler.balance, sampler.efficiency())
                LOG.info(line if dataset is self.train_dataset else f"{line} (eval)")
            if len(sampler.dropped_last):
                LOG.warning("packkit: %d samples of a last step no row could be split for are not trained this epoch",
                            len(sampler.dropped_last))
            return sampler

    PackkitTrainer.__name__ = PackkitTrainer.__qualname__ = f"Packkit{base.__name__}"
    return PackkitTrainer


def _model_config(model):
    """The transformers config of ``model`` (a PreTrainedModel or a PEFT wrapper), or None."""
    inner = getattr(model, "base_model", None)
    for candidate in (model, inner, getattr(inner, "model", None)):
        config = getattr(candidate, "config", None)
        if config is not None and (hasattr(config, "hidden_size") or hasattr(config, "text_config")):
            return config
    return None


__all__ = ["PackkitPlugin", "trainer_class"]
