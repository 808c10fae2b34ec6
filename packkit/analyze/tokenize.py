"""Token counts of text with a local tokenizer (never downloads).

``--tokenizer`` is a folder saved with ``save_pretrained`` (loaded with
``transformers.AutoTokenizer.from_pretrained(dir, local_files_only=True)``) or, without
transformers, a folder or file holding ``tokenizer.json`` (loaded with the ``tokenizers`` library).
Fast tokenizers count in batches in Rust (``encode_batch_fast``, all cores) with truncation and
padding switched off. A value may also be a list of chat messages (``[{"role": ..., "content": ...}]``):
it is rendered with the tokenizer's chat template and counted without adding special tokens again
(as ``apply_chat_template(tokenize=True)`` does).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import AnalyzeError, optional, require


class TokenCounter:
    def __init__(self, path: str | Path, add_special_tokens: bool = True):
        self.path = Path(path)
        self.add_special_tokens = add_special_tokens
        self.hf = None  # transformers tokenizer (chat templates, slow tokenizers)
        self.backend = None  # tokenizers.Tokenizer
        if not self.path.exists():
            raise AnalyzeError("tokenizer not found (--tokenizer takes a local folder or tokenizer.json; "
                               "nothing is downloaded)", self.path)
        transformers = optional("transformers") if self.path.is_dir() else None
        if transformers is not None:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
            try:
                self.hf = transformers.AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
            except Exception as e:  # transformers raises many types for a bad folder
                raise AnalyzeError(f"cannot load a tokenizer from this folder: {type(e).__name__}: {e}",
                                   self.path) from None
            self.backend = getattr(self.hf, "backend_tokenizer", None) if getattr(self.hf, "is_fast", False) else None
        else:
            file = self.path / "tokenizer.json" if self.path.is_dir() else self.path
            if not file.exists():
                require("transformers", "transformers", f"loading the tokenizer in {self.path} (no tokenizer.json)")
            tokenizers = require("tokenizers", "tokenizers", "counting tokens with --tokenizer")
            try:
                self.backend = tokenizers.Tokenizer.from_file(str(file))
            except Exception as e:
                raise AnalyzeError(f"cannot load tokenizer.json: {e}", file) from None
        if self.backend is not None:
            self.backend.no_truncation()
            self.backend.no_padding()
        self.name = self.path.name

    def describe(self) -> dict:
        return {"path": str(self.path), "library": "transformers" if self.hf is not None else "tokenizers",
                "class": type(self.hf if self.hf is not None else self.backend).__name__,
                "add_special_tokens": self.add_special_tokens}

    def _count_strings(self, texts: list[str], add_special_tokens: bool) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.int64)
        if self.backend is not None:
            encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
            return np.fromiter((len(e) for e in encode(texts, add_special_tokens=add_special_tokens)),
                               dtype=np.int64, count=len(texts))
        ids = self.hf(texts, add_special_tokens=add_special_tokens, truncation=False, padding=False,
                      return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        return np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(texts))

    def _render_chat(self, messages: list, where: Callable[[], tuple]) -> str:
        if self.hf is None:
            require("transformers", "transformers", "rendering chat messages with the tokenizer's chat template")
            raise AnalyzeError("chat messages need a tokenizer folder loadable by transformers", *where())
        if not all(isinstance(m, dict) and "role" in m for m in messages):
            raise AnalyzeError("expected a string or a list of chat messages ({'role': ..., 'content': ...})", *where())
        try:
            text = self.hf.apply_chat_template(messages, tokenize=False)
        except Exception as e:
            raise AnalyzeError(f"the tokenizer's chat template failed: {type(e).__name__}: {e}", *where()) from None
        if not isinstance(text, str):  # some versions return a list for batched input
            text = "".join(text)
        return text

    def count(self, values: list, field: str, where: Callable[[int], tuple]) -> np.ndarray:
        """Token count of each value (a string or a list of chat messages).

        ``where(i)`` gives ``(path, location)`` of value ``i`` for error messages.
        """
        out = np.zeros(len(values), dtype=np.int64)
        plain_idx, plain, chat_idx, chat = [], [], [], []
        for i, value in enumerate(values):
            if isinstance(value, str):
                plain_idx.append(i)
                plain.append(value)
            elif isinstance(value, list):
                chat_idx.append(i)
                chat.append(self._render_chat(value, lambda i=i: where(i)))
            elif value is None:
                raise AnalyzeError(f"field {field!r} is null", *where(i))
            else:
                raise AnalyzeError(f"field {field!r} must be text (or a list of chat messages) to tokenize, got "
                                   f"{type(value).__name__} {str(value)[:40]!r}", *where(i))
        if plain:
            out[plain_idx] = self._count_strings(plain, self.add_special_tokens)
        if chat:
            out[chat_idx] = self._count_strings(chat, False)
        return out
