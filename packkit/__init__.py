"""packkit: sequence packing for LLM training.

``packkit.plan`` decides which sequences share a row (C++ bin packing); ``torch.ops.packkit.*`` are
the planner and the pack kernels as torch ops; ``packkit.pack_sequences`` turns sequences into a packed
batch with HF key names, and ``packkit.unpack_sequences`` brings per-token outputs back.
"""
from . import ops  # registers torch.ops.packkit.*
from .buffers import PackBuffers
from .collator import PackingCollator, document_causal_block_mask
from .packing import (LAYOUTS, PackInfo, PackLayout, pack_layout, pack_on_device, pack_sequences,
                      unpack_sequences)
from .multimodal import mrope_position_ids
from .sampler import PackedBatchSampler
from .streaming import PackedIterableDataset
from .plan_check import PLAN_ERRORS, check_plan
from .datasets import PackedRowsCollator, PackReport, pack_dataset  # datasets/pyarrow/ray load on first call
from .planning import ALGORITHMS, OVERLONG_POLICIES, Plan, Segments, plan
from .cost_model import transformer_cost
from .hf_attention import register_varlen_attention, varlen_attention_forward  # transformers loads on first call

__all__ = ["plan", "Plan", "Segments", "ALGORITHMS", "OVERLONG_POLICIES", "pack_sequences", "unpack_sequences", "pack_on_device",
           "pack_layout", "check_plan", "PLAN_ERRORS", "PackLayout", "PackInfo", "LAYOUTS",
           "PackingCollator", "document_causal_block_mask",
           "PackedBatchSampler", "PackedIterableDataset", "pack_dataset", "PackReport",
           "PackedRowsCollator", "mrope_position_ids", "PackBuffers", "transformer_cost",
           "register_varlen_attention", "varlen_attention_forward"]
__version__ = "0.1.0"
