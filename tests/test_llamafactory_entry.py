"""LLaMA-Factory's training through the documented entry, ``python -m packkit.integrations.llamafactory.train
config.yaml`` (``install()`` + LLaMA-Factory's ``run_exp``, what ``llamafactory-cli train config.yaml`` runs), on a
tiny local Llama, a byte-level BPE tokenizer trained in the test and alpaca json (tests/entry_assets.py; no hub),
and ``llamafactory-cli train`` itself on the same YAML as the control. Runs in LLaMA-Factory's venv
(.ci/trainers/llamafactory.sh). A probe callback of the test (``PACKKIT_LF_PROBE``, tests/entry_probe_llamafactory.py
via sitecustomize) records what the trainer ran. Asserted: the planned dataset in the dataloader, sampled in the
plan's order, steps = the schedule's = the plan's, the start line in LLaMA-Factory's output, and the loss finite and
close to the control's."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("llamafactory.train.tuner", reason="LLaMA-Factory is not installed (.ci/trainers/llamafactory.sh)")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from entry_assets import PYTHON, bin_of, run, save_tiny_model, start_lines, train_tokenizer, write_dataset  # noqa: E402

pytestmark = pytest.mark.full

CONFIG = """\
model_name_or_path: {model}
stage: sft
do_train: true
finetuning_type: full
dataset: alpaca_local
dataset_dir: {root}
template: default
cutoff_len: 256
neat_packing: true
overwrite_cache: true
preprocessing_num_workers: 1
output_dir: {root}/out-{name}
per_device_train_batch_size: 1
gradient_accumulation_steps: 1
num_train_epochs: 1
learning_rate: 0.002
lr_scheduler_type: cosine
logging_steps: 1
save_strategy: "no"
report_to: none
flash_attn: sdpa
use_cpu: true
seed: 7
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("lf-entry")
    samples = write_dataset(root / "alpaca.json", n=200)
    (root / "dataset_info.json").write_text(json.dumps({"alpaca_local": {"file_name": "alpaca.json"}}))
    save_tiny_model(root / "model", train_tokenizer(samples))
    return root


def train(root: Path, name: str, cmd: list[str]) -> tuple[str, dict]:
    cfg = root / f"{name}.yaml"
    cfg.write_text(CONFIG.format(model=root / "model", root=root, name=name))
    probe = root / f"probe-{name}.json"
    out = run(cmd + [str(cfg)], cwd=root, env={"PYTHONPATH": str(HERE / "entry_site"), "PACKKIT_LF_PROBE": str(probe),
                                               "ACCELERATE_USE_CPU": "true", "DISABLE_VERSION_CHECK": "1"})
    return out, json.loads(probe.read_text())


def test_llamafactory_train_entry_runs_packkits_plan(assets):
    out, rec = train(assets, "packkit", [PYTHON, "-m", "packkit.integrations.llamafactory.train"])
    control_out, control = train(assets, "control", [bin_of(PYTHON, "llamafactory-cli"), "train"])

    assert rec["planned"] and not control["planned"]
    assert rec["sampler"] == "SequentialSampler" and control["sampler"] != "SequentialSampler"
    lines = start_lines(out)
    assert len(lines) == 1, out[-3000:]
    steps, ranks, balance, efficiency = lines[0]
    assert ranks == 1 and balance >= 1.0 and 0.5 < efficiency <= 1.0
    assert start_lines(control_out) == []
    assert rec["global_step"] == rec["max_steps"] == steps == rec["rows"] == len(rec["first_ids"])
    # Each step's row is the dataset's row of that step, in the plan's order (a sequential sampler, one row a step).
    assert rec["first_ids"] == rec["planned_first_ids"]
    assert rec["rows"] <= control["rows"]  # one global plan: no more rows than LLaMA-Factory's chunked knapsack
    assert len(rec["losses"]) == steps and all(math.isfinite(x) for x in rec["losses"])
    ours, theirs = sum(rec["losses"]) / len(rec["losses"]), sum(control["losses"]) / len(control["losses"])
    assert abs(ours - theirs) <= 0.05 * theirs, (ours, theirs)
