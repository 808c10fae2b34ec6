"""The probe of tests/test_torchtitan_entry.py (loaded by tests/entry_site/sitecustomize.py after
torchtitan_cpu_shims): records, into ``$PACKKIT_TT_PROBE`` (JSON), what torchtitan's ``Trainer`` ran: the class of
the dataloader it built, the steps it ran, and every micro-batch that reached the model (inputs, positions,
labels, as ``post_dataloading_process`` received them). It changes nothing in training.

With ``PACKKIT_TT_STAGE_PROBE`` set (tests/test_torchtitan_pp_entry.py) it also records the pipeline schedule
torchtitan built (its class, this rank's stage indices) and, from a forward pre-hook on every stage module, each
call a stage got: its stage index and input shape, and on the first stage the micro-batch's tokens and positions,
the document start of every token as the ``BlockMask`` it was handed allows it (the first key each query may
attend), and the ``cu_seq_q`` torchtitan's varlen path builds from those positions
(``create_varlen_metadata_for_document``); and each step's loss as the trainer logs it, at full precision."""
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


_stage_calls: list = []


def _mask_starts(mask, rows: int, length: int) -> list:
    from torch.nn.attention.flex_attention import create_mask

    dense = create_mask(mask.mask_mod, rows, 1, length, length, device="cpu")[:, 0]  # (B, q, kv) bools
    return dense.int().argmax(-1).tolist()  # the first key each query may attend


def _install_stage_probe(trainer) -> dict:
    from torchtitan.models.common.attention import create_varlen_metadata_for_document

    schedule = getattr(trainer, "pp_schedule", None)
    if schedule is not None:
        stages = list(getattr(schedule, "_stages", None) or [schedule._stage])
        parts = [(s.stage_index, s.is_first, s.submod) for s in stages]
        info = {"schedule": type(schedule).__name__, "stage_indices": [s.stage_index for s in stages],
                "num_stages": stages[0].num_stages, "n_microbatches": schedule._n_microbatches}
    else:
        parts = [(0, True, m) for m in trainer.model_parts]
        info = {"schedule": None, "stage_indices": [0], "num_stages": 1, "n_microbatches": 1}

    def hook_for(index, first):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["tokens"]
            call = {"stage": index, "shape": list(x.shape)}
            if first:
                pos, mask = kwargs["positions"], kwargs.get("attention_masks")
                call.update(input=x.tolist(), positions=pos.tolist(),
                            cu_seq_q=create_varlen_metadata_for_document(pos).cu_seq_q.tolist())
                if hasattr(mask, "mask_mod"):  # a BlockMask
                    call["mask_starts"] = _mask_starts(mask, *pos.shape)
                elif hasattr(mask, "cu_seq_q"):  # VarlenMetadata handed to the stage
                    call["given_cu_seq_q"] = mask.cu_seq_q.tolist()
            _stage_calls.append(call)
        return hook

    for index, first, module in parts:
        module.register_forward_pre_hook(hook_for(index, first), with_kwargs=True)
    log = trainer.metrics_processor.log

    def log_loss(step, global_avg_loss, *args, **kwargs):  # the step's loss at full precision (the log shows 5 digits)
        info["losses"].append([int(step), float(global_avg_loss)])
        return log(step, global_avg_loss, *args, **kwargs)

    trainer.metrics_processor.log = log_loss
    info["losses"] = []
    return info


@functools.wraps(_train)
def train(self):
    stage_info = _install_stage_probe(self) if os.environ.get("PACKKIT_TT_STAGE_PROBE") else None
    _train(self)
    loader = type(self.dataloader)
    stream = getattr(self.dataloader, "stream", None)
    record = {"loader": f"{loader.__module__}.{loader.__qualname__}", "steps": self.step, "batches": _batches,
              "first_buffer": getattr(stream, "first_buffer", None), "rank": int(os.environ.get("RANK", "0"))}
    if stage_info is not None:
        record.update(stage_info, stage_calls=_stage_calls, trainer=type(self).__qualname__)
    path = os.environ["PACKKIT_TT_PROBE"]
    with open(f"{path}.rank{record['rank']}", "w") as f:
        json.dump(record, f)


Trainer.post_dataloading_process = post_dataloading_process
Trainer.train = train
