"""The torchtitan config module of tests/test_torchtitan_entry.py, as docs/torchtitan.md tells users to write one:
``python -m torchtitan.train --module torchtitan_entry_config --config packkit_tiny`` (packkit's dataloader) or
``--config torchtitan_tiny`` (torchtitan's own text dataloader, the control), on the same local data.

The model is torchtitan's Llama 3 built by its own layer helper, registered as flavor ``packkit_tiny`` (2 layers,
dim 64, 4 heads, Flex attention); the tokenizer and the dataset (a ``datasets.save_to_disk`` folder of ``text``
records) are made by the test under ``$PACKKIT_TT_ROOT`` (``assets/``, ``data/``). Nothing reaches the hub."""
from __future__ import annotations

import os

import datasets
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.components.validate import Validator
from torchtitan.config import DebugConfig, TrainingConfig
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataLoader
from torchtitan.models import llama3
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.trainer import Trainer

from packkit.integrations.torchtitan import PackkitDataLoader, torchtitan_cost

ROOT = os.environ.get("PACKKIT_TT_ROOT", ".")
VOCAB, DIM, HEADS, LAYERS = 320, 64, 4, 2
SEQ_LEN, BATCH, STEPS = 128, 2, 8


def _tiny_llama(attn_backend: str, tp_gemm_backend: str = "default") -> llama3.Llama3Model.Config:
    return llama3.Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=llama3._output_linear_init(DIM)),
        layers=llama3._build_llama3_layers(
            n_layers=LAYERS, dim=DIM, n_heads=HEADS, hidden_dim=4 * DIM, attn_backend=attn_backend,
            tp_gemm_backend=tp_gemm_backend,
            rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=4 * SEQ_LEN, theta=10000.0)))


llama3.llama3_configs["packkit_tiny"] = _tiny_llama
# torchtitan's own loader reads registered datasets only ("Add your dataset here"): the same folder, for the control.
DATASETS["packkit_entry_local"] = DatasetConfig(path=os.path.join(ROOT, "data"), loader=datasets.load_from_disk,
                                                sample_processor=lambda sample: sample["text"])


def _trainer(name: str, dataloader) -> Trainer.Config:
    model_spec = llama3.model_registry("packkit_tiny")
    return Trainer.Config(
        model_spec=model_spec,
        hf_assets_path=os.path.join(ROOT, "assets"),
        dump_folder=os.path.join(ROOT, f"out-{name}"),
        loss=CrossEntropyLoss.Config(),
        optimizer=default_adamw(lr=3e-3),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=1),
        training=TrainingConfig(local_batch_size=BATCH, seq_len=SEQ_LEN, steps=STEPS),
        dataloader=dataloader,
        metrics=MetricsProcessor.Config(log_freq=1, disable_color_printing=True),
        checkpoint=CheckpointManager.Config(enable=False),
        activation_checkpoint=None,
        validator=Validator.Config(enable=False),
        debug=DebugConfig(seed=0),
    )


def packkit_tiny() -> Trainer.Config:
    """The lines docs/torchtitan.md changes: packkit's dataloader, balanced by the model's cost."""
    model = llama3.model_registry("packkit_tiny").model
    return _trainer("packkit", PackkitDataLoader.Config(dataset_path=os.path.join(ROOT, "data"),
                                                        cost=torchtitan_cost(model)))


def torchtitan_tiny() -> Trainer.Config:
    """The control: torchtitan's own text dataloader on the same documents."""
    return _trainer("torchtitan", HuggingFaceTextDataLoader.Config(dataset="packkit_entry_local"))
