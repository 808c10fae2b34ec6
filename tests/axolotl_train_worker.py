"""One rank of the axolotl training proof (run by tests/test_axolotl_plugin.py in the axolotl venv, not by pytest).

usage: [AXOLOTL_COLLATOR=packkit] python axolotl_train_worker.py RANK WORLD_SIZE INIT_METHOD OUT_DIR

axolotl 0.19's own trainer (``AxolotlTrainer`` via ``PackkitPlugin.get_trainer_cls``, its
``V2BatchSamplerDataCollatorForSeq2Seq``, accelerate's dealing, DDP on gloo) trains a tiny random fp64 Llama for 3
steps with SGD on packed rows. ``AXOLOTL_COLLATOR=packkit`` takes the collator the plugin offers for
``packkit_collator: true`` instead (axolotl's builder pads to a multiple of 64 by default: so does this run).
Each rank saves, per step: the parameters at the step's start, the gradient the
optimizer is about to apply (after DDP's all-reduce), the loss ``training_step`` returned, and the rows it
trained on; the test recomputes every step from the same samples run one at a time.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

CAPACITY = 96
VOCAB = 48
# What packkit's collator adds for the attention (the model forwards every batch key to its loss too); not the loss's
ATTENTION_METADATA = {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"}


def tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, **{f"t{i}": i for i in range(1, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t1"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="t1")


def samples(n: int = 40, seed: int = 3) -> list[dict]:
    """Pre-tokenized samples as axolotl's SFT preprocessing leaves them (input_ids, labels, position_ids, length);
    every sample's first label is -100 (its BOS is not a target), so no label crosses into the next document of a
    packed row."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(4, 40))
        ids = rng.integers(1, VOCAB, length).tolist()
        labels = list(ids)
        labels[0] = -100
        prompt = int(rng.integers(0, 3))
        labels[1:1 + prompt] = [-100] * prompt  # a prompt, not trained on
        out.append({"input_ids": ids, "labels": labels, "position_ids": list(range(length)), "length": length})
    return out


def fp64_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                        **kwargs):
    """transformers' ForCausalLMLoss without its ``logits.float()`` (which rounds an fp64 model's loss to fp32)."""
    unknown = set(kwargs) - ATTENTION_METADATA
    if unknown:
        raise TypeError(f"fp64_causal_lm_loss: unexpected arguments {sorted(unknown)}")
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab_size), shift_labels.reshape(-1).to(logits.device),
                                             ignore_index=ignore_index,
                                             reduction="mean" if num_items_in_batch is None else "sum")
    return loss if num_items_in_batch is None else loss / num_items_in_batch


def model():
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    from shared_prefix_models import _rmsnorm_in_input_dtype

    # transformers' RMSNorm computes in fp32 even in an fp64 model (agreement capped near 1e-7): in the input dtype
    modeling_llama.LlamaRMSNorm.forward = _rmsnorm_in_input_dtype

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    # axolotl's model loader sets use_cache=False for training; with a cache transformers builds no per-document
    # mask from the restarting position_ids, and packed documents would attend to each other.
    config.use_cache = False
    net = LlamaForCausalLM(config).double()
    net.loss_function = fp64_causal_lm_loss
    return net


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).clone() for t in tensors])


def main():
    rank, world, init, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    host, port = init.removeprefix("tcp://").split(":")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR=host, MASTER_PORT=port,
                      ACCELERATE_USE_CPU="true")  # as `accelerate launch --cpu`: AxolotlTrainer rebuilds accelerate's
    # state from the environment, and without this flag a CPU-only process is not distributed
    import datasets
    from axolotl.core.training_args import AxolotlTrainingArguments
    from axolotl.utils.collators import V2BatchSamplerDataCollatorForSeq2Seq
    from axolotl.utils.dict import DictDefault
    from transformers import TrainerCallback

    from packkit.integrations.axolotl import PackkitPlugin

    from axolotl.monkeypatch.data.batch_dataset_fetcher import apply_multipack_dataloader_patch

    apply_multipack_dataloader_patch()  # what axolotl's PatchManager does for sample_packing (bins per item)
    use_packkit = os.environ.get("AXOLOTL_COLLATOR") == "packkit"
    cfg = DictDefault({"sample_packing": True, "base_model": "tiny-llama", "seed": 0, "packkit_collator": use_packkit})
    plugin = PackkitPlugin()
    plugin.register(cfg)
    net = model()
    plugin.resolve_cost(net.config)
    base = plugin.get_trainer_cls(cfg)
    record = {"params": [], "grads": [], "loss": [], "rows": []}

    class Recorder(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            record["params"].append(flat(net.parameters()))

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            record["grads"].append(flat(p.grad for p in net.parameters()))

    class Trainer(base):
        def _create_multipack_sampler(self, base_sampler, dataset):
            self.packkit_sampler = super()._create_multipack_sampler(base_sampler, dataset)
            return self.packkit_sampler

        def training_step(self, model, inputs, num_items_in_batch=None):
            record["rows"].append(inputs["input_ids"].shape[-1])
            loss = super().training_step(model, inputs, num_items_in_batch)
            record["loss"].append(float(loss))
            return loss

    with tempfile.TemporaryDirectory() as tmp:
        args = AxolotlTrainingArguments(
            output_dir=tmp, per_device_train_batch_size=1, gradient_accumulation_steps=1, max_steps=3,
            optim="sgd", learning_rate=0.5, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=0.0, sample_packing=True, max_seq_length=CAPACITY, sample_packing_bin_size=200,
            report_to=[], logging_steps=1, save_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0,
            remove_unused_columns=False, ddp_backend="gloo", disable_tqdm=True)
        data = datasets.Dataset.from_list(samples())
        offered = plugin.get_collator_cls_and_kwargs(cfg)
        assert (offered is not None) == use_packkit
        if use_packkit:  # as axolotl's builder calls it (tokenizer, padding, pad_to_multiple_of, return_tensors)
            collator = offered[0](tokenizer(), padding=True, pad_to_multiple_of=64, return_tensors="pt", **offered[1])
        else:
            collator = V2BatchSamplerDataCollatorForSeq2Seq(tokenizer(), return_tensors="pt", padding=True)
        trainer = Trainer(model=net, args=args, train_dataset=data, data_collator=collator, callbacks=[Recorder()])
        assert trainer.accelerator.num_processes == world, trainer.accelerator.state
        trainer.train()
    sampler = trainer.packkit_sampler
    # The LR schedule's count (axolotl.utils.trainer builds its own sampler: packkit's, once the plugin registered)
    from axolotl.utils.trainer import calculate_total_num_steps

    schedule_cfg = DictDefault({"sample_packing": True, "micro_batch_size": 1, "gradient_accumulation_steps": 1,
                                "batch_size": world, "sequence_len": CAPACITY, "num_epochs": 1, "seed": 0,
                                "sample_packing_bin_size": 200, "attn_supports_packing": True})
    schedule_steps = calculate_total_num_steps(schedule_cfg, data, update=False)
    torch.save({"record": record, "items": sampler.generate_batches(), "epoch": sampler.epoch,
                "dp_size": sampler.dp_size, "len": len(sampler), "balance": sampler.balance,
                "dataloader_len": len(trainer.get_train_dataloader()), "cost": plugin.cost,
                "schedule_steps": schedule_steps},
               out_dir / f"rank{rank}.pt")
    print(f"rank {rank} done")


if __name__ == "__main__":
    main()
