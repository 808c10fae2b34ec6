"""A test-side ms-swift plugin (the second ``--external_plugins`` file of tests/test_swift_entry.py): it casts the
model to float64 when ms-swift's trainer is built (``--torch_dtype`` takes no float64; RMSNorm and the loss
kept in float64 too, tests/entry_fp64.py) and records, per training
step, the batch ms-swift's template collated and the loss its trainer computed, plus the train dataset, sampler and
schedule, into ``$PACKKIT_PROBE_OUT.<rank>.pt``. It changes nothing else."""
from __future__ import annotations

import functools
import os

import torch
from entry_fp64 import to_fp64
from swift.trainers.seq2seq_trainer import Seq2SeqTrainer

_init = Seq2SeqTrainer.__init__
_training_step = Seq2SeqTrainer.training_step
_compute_loss = Seq2SeqTrainer.compute_loss


@functools.wraps(_init)
def __init__(self, *args, **kwargs):
    model = kwargs.get("model", args[0] if args else None)
    to_fp64(model)
    _init(self, *args, **kwargs)
    self._probe = {"steps": []}


@functools.wraps(_training_step)
def training_step(self, model, inputs, *args, **kwargs):
    # The collated batch as the template made it (``_prepare_inputs`` later trims labels to the kept logits).
    self._probe_batch = {k: v.detach().cpu().clone() for k, v in inputs.items()
                         if k in ("input_ids", "labels", "position_ids", "text_position_ids", "image_grid_thw")
                         and isinstance(v, torch.Tensor)}
    return _training_step(self, model, inputs, *args, **kwargs)


@functools.wraps(_compute_loss)
def compute_loss(self, model, inputs, *args, **kwargs):
    batch = self._probe_batch
    out = _compute_loss(self, model, inputs, *args, **kwargs)
    loss = out[0] if isinstance(out, tuple) else out
    record = self._probe
    if not record["steps"]:
        loader = self.callback_handler.train_dataloader
        sampler = getattr(loader, "batch_sampler", None)
        record.update(dataset=type(self.train_dataset).__mro__[1].__qualname__
                      if type(self.train_dataset).__name__.startswith("Sft") else type(self.train_dataset).__qualname__,
                      sampler=type(sampler).__qualname__, max_steps=self.state.max_steps, batches=len(loader),
                      dtype=str(next(model.parameters()).dtype), rank=self.args.process_index,
                      world=self.args.world_size,
                      packed_idx=getattr(self.train_dataset, "packed_idx", None),
                      order=[list(b) for b in sampler] if sampler is not None else None,  # the epoch's row order
                      keys=sorted(inputs),  # what the collator gave the model
                      attn=getattr(model.config, "_attn_implementation", None))
    record["steps"].append({**batch, "loss": float(loss.detach())})
    torch.save(record, f"{os.environ['PACKKIT_PROBE_OUT']}.{self.args.process_index}.pt")
    return out


Seq2SeqTrainer.__init__ = __init__
Seq2SeqTrainer.training_step = training_step
Seq2SeqTrainer.compute_loss = compute_loss
