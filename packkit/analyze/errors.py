"""Errors raised by ``packkit analyze``: every message names the file, the line or row, and the problem."""
from __future__ import annotations

import importlib
from pathlib import Path


class AnalyzeError(ValueError):
    """Bad input or options for ``packkit analyze``.

    ``str(error)`` reads ``FILE, line N: problem`` (JSONL, JSON Lines fallbacks and text files of lengths:
    1-based line numbers), ``FILE, row N: problem`` (JSON arrays, Parquet, Arrow, saved datasets:
    0-based row index, as ``dataset[N]``) or ``FILE: problem`` when the problem is the whole file.
    The parts are also attributes: ``path``, ``location`` (e.g. ``"line 7"`` or ``None``), ``problem``.
    """

    def __init__(self, problem: str, path: str | Path | None = None, location: str | None = None):
        self.path = None if path is None else str(path)
        self.location = location
        self.problem = problem
        where = ", ".join(p for p in (self.path, location) if p)
        super().__init__(f"{where}: {problem}" if where else problem)


class MissingDependency(AnalyzeError):
    """An optional package the requested feature needs is not installed."""


_EXTRA = {"matplotlib": "analyze", "pyarrow": "analyze", "tqdm": "analyze", "datasets": "hf", "transformers": "hf",
          "tokenizers": "hf"}


def require(module: str, pip_name: str, feature: str):
    """Imports ``module`` or raises :class:`MissingDependency` naming the pip package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        extra = _EXTRA.get(pip_name)
        also = f" or `pip install 'packkit[{extra}]'`" if extra else ""
        raise MissingDependency(f"{feature} needs the '{pip_name}' package ({e}); install it with "
                                f"`pip install {pip_name}`{also}") from None


def optional(module: str):
    """Imports ``module`` or returns None."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
