"""A source example as token ids, the forms torchtitan users have: token sequences, dicts of ids, or text."""
from __future__ import annotations

import numpy as np
import torch


def tokens_of(example, position: int, tokenizer, input_key: str, text_key: str) -> np.ndarray:
    """An example's token ids: a token sequence, a dict with ``input_key`` ids, or text (a str, or a dict with
    ``text_key``) encoded by torchtitan's tokenizer with BOS and EOS, as its own dataset does."""
    text = None
    if isinstance(example, str):
        text = example
    elif isinstance(example, dict):
        if input_key in example:
            example = example[input_key]
        elif text_key in example:
            text = example[text_key]
        else:
            raise ValueError(f"example at source position {position} has neither input_key={input_key!r} nor "
                             f"text_key={text_key!r} "
                             f"(keys: {sorted(example)[:8]})")
    if text is not None:
        if tokenizer is None:
            raise ValueError(f"example at source position {position} is text but no tokenizer was given")
        example = tokenizer.encode(text, add_bos=True, add_eos=True)
    if isinstance(example, torch.Tensor):
        if example.dtype.is_floating_point or example.dtype == torch.bool or example.dim() != 1:
            raise TypeError(f"example at source position {position}: token ids must be a 1-D integer tensor, got "
                            f"{example.dtype} of shape {tuple(example.shape)}")
        return example.to("cpu", torch.int64).numpy()
    arr = np.asarray(example)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(f"example at source position {position}: token ids must be a 1-D sequence of ints, got "
                        f"{arr.dtype} of shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"example at source position {position} has a negative token id ({int(arr.min())})")
    return arr.astype(np.int64, copy=False)
