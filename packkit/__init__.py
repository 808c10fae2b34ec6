"""packkit: sequence packing for LLM training.

The package is laid out by stage, each importing only from the stages before it:
``planning`` (which sequences share a row) -> ``packing`` (device ops that build the packed tensors; ``models``: which
model families pack exactly on which path, ``prepare_model``) ->
``training`` (collator, sampler, streaming, attention) -> ``datasets`` (whole datasets, Arrow, Ray) ->
``tools`` and ``analyze`` (command line, demo, dataset reports). Everything a user needs is re-exported here.
"""
from ._version import __version__
from .planning import (ALGORITHMS, OVERLONG_POLICIES, PLAN_ERRORS, Plan, Segments, check_plan, plan, transformer_cost,
                       vision_cost)
from .planning import ContextParallelPlan, plan_context_parallel  # dynamic CP: sizes, groups, order
from .pipeline import PipelineStepPlanner, plan_pipeline  # issue 61: packed micro-batches for every pipeline stage
from .packing import (LAYOUTS, PackBuffers, PackInfo, PackLayout, mrope_position_ids, ops, pack_layout, pack_on_device,
                      pack_sequences, unpack_sequences)
from .models import packing_support, prepare_model, unprepare_model  # per-family verdicts, stand-ins
from .context_parallel import pack_context_parallel, shard_context_parallel, unshard_context_parallel
from .context_parallel import iter_context_parallel, pack_context_parallel_pass  # a dynamic CP plan's passes
from .training import (PackedBatchSampler, PackedIterableDataset, PackingCollator, document_causal_block_mask,
                       register_varlen_attention, varlen_attention_forward)
from .datasets import PackedRowsCollator, PackReport, pack_dataset  # datasets/pyarrow/ray load on first call
from . import rl  # RL rollouts: micro_batches, pack_rollouts (verl drop-in: packkit.integrations.verl)
from . import shared_prefix  # GRPO groups, DPO pairs, multi-turn trees: each shared prefix forwarded once

__all__ = ["plan", "Plan", "Segments", "ALGORITHMS", "OVERLONG_POLICIES", "pack_sequences", "unpack_sequences", "pack_on_device",
           "pack_layout", "check_plan", "PLAN_ERRORS", "PackLayout", "PackInfo", "LAYOUTS",
           "PackingCollator", "document_causal_block_mask",
           "PackedBatchSampler", "PackedIterableDataset", "pack_dataset", "PackReport",
           "PackedRowsCollator", "mrope_position_ids", "PackBuffers", "transformer_cost", "vision_cost",
           "register_varlen_attention", "varlen_attention_forward",
           "shard_context_parallel", "unshard_context_parallel", "pack_context_parallel",
           "prepare_model", "unprepare_model", "packing_support",
           "plan_context_parallel", "ContextParallelPlan", "pack_context_parallel_pass", "iter_context_parallel"]
