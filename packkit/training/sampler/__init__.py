"""``packkit.PackedBatchSampler``: a ``batch_sampler`` that packs a map-style dataset for data parallelism.

Modules: ``batch_sampler`` (the sampler: epochs, iteration, resume), ``epoch`` (per-epoch planning,
identical on every rank), ``ranks`` (distributed dealing: rank resolution, rows dealt to ranks, the
cross-rank plan check), ``args`` (argument conversion).
"""
from .batch_sampler import SAMPLER_OVERLONG, PackedBatchSampler

__all__ = ["PackedBatchSampler", "SAMPLER_OVERLONG"]
