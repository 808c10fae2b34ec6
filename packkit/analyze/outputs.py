"""Atomic output: everything is written into a hidden staging folder next to OUT, then moved in.

* OUT does not exist: the staging folder is renamed to OUT (one atomic rename).
* OUT is an existing folder: its old ``report.md`` is removed first, every new file replaces its old
  version with ``os.replace``, outputs of an earlier run that this run does not produce are removed,
  and ``report.md`` goes in last, so a folder holding ``report.md`` is always complete and consistent.
* Any error before the move (bad data, a failing figure, Ctrl-C) removes the staging folder and leaves
  OUT as it was.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .errors import AnalyzeError
from .figures import FIGURES

REPORT = "report.md"
KNOWN_OUTPUTS = ("dataset_stats.json", "packing_simulations.json", "recommendations.json", "lengths.npy",
                 *FIGURES.values(), REPORT)


class Staging:
    def __init__(self, out: str | Path):
        self.out = Path(out)
        if self.out.exists() and not self.out.is_dir():
            raise AnalyzeError("the output path exists and is not a folder", self.out)
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.dir = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.partial-", dir=self.out.parent))
        except OSError as e:
            raise AnalyzeError(f"cannot create the output folder: {e.strerror or e}", self.out) from None
        self.written: list[str] = []

    def path(self, name: str) -> Path:
        target = self.dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name not in self.written:
            self.written.append(name)
        return target

    def write_json(self, name: str, obj) -> None:
        self.path(name).write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n", encoding="utf-8")

    def write_text(self, name: str, text: str) -> None:
        self.path(name).write_text(text, encoding="utf-8")

    def commit(self) -> list[str]:
        """Moves the staged files into OUT; returns their paths relative to OUT (report.md last)."""
        order = [n for n in self.written if n != REPORT] + ([REPORT] if REPORT in self.written else [])
        try:
            if not self.out.exists():
                try:
                    os.rename(self.dir, self.out)
                    return order
                except OSError:
                    if not self.out.is_dir():  # created meanwhile by someone else: fall through
                        raise
            (self.out / REPORT).unlink(missing_ok=True)
            for name in KNOWN_OUTPUTS:
                if name not in self.written:
                    (self.out / name).unlink(missing_ok=True)
            figures = self.out / "figures"
            if figures.is_dir() and not any(figures.iterdir()) and not any(n.startswith("figures/") for n in order):
                figures.rmdir()
            for name in order:
                (self.out / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.dir / name, self.out / name)
        except OSError as e:
            raise AnalyzeError(f"cannot write the outputs: {e.strerror or e}", self.out) from None
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        return order

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
