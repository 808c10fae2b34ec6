"""Reading the stream's source: documents by source position (by index where the source allows, else one scan),
and a document as token ids, in the forms torchtitan users have: token sequences, dicts of ids, or text."""
from __future__ import annotations

from typing import Iterator

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


def iterable_of(source):
    """The source's iterable for one pass: ``source()`` for a zero-argument callable, else the source itself."""
    return source() if callable(source) and not hasattr(source, "__iter__") else source


def is_one_shot(source) -> bool:
    """Whether a pass reads an iterator (a generator, say), which a second pass finds empty."""
    src = iterable_of(source)
    return iter(src) is src


def read_documents(source, start: int) -> Iterator:
    """``(position, example)`` from source position ``start`` on; ValueError if the source ends before ``start``
    (a resume state of another source)."""
    src = iterable_of(source)
    if hasattr(src, "__len__") and hasattr(src, "__getitem__") and not isinstance(src, dict):
        if start > len(src):
            raise ValueError(f"the state's buffer_start is {start} but the source has {len(src)} documents; "
                             f"resume with the same source")
        for p in range(start, len(src)):
            yield p, src[p]
        return
    count = 0
    for p, example in enumerate(src):
        count = p + 1
        if p >= start:
            yield p, example
    if start > count:
        raise ValueError(f"the state's buffer_start is {start} but the source ended after {count} documents; "
                         f"resume with the same source")


def fetch_documents(source, positions) -> dict:
    """The examples at ``positions`` (all before the buffer start), by index or by one scan."""
    wanted = set(positions)
    found = {}
    if not wanted:
        return found
    for p, example in read_documents(source, min(wanted)):
        if p in wanted:
            found[p] = example
            if len(found) == len(wanted):
                break
    if len(found) != len(wanted):
        raise ValueError(f"the source no longer has the documents at positions {sorted(wanted - set(found))[:8]}"
                         f" recorded in the state; resume with the same source")
    return found
