"""Stage 3, feed training: the per-batch collator, the data-parallel batch sampler, streaming packing for
iterable datasets, and HF attention functions for packed batches."""
from .block_masks import document_causal_block_mask, layer_block_masks
from .collator import PackingCollator
from .hf_attention import register_varlen_attention, varlen_attention_forward  # transformers loads on first call
from .sampler import PackedBatchSampler
from .streaming import PackedIterableDataset

__all__ = ["PackingCollator", "document_causal_block_mask", "layer_block_masks", "register_varlen_attention",
           "varlen_attention_forward", "PackedBatchSampler", "PackedIterableDataset"]
