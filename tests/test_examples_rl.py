"""examples/rl_micro_batches.py runs (subprocess, CPU) and packs every micro-batch within the cap."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.full

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]


def test_rl_micro_batches_example():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "rl_micro_batches.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sizes = [int(t) for t in re.findall(r"rollouts, (\d+) tokens \(cap 96\)", proc.stdout)]
    assert sizes and max(sizes) <= 96
    assert "rank 0 response log-probs" in proc.stdout
