"""The torchtitan config module of tests/test_torchtitan_pp_entry.py: torchtitan's own pipeline-parallel path fed by
packkit's loader, ``torchrun --nproc_per_node 2 -m torchtitan.train --module torchtitan_pp_entry_config --config
packkit_pp_tiny`` (2 gloo processes = 2 pipeline stages, schedule 1F1B; ``--parallelism.pipeline_parallel_schedule
Interleaved1F1B`` gives each process 2 virtual stages).

The model, tokenizer and data are tests/torchtitan_entry_config.py's (torchtitan's Llama 3 flavor ``packkit_tiny``,
2 layers, dim 64, Flex attention; ``$PACKKIT_TT_ROOT/assets`` and ``data``). The trainer is packkit's
``PackkitTrainer`` (torchtitan's ``Trainer`` with packkit's check on every stage's kwargs). Each step: a local batch
of 4 rows as 4 micro-batches of 1 row; torchtitan builds the dataloader with the micro-batch size, so every
micro-batch is one batch of packkit's loader (its own positions, its own masks).

``packkit_pp_batch_wide`` is the control: a trainer that builds the varlen metadata once for the whole local batch
and hands each micro-batch the dim-0 chunk of it that torch's schedule would cut (the torchtitan PR 4098 form);
packkit's stage check refuses it by name on the first stage."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

import torch
from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks
from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.models.common.attention import VarlenMetadata, create_varlen_metadata_for_document

from torchtitan_entry_config import ROOT, SEQ_LEN, _trainer  # noqa: F401  (registers the packkit_tiny flavor)

from packkit.integrations.torchtitan import PackkitDataLoader, PackkitTrainer, torchtitan_cost
from torchtitan.models import llama3

MICROBATCHES, STEPS = 4, 6


def _pp_config(name: str, trainer_cls=PackkitTrainer, attn_backend: str = "varlen"):
    spec = llama3.model_registry("packkit_tiny", attn_backend=attn_backend)
    base = _trainer(name, PackkitDataLoader.Config(dataset_path=os.path.join(ROOT, "data"),
                                                   cost=torchtitan_cost(spec.model)))
    skip = ("training", "parallelism", "model_spec")
    kept = {f.name: getattr(base, f.name) for f in fields(base) if f.init and f.name not in skip}
    return trainer_cls.Config(
        **kept,
        model_spec=spec,
        training=TrainingConfig(local_batch_size=MICROBATCHES, seq_len=SEQ_LEN, steps=STEPS, max_norm=1.0,
                                disable_cuda_graphs=True),
        parallelism=ParallelismConfig(pipeline_parallel_degree=2, pipeline_parallel_microbatch_size=1,
                                      pipeline_parallel_schedule="1F1B", spmd_backend="partial_dtensor"),
    )


def packkit_pp_tiny():
    """packkit's loader and stage check, torchtitan's pipeline schedule, varlen attention (per-micro-batch
    ``cu_seq_q`` read by the attention)."""
    return _pp_config("packkit-pp")


def packkit_pp_flex():
    """The same with Flex attention (a ``BlockMask`` per micro-batch)."""
    return _pp_config("packkit-pp-flex", attn_backend="flex")


class BatchWideTrainer(PackkitTrainer):
    """The PR 4098 form through this path: one ``VarlenMetadata`` for the local batch (all micro-batches' rows),
    its ``cu_seq_q`` chunked along dim 0 into the schedule's micro-batches, each micro-batch handed its chunk."""

    @dataclass(kw_only=True, slots=True)
    class Config(PackkitTrainer.Config):
        pass

    def pp_forward_backward_step(self, *, input_dict_mbs, label_mbs, global_valid_tokens):
        whole = create_varlen_metadata_for_document(torch.cat([d["positions"] for d in input_dict_mbs]))
        _, chunks = split_args_kwargs_into_chunks((), {"cu": whole.cu_seq_q}, len(input_dict_mbs))
        post = self.post_dataloading_process

        def batch_wide(input_dict, labels):
            inputs, labels, extra = post(input_dict, labels)
            cu = chunks.pop(0)["cu"]
            extra["attention_masks"] = VarlenMetadata(cu, cu, whole.max_q, whole.max_k)
            return inputs, labels, extra

        self.post_dataloading_process = batch_wide
        try:
            return super().pp_forward_backward_step(input_dict_mbs=input_dict_mbs, label_mbs=label_mbs,
                                                    global_valid_tokens=global_valid_tokens)
        finally:
            del self.post_dataloading_process


def packkit_pp_batch_wide():
    return _pp_config("packkit-pp-batch-wide", BatchWideTrainer)
