"""The probe of tests/test_torchtitan_entry.py (loaded by tests/entry_site/sitecustomize.py after
torchtitan_cpu_shims): records, into ``$PACKKIT_TT_PROBE`` (JSON), what torchtitan's ``Trainer`` ran: the class of
the dataloader it built, the steps it ran, and every micro-batch that reached the model (inputs, positions,
labels, as ``post_dataloading_process`` received them). It changes nothing in training."""
from __future__ import annotations

import functools
import json
import os

from torchtitan.trainer import Trainer

_post = Trainer.post_dataloading_process
_train = Trainer.train
_batches: list = []


@functools.wraps(_post)
def post_dataloading_process(self, input_dict, labels):
    _batches.append({"input": input_dict["input"].tolist(), "positions": input_dict["positions"].tolist(),
                     "labels": labels.tolist()})
    return _post(self, input_dict, labels)


@functools.wraps(_train)
def train(self):
    _train(self)
    loader = type(self.dataloader)
    stream = getattr(self.dataloader, "stream", None)
    record = {"loader": f"{loader.__module__}.{loader.__qualname__}", "steps": self.step, "batches": _batches,
              "first_buffer": getattr(stream, "first_buffer", None), "rank": int(os.environ.get("RANK", "0"))}
    path = os.environ["PACKKIT_TT_PROBE"]
    with open(f"{path}.rank{record['rank']}", "w") as f:
        json.dump(record, f)


Trainer.post_dataloading_process = post_dataloading_process
Trainer.train = train
