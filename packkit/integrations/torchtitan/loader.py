"""``PackkitDataLoader``: torchtitan's ``BaseDataLoader`` over :class:`BalancedDocumentStream` (imports torchtitan).

In a torchtitan config function, replace the dataloader::

    dataloader=PackkitDataLoader.Config(dataset_path="/data/my_docs", cost=torchtitan_cost(model_spec.model))

torchtitan calls ``config.dataloader.build(dp_world_size=, dp_rank=, tokenizer=, seq_len=, local_batch_size=,
snapshot_every_n_steps=)``; the loader is torchtitan's ``ParallelAwareDataloader`` (torchdata's
``StatefulDataLoader``), whose checkpointed state is the stream's, per dp rank.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ...planning.cost_model import transformer_cost
from .stream import BalancedDocumentStream

try:
    from torchtitan.components.dataloader import ParallelAwareDataloader
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without torchtitan
    raise ModuleNotFoundError("packkit.integrations.torchtitan needs torchtitan (pip install 'packkit[torchtitan]')",
                              name=exc.name) from exc


def _load_source(config) -> Any:
    if config.source is not None:
        return config.source
    path = config.dataset_path or config.dataset
    if not path:
        raise ValueError("PackkitDataLoader.Config needs source= (documents) or dataset_path= (a Hugging Face "
                         "dataset: a save_to_disk folder or a hub/local name for datasets.load_dataset)")
    import datasets

    if os.path.isdir(path) and os.path.exists(os.path.join(path, "dataset_info.json")):
        return datasets.load_from_disk(path)
    return datasets.load_dataset(path, split=config.split, streaming=config.streaming)


class PackkitDataLoader(ParallelAwareDataloader):
    """torchtitan dataloader yielding best-fit packed rows (no document cut), balanced across dp ranks."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        source: Any = None
        """Documents (token lists, dicts with ``input_key``, or text): an iterable or a callable returning one.
        When None, ``dataset_path`` (or ``dataset``) is loaded with Hugging Face ``datasets``."""

        split: str = "train"
        """Split for ``datasets.load_dataset``."""

        streaming: bool = False
        """``datasets.load_dataset(..., streaming=True)``."""

        input_key: str = "input_ids"
        text_key: str = "text"

        buffer_size: int = 1024
        """Documents planned together."""

        cost: Any = "tokens"
        """Balance cost per rank step: "tokens", "attention" or (a, b) (``torchtitan_cost(model_config)``)."""

        overlong: str = "split"
        """Documents longer than seq_len: "split" (into seq_len pieces), "drop" or "error"."""

        infinite: bool = True
        carry_threshold: float = 0.9
        """A buffer's last step filled below this waits for the next buffer's documents."""

        max_carries: int = 4
        shuffle: bool = True
        """Each buffer's steps in a seeded random order; False: the source order of each step's longest document
        (never the planner's longest-first order)."""

        seed: int = 0
        pad_token_id: int = 0

        context_parallel_degree: int = 1
        """Set it to ``parallelism.context_parallel_degree``: above 1 each row's documents are ordered so
        torchtitan's head-tail CP shards of the row get even attention work (it shards rows itself)."""

        max_sequences: int | None = None
        """At most N sequences per row, the padding run included (docs/packing.md "Static shapes"): packkit's name
        for torchtitan's ``max_packed_sequences_per_sample`` (set both to the same N). Rows are planned with at
        most N - 1 documents; None: no limit."""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer=None, seq_len: int,
                 local_batch_size: int, snapshot_every_n_steps: int | None = 1, **kwargs):
        if kwargs:
            raise TypeError(f"PackkitDataLoader got unexpected arguments {sorted(kwargs)}")
        if config.num_workers:
            # Workers would each replay the whole stream (every rank plans every step); refuse, not duplicate.
            raise ValueError(f"PackkitDataLoader plans in the main process: num_workers must be 0, got "
                             f"{config.num_workers}")
        stream = BalancedDocumentStream(
            _load_source(config), seq_len=seq_len, local_batch_size=local_batch_size, dp_rank=dp_rank,
            dp_world_size=dp_world_size, tokenizer=tokenizer, input_key=config.input_key, text_key=config.text_key,
            buffer_size=config.buffer_size, cost=config.cost, overlong=config.overlong, infinite=config.infinite,
            carry_threshold=config.carry_threshold, max_carries=config.max_carries, shuffle=config.shuffle,
            seed=config.seed, pad_token_id=config.pad_token_id, cp_degree=config.context_parallel_degree,
            max_sequences=config.max_sequences)
        self.stream = stream
        # The stream yields whole [B, L] batches: batch_size=None.
        super().__init__(stream, dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=None,
                         pin_memory=config.pin_memory, snapshot_every_n_steps=snapshot_every_n_steps)


def _figure(obj, *names):
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def torchtitan_cost(model_config, **overrides) -> tuple:
    """:func:`packkit.transformer_cost` ``(a, b)`` of a torchtitan decoder config (e.g.
    ``torchtitan.models.llama3.model_registry("8B").model``), read from its first layer: ``dim``,
    ``len(layers)``, ``vocab_size``, the attention's heads and head_dim and the feed-forward width. Figures it
    cannot read (another block type, MoE layers) are named in the ValueError; pass them as ``overrides``."""
    layers = getattr(model_config, "layers", None)
    if not layers:
        raise ValueError("model_config must be a torchtitan decoder config with layers (e.g. "
                         "model_registry('8B').model)")
    layer = layers[0]
    attn = getattr(layer, "attention", None)
    qkv = getattr(attn, "qkv_linear", None)
    ffn = getattr(layer, "feed_forward", None)
    w1 = getattr(ffn, "w1", None)
    figures = {
        "hidden_size": getattr(model_config, "dim", None),
        "num_layers": len(layers),
        "vocab_size": getattr(model_config, "vocab_size", None),
        "num_heads": _figure(attn, "n_heads") if attn is not None else None,
        "num_kv_heads": (_figure(qkv, "n_kv_heads") if qkv is not None else None) or _figure(attn, "n_kv_heads"),
        "head_dim": (_figure(qkv, "head_dim") if qkv is not None else None) or _figure(attn, "head_dim"),
        "intermediate_size": getattr(w1, "out_features", None),
    }
    figures.update(overrides)
    missing = sorted(k for k, v in figures.items() if v is None)
    if missing:
        raise ValueError(f"torchtitan_cost could not read {', '.join(missing)} from {type(model_config).__qualname__}"
                         f" (MoE or another block type?); pass them as keyword arguments")
    return transformer_cost(**figures)
