"""README's "Vision-language models" example runs as written and its comments hold."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")


def test_readme_vlm_example_runs():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Vision-language models", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    torch.manual_seed(0)
    exec(compile(code, "README.md", "exec"), scope)
    batch = scope["batch"]
    assert batch["position_ids"].shape == (4, 1, 64) and batch["position_ids"].dtype == torch.int64
    assert batch["pixel_values"].shape == (28, 24)
    assert torch.isfinite(scope["loss"])
