"""docs/vlm.md's example runs as written and its comments hold (tests/test_docs_examples.py only runs it)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")


def test_docs_vlm_example_runs():
    page = (Path(__file__).resolve().parents[1] / "docs" / "vlm.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    scope: dict = {}
    torch.manual_seed(0)
    exec(compile(code, "docs/vlm.md", "exec"), scope)
    batch = scope["batch"]
    assert batch["position_ids"].shape == (4, 1, 64) and batch["position_ids"].dtype == torch.int64
    assert batch["pixel_values"].shape == (28, 24)
    assert torch.isfinite(scope["loss"])
