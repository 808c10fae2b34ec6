"""axolotl 0.19 drop-in: ``plugins: [packkit.integrations.axolotl.PackkitPlugin]`` in the YAML.

* :class:`MultipackBatchSampler` (``sampler.py`` + ``fill.py`` + ``rows.py``, no axolotl import): axolotl's constructor
  signature plus ``dp_size`` and ``cost``; one packkit plan per epoch, items ordered so accelerate's round-robin
  dealing hands every rank its planned row of every step.
* :class:`PackkitPlugin` (``plugin.py``, imports axolotl on first use): swaps the trainer's sampler and the
  LR-schedule step count's sampler; axolotl's collators are used unchanged.
"""
from .sampler import MultipackBatchSampler, default_dp_size

__all__ = ["MultipackBatchSampler", "PackkitPlugin", "default_dp_size"]


def __getattr__(name):
    if name == "PackkitPlugin":
        from .plugin import PackkitPlugin

        return PackkitPlugin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
