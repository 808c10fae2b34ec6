"""A test-side axolotl plugin (``plugins: [entry_probe_axolotl.ProbePlugin]``, tests/ on PYTHONPATH) for
tests/test_axolotl_entry.py: it records what ``axolotl train`` really ran, per rank, into
``$PACKKIT_PROBE_OUT.<rank>.json``: the trainer, the batch sampler classes, the schedule's ``max_steps``, the steps
run, each step's row (label tokens and real tokens it trained) and the sampler's planned item for that step, and
the logged losses. It changes nothing in training."""
from __future__ import annotations

import json
import os

from axolotl.integrations.base import BasePlugin
from transformers import TrainerCallback


def _unwrap(batch_sampler):
    """accelerate's BatchSamplerShard / SkipBatchSampler -> the multipack sampler inside; every class on the way."""
    chain, s = [], batch_sampler
    while s is not None:
        chain.append(f"{type(s).__module__}.{type(s).__qualname__}")
        if hasattr(s, "generate_batches"):
            return chain, s
        s = getattr(s, "batch_sampler", None)
    return chain, None


class _Probe(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer
        self.record = {"trainer": type(trainer).__qualname__, "rows": [], "losses": []}
        original = trainer.training_step

        def training_step(model, inputs, *args, **kwargs):
            ids = inputs["input_ids"]
            labels = inputs["labels"]
            pad = trainer.processing_class.pad_token_id
            self.record["rows"].append({"tokens": int((ids != pad).sum()), "shape": list(ids.shape),
                                        "label_tokens": int((labels != -100).sum())})
            return original(model, inputs, *args, **kwargs)

        trainer.training_step = training_step

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        chain, sampler = _unwrap(train_dataloader.batch_sampler)
        rank, world = args.process_index, args.world_size
        self.record.update(rank=rank, world=world, max_steps=state.max_steps, sampler_chain=chain)
        if sampler is not None:
            items = sampler.generate_batches()
            lengths = sampler.lengths
            mine = items[rank::world]  # what accelerate's round-robin dealing hands this rank
            self.record["planned_tokens"] = [int(sum(int(lengths[i]) for row in item for i in row)) for item in mine]
            self.record["planned_steps"] = len(items) // world

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.record["losses"].append(float(logs["loss"]))

    def on_train_end(self, args, state, control, **kwargs):
        self.record["global_step"] = state.global_step
        with open(f"{os.environ['PACKKIT_PROBE_OUT']}.{args.process_index}.json", "w") as f:
            json.dump(self.record, f)


class ProbePlugin(BasePlugin):
    def add_callbacks_post_trainer(self, cfg, trainer):
        return [_Probe(trainer)]
