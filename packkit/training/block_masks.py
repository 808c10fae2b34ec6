"""FlexAttention ``BlockMask`` s for packed batches, one per attention layer type of the model.

transformers uses a ``BlockMask`` it is given **as is** for every layer: it adds no sliding window or chunk to
it. So a document-causal mask alone is wrong for a model with windowed layers (Mistral, Gemma 2/3, Qwen2/3
sliding layers, GPT-OSS, Cohere 2, Llama 4 chunks). With the model's config, :func:`layer_block_masks` gives
each layer type its own mask, with transformers' own semantics on every document (positions restart at each
document's start, as when the document runs alone):

- ``full_attention``: same document and ``kv <= q``;
- ``sliding_attention``: and ``q - kv < config.sliding_window`` (``sliding_window_overlay``: ``kv > q - W``);
- ``chunked_attention``: and ``(q - s) // C == (kv - s) // C``, ``s`` the document's first index,
  ``C = config.attention_chunk_size`` (``chunked_overlay``).

One layer type: one ``BlockMask`` (every model takes it). Several: a :class:`LayerBlockMasks` mapping
``{layer_type: BlockMask}``, which models with ``config.layer_types`` read per layer
(``attention_mask[config.layer_types[i]]``); a model that cannot take a mapping gets a ``ValueError``.

Without a config, :func:`document_causal_block_mask` is the document-causal mask, and it refuses (ValueError)
to be handed to transformers' sliding-window or chunked mask builders of a model whose window is shorter than
a document of the batch: the only place where it would be silently wrong.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch

from ..packing.checks import check_int, refuse_meta

MAX_BLOCK_SIZE = 1 << 16

# transformers.masking_utils builders that add a window / chunk to a mask they build, and the config field.
_WINDOWED_BUILDERS = {"create_sliding_window_causal_mask": "sliding_window",
                      "create_bidirectional_sliding_window_mask": "sliding_window",
                      "create_chunked_causal_mask": "attention_chunk_size"}
_WINDOWED_TYPES = {"sliding_window": "sliding_attention", "attention_chunk_size": "chunked_attention"}


def _block_mask_class():
    from torch.nn.attention.flex_attention import BlockMask

    global DocumentCausalBlockMask
    if DocumentCausalBlockMask is None:
        class _DocumentCausal(BlockMask):
            """A document-causal ``BlockMask`` that refuses to stand in for a windowed layer's mask."""

            packkit_max_document = 0

            @property
            def shape(self):
                _refuse_windowed_use(self.packkit_max_document)
                return BlockMask.shape.fget(self)

        _DocumentCausal.__name__ = _DocumentCausal.__qualname__ = "DocumentCausalBlockMask"
        DocumentCausalBlockMask = _DocumentCausal
    return DocumentCausalBlockMask


DocumentCausalBlockMask = None  # the BlockMask subclass, made on first use (torch's flex module loads lazily)


def _refuse_windowed_use(max_document: int) -> None:
    """Raise if a transformers windowed-mask builder is asking for this mask's shape (it would return the mask
    unchanged) and the model's window would cut a document of the batch."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return
        field = _WINDOWED_BUILDERS.get(frame.f_code.co_name)
        if field and frame.f_globals.get("__name__") == "transformers.masking_utils":
            config = frame.f_locals.get("config")
            window = getattr(config, field, None)
            layer_types = getattr(config, "layer_types", None)
            used = layer_types is None or _WINDOWED_TYPES[field] in layer_types
            if used and window is not None and window < max_document:
                raise ValueError(
                    f"return_block_mask=True made a document-causal BlockMask, but this model "
                    f"({getattr(config, 'model_type', '?')}) has {_WINDOWED_TYPES[field]} layers ({field}={window}) "
                    f"and a document of {max_document} tokens: transformers uses a given BlockMask as is, so the "
                    f"window would be lost. Pass PackingCollator(return_block_mask=True, model_config=model.config)")
            return
        frame = frame.f_back


class LayerBlockMasks(dict):
    """``{layer_type: BlockMask}``, the mapping transformers' models with ``config.layer_types`` take as
    ``attention_mask``. A missing layer type, or a model that takes one mask only, raises ValueError."""

    def __missing__(self, layer_type):
        raise ValueError(f"the packed batch's BlockMasks cover layer types {sorted(self)}, not {layer_type!r}: "
                         "build the collator with this model's config (model_config=model.config)")

    @property
    def ndim(self):  # transformers reads .ndim of a mask it does not take as a mapping
        raise ValueError("this model takes one attention mask, not a mapping per layer type: its layer types "
                         f"{sorted(self)} need different masks, which its forward cannot apply; use "
                         "return_block_mask=False (transformers then builds the masks from position_ids)")

    shape = ndim


def _documents(seq_idx: torch.Tensor) -> torch.Tensor:
    if not isinstance(seq_idx, torch.Tensor) or seq_idx.is_floating_point() or seq_idx.is_complex():
        raise TypeError(f"seq_idx must be an integer tensor of segment ids, got "
                        f"{getattr(seq_idx, 'dtype', type(seq_idx).__name__)}")
    refuse_meta(seq_idx, "seq_idx")
    doc = seq_idx if seq_idx.dim() == 2 else seq_idx.unsqueeze(0)
    if doc.dim() != 2:
        raise ValueError(f"seq_idx must be [B, T] or [T], got shape {tuple(seq_idx.shape)}")
    return doc


def _offsets(doc: torch.Tensor) -> torch.Tensor:
    """Each token's index inside its document (documents are contiguous runs of ``doc``)."""
    index = torch.arange(doc.shape[1], device=doc.device).expand_as(doc)
    start = torch.ones_like(doc, dtype=torch.bool)
    start[:, 1:] = doc[:, 1:] != doc[:, :-1]
    first = torch.where(start, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


def _max_document(doc: torch.Tensor) -> int:
    return int(_offsets(doc).max()) + 1 if doc.numel() else 0


def _block_size(block_size) -> int:
    """A BlockMask block is one tile of the FlexAttention kernel (torch's use 64-128 tokens): an int in [1, 2^16]
    (a huge one sized the mask's tensors by the argument, not the batch)."""
    block_size = check_int(block_size, "block_size", 1)
    if block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be in [1, {MAX_BLOCK_SIZE}] (a FlexAttention tile), got {block_size}")
    return block_size


def _create(mask_mod, doc: torch.Tensor, block_size: int):
    from torch.nn.attention.flex_attention import create_block_mask

    batch, length = doc.shape
    return create_block_mask(mask_mod, batch, None, length, length, device=doc.device, BLOCK_SIZE=block_size)


def document_causal_block_mask(seq_idx: torch.Tensor, block_size: int = 128, *,
                               max_document: Optional[int] = None):
    """FlexAttention ``BlockMask``: token q attends to kv iff same segment and kv <= q.

    ``seq_idx`` is ``[B, T]`` (or ``[T]``); padding segments attend only within themselves. The mask raises
    ValueError if transformers would use it for a sliding-window / chunked layer whose window is shorter than
    ``max_document`` (default: the longest segment): pass the model's config to :func:`layer_block_masks`.
    """
    block_size = _block_size(block_size)
    if max_document is not None:
        max_document = check_int(max_document, "max_document", 0)
    doc = _documents(seq_idx)

    def mask_mod(b, h, q, kv):
        return (doc[b, q] == doc[b, kv]) & (kv <= q)

    mask = _create(mask_mod, doc, block_size)
    mask.__class__ = _block_mask_class()
    mask.packkit_max_document = _max_document(doc) if max_document is None else int(max_document)
    return mask


def _window(config, field: str, layer_type: str) -> int:
    value = getattr(config, field, None)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"model_config has {layer_type} layers but {field}={value!r}; a positive int is needed")
    return value


def model_layer_types(config) -> list:
    """The attention layer types of ``config`` as transformers' models pick their masks: ``config.layer_types``,
    else every layer ``sliding_attention`` when ``config.sliding_window`` is set (Mistral-style), else full."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return list(dict.fromkeys(layer_types))
    return ["sliding_attention" if getattr(config, "sliding_window", None) is not None else "full_attention"]


def layer_block_masks(seq_idx: torch.Tensor, config, block_size: int = 128):
    """The masks of ``config``'s attention layer types for a packed batch's ``seq_idx`` (``[B, T]``): one
    ``BlockMask`` when the model has one layer type, else a :class:`LayerBlockMasks` mapping. Layer types other
    than full / sliding / chunked attention (recurrent, linear, compressed ...) raise ValueError."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text, "is_causal", True):
        raise ValueError("model_config.is_causal is False (bidirectional attention): packkit's BlockMasks are causal")
    block_size = _block_size(block_size)
    doc = _documents(seq_idx)
    offset = _offsets(doc)
    masks = LayerBlockMasks()
    for layer_type in model_layer_types(text):
        if layer_type == "full_attention":
            masks[layer_type] = document_causal_block_mask(doc, block_size)
            continue
        if layer_type == "sliding_attention":
            window = _window(text, "sliding_window", layer_type)

            def mask_mod(b, h, q, kv, window=window):
                return (doc[b, q] == doc[b, kv]) & (kv <= q) & (q - kv < window)
        elif layer_type == "chunked_attention":
            chunk = _window(text, "attention_chunk_size", layer_type)

            def mask_mod(b, h, q, kv, chunk=chunk):
                return (doc[b, q] == doc[b, kv]) & (kv <= q) & (offset[b, q] // chunk == offset[b, kv] // chunk)
        else:
            raise ValueError(f"return_block_mask: layer type {layer_type!r} of {getattr(text, 'model_type', 'the model')} "
                             "has no packkit BlockMask (allowed: full_attention, sliding_attention, chunked_attention); "
                             "use return_block_mask=False")
        masks[layer_type] = _create(mask_mod, doc, block_size)
    return next(iter(masks.values())) if len(masks) == 1 else masks
