"""benchmarks/bench_train.py --quick: every feeding trains, its first-step loss equals the per-sample loss, and the
feedings that hold the same samples have the same loss curves (issue 42 §3)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.full

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_checks_its_losses(tmp_path):
    out = tmp_path / "train.json"
    done = subprocess.run([sys.executable, "benchmarks/bench_train.py", "--quick", "--repeats", "1", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = doc["profiles"]["quick"]["feedings"]
    assert set(rows) == {"padded", "group_by_length", "hf_flattening", "packkit_sdpa", "packkit_varlen"}
    for name, row in rows.items():
        assert "error" not in row, (name, row)
        assert row["first_loss_ok"] and row["real_tok_s"] > 0, (name, row)
    real = doc["profiles"]["quick"]["profile"]["real_tokens"]
    assert rows["hf_flattening"]["tokens_forwarded"] == rows["packkit_varlen"]["tokens_forwarded"] == real
    assert rows["padded"]["padding_share"] > 0.3 > rows["packkit_sdpa"]["padding_share"]
    curves = doc["profiles"]["quick"]["same_samples_loss_curves"]
    assert set(curves) == {"padded=hf_flattening", "packkit_sdpa=packkit_varlen"}
    assert all(c["ok"] for c in curves.values())


def test_loss_check_catches_a_wrong_loss(monkeypatch):
    """Control: a feeding whose batch leaks documents into each other (no position_ids restarts) fails the
    first-step check against the per-sample loss."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_train

    model = bench_train.tiny_llama(bench_train.QUICK_MODEL, "sdpa").eval()
    features = bench_train.make_dataset([30, 20, 25], bench_train.QUICK_MODEL["vocab_size"], 0)
    leaky = bench_train.collator("hf_flattening", 256)(features)
    del leaky["position_ids"]  # one causal sequence: documents see each other
    import torch

    with torch.no_grad():
        wrong = float(model(**leaky, use_cache=False).loss)
        right = float(model(**bench_train.collator("hf_flattening", 256)(features), use_cache=False).loss)
    reference = bench_train.per_sample_loss(model, features)
    assert bench_train.rel(right, reference) <= bench_train.LOSS_RTOL < bench_train.rel(wrong, reference)
