"""docs/vlm.md's example runs as written and its comments hold (tests/test_docs_examples.py only runs it)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.core

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
    # The comments hold, checked against values computed here (audit, issue 27: shapes and a finite loss only).
    feats = scope["features"]
    # One row holds all four samples in input order (53 tokens <= 64): the images' patches in that order.
    assert batch["input_ids"][0, :53].tolist() == [t for f in feats for t in f["input_ids"]]
    want_pixels = torch.cat([f["pixel_values"] for f in feats if "pixel_values" in f])
    assert torch.equal(batch["pixel_values"], want_pixels)
    assert torch.equal(batch["image_grid_thw"], torch.tensor([[1, 4, 4], [1, 2, 6]]))
    # The loss is the per-token mean over the samples each run alone (the packed documents do not mix).
    model, total, count = scope["model"], 0.0, 0
    with torch.no_grad():
        for f in feats:
            inputs = {k: torch.tensor([v]) if k in ("input_ids", "mm_token_type_ids") else v for k, v in f.items()}
            total += float(model(**inputs, labels=inputs["input_ids"], use_cache=False).loss) * (len(f["input_ids"]) - 1)
            count += len(f["input_ids"]) - 1
    assert abs(float(scope["loss"]) - total / count) <= 1e-5 * abs(total / count), (float(scope["loss"]), total / count)
