"""Stage 3, feed training: the per-batch collator, the data-parallel batch sampler, streaming packing for
iterable datasets, and HF attention functions for packed batches."""
from .collator import PackingCollator, document_causal_block_mask
from .hf_attention import register_varlen_attention, varlen_attention_forward  # transformers loads on first call
from .sampler import PackedBatchSampler
from .streaming import PackedIterableDataset

__all__ = ["PackingCollator", "document_causal_block_mask", "register_varlen_attention", "varlen_attention_forward",
           "PackedBatchSampler", "PackedIterableDataset"]
