"""Every script in examples/ runs end to end as `python examples/X.py`, within 30 s, and prints a result
that shows it worked (the loss fell; every token arrived)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
LIMIT_S = 30


def _needs(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")


def run_example(name: str) -> str:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert elapsed < LIMIT_S, f"{name} took {elapsed:.1f} s (limit {LIMIT_S} s)"
    return proc.stdout


def losses_fell(out: str, factor: float) -> None:
    m = re.search(r"first loss ([\d.]+)\s+last loss ([\d.]+)", out)
    assert m, out
    first, last = float(m.group(1)), float(m.group(2))
    assert last < factor * first, out


@_needs("transformers", "accelerate")
def test_hf_trainer_sft():
    losses_fell(run_example("hf_trainer_sft.py"), 0.8)


@_needs("transformers", "trl", "datasets", "tokenizers")
def test_trl_sft_pack_dataset():
    out = run_example("trl_sft_pack_dataset.py")
    assert re.search(r"packed 160 sequences into \d+ rows of 64", out), out
    losses_fell(out, 0.8)


@_needs("transformers")
def test_qwen25_vl_packing():
    out = run_example("qwen25_vl_packing.py")
    assert "position_ids (4, " in out, out
    losses_fell(out, 0.7)


@_needs("ray", "datasets", "pyarrow")
def test_ray_data_pack():
    out = run_example("ray_data_pack.py")
    assert "(same rows as single-process)" in out, out


def test_every_example_is_tested():
    """Each script in examples/ is named by some test (here, or beside the feature it shows)."""
    tests = "".join(p.read_text() for p in Path(__file__).parent.rglob("test_*.py"))
    untested = [p.name for p in EXAMPLES.glob("*.py") if p.name not in tests]
    assert not untested, f"examples no test runs: {untested}"
