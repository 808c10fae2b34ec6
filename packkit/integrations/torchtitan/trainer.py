"""``PackkitTrainer``: torchtitan's ``Trainer`` with packkit's check on every pipeline stage's micro-batch metadata
(:func:`~packkit.integrations.torchtitan.guard_pipeline_stages`). Imports ``torchtitan.trainer``, which imports
``torch.utils.tensorboard`` (a full ``pip install torchtitan`` brings tensorboard)."""
from __future__ import annotations

from dataclasses import dataclass

from .pipeline import guard_pipeline_stages

try:
    from torchtitan.trainer import Trainer
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without torchtitan
    raise ModuleNotFoundError(f"packkit.integrations.torchtitan.PackkitTrainer needs torchtitan's trainer, which "
                              f"needs {exc.name} (pip install 'packkit[torchtitan]' tensorboard)",
                              name=exc.name) from exc


class PackkitTrainer(Trainer):
    """torchtitan's ``Trainer`` with :func:`guard_pipeline_stages` on its model parts. In a config function use
    ``PackkitTrainer.Config(...)`` where torchtitan's own uses ``Trainer.Config(...)``; nothing else changes."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        pass

    def __init__(self, config: Config):
        super().__init__(config)
        self.packkit_stage_guards = guard_pipeline_stages(self.model_parts)
