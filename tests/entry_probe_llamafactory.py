"""The probe of tests/test_llamafactory_entry.py (loaded by tests/entry_site/sitecustomize.py): records, into
``$PACKKIT_LF_PROBE`` (JSON), what LLaMA-Factory's trainer ran: whether its train set is packkit-planned, the
sampler class, the schedule's ``max_steps``, the steps run, the first tokens of every step's row and of every
dataset row in order, and the logged losses. It changes nothing in training."""
from __future__ import annotations

import functools
import json
import os

import transformers
from transformers import TrainerCallback

_init = transformers.Trainer.__init__


class _Probe(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer
        self.record = {"first_ids": [], "losses": []}
        original = trainer.training_step

        def training_step(model, inputs, *args, **kwargs):
            self.record["first_ids"].append(inputs["input_ids"][0, :8].tolist())
            return original(model, inputs, *args, **kwargs)

        trainer.training_step = training_step

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        from packkit.integrations.llamafactory import is_planned

        dataset = self.trainer.train_dataset
        s = train_dataloader.batch_sampler
        while hasattr(s, "batch_sampler"):
            s = s.batch_sampler
        self.record.update(planned=is_planned(dataset), sampler=type(getattr(s, "sampler", s)).__name__,
                           max_steps=state.max_steps, rows=len(dataset),
                           planned_first_ids=[row[:8] for row in dataset["input_ids"]])

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.record["losses"].append(float(logs["loss"]))

    def on_train_end(self, args, state, control, **kwargs):
        self.record["global_step"] = state.global_step
        with open(os.environ["PACKKIT_LF_PROBE"], "w") as f:
            json.dump(self.record, f)


@functools.wraps(_init)
def __init__(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.add_callback(_Probe(self))


transformers.Trainer.__init__ = __init__
