"""``axolotl train cfg.yml``, axolotl's own command line, with ``PackkitPlugin`` as docs/axolotl.md says, on a tiny
local Llama, a byte-level BPE tokenizer trained in the test and alpaca json (tests/entry_assets.py; no hub), and
once without the plugin as the control. Runs in axolotl's venv (.ci/trainers/axolotl.sh). Asserted from the run
itself (a probe plugin of the test, tests/entry_probe_axolotl.py, records what the trainer ran): packkit's sampler
in the dataloader, the trainer's steps = the LR schedule's = the plan's, each step's row = the planned row for
this rank, the start line in axolotl's output, and the loss finite and close to the control's."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("axolotl.cli.main", reason="axolotl's CLI is not installed (see .ci/trainers/axolotl.sh)")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from entry_assets import PYTHON, bin_of, run, save_tiny_model, start_lines, train_tokenizer, write_dataset  # noqa: E402

pytestmark = pytest.mark.full

CONFIG = """\
base_model: {model}
datasets:
  - path: {data}
    type: alpaca
    ds_type: json
dataset_prepared_path: {root}/prepared-{name}
output_dir: {root}/out-{name}
val_set_size: 0
sequence_len: 256
sample_packing: true
pad_to_sequence_len: false
micro_batch_size: 1
gradient_accumulation_steps: 1
num_epochs: 1
optimizer: adamw_torch
learning_rate: 0.002
lr_scheduler: cosine
warmup_steps: 0
bf16: false
fp16: false
tf32: false
sdp_attention: true
flash_attention: false
logging_steps: 1
save_strategy: "no"
save_first_step: false
seed: 7
dataloader_num_workers: 0
special_tokens:
  pad_token: "<pad>"
plugins:
{plugins}
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("axolotl-entry")
    samples = write_dataset(root / "alpaca.json", n=200)
    save_tiny_model(root / "model", train_tokenizer(samples))
    return root


def train(root: Path, name: str, packkit: bool) -> tuple[str, dict]:
    plugins = ["entry_probe_axolotl.ProbePlugin"] + (["packkit.integrations.axolotl.PackkitPlugin"] if packkit else [])
    cfg = root / f"{name}.yml"
    cfg.write_text(CONFIG.format(model=root / "model", data=root / "alpaca.json", root=root, name=name,
                                 plugins="".join(f"  - {p}\n" for p in plugins)))
    probe = root / f"probe-{name}"
    out = run([bin_of(PYTHON, "axolotl"), "train", str(cfg)], cwd=root,
              env={"PYTHONPATH": str(HERE), "PACKKIT_PROBE_OUT": str(probe), "ACCELERATE_USE_CPU": "true"})
    return out, json.loads(Path(f"{probe}.0.json").read_text())


def test_axolotl_train_cli_runs_packkits_plan(assets):
    out, rec = train(assets, "packkit", packkit=True)
    control_out, control = train(assets, "control", packkit=False)

    assert rec["trainer"] == "PackkitAxolotlTrainer"
    assert rec["sampler_chain"][-1] == "packkit.integrations.axolotl.sampler.MultipackBatchSampler", rec
    assert control["sampler_chain"][-1] == "axolotl.utils.samplers.multipack.MultipackBatchSampler", control
    # The start line, once, in axolotl's own output; none in the control.
    lines = start_lines(out)
    assert len(lines) == 1, out[-3000:]
    steps, ranks, balance, efficiency = lines[0]
    assert ranks == 1 and balance >= 1.0 and 0.5 < efficiency <= 1.0
    assert start_lines(control_out) == []
    # Steps: the trainer ran the plan's steps, which the LR schedule counted (max_steps) too.
    assert rec["global_step"] == rec["max_steps"] == rec["planned_steps"] == steps == len(rec["rows"])
    # Each step trained the row planned for it (its real tokens), and nothing else.
    assert [r["tokens"] for r in rec["rows"]] == rec["planned_tokens"]
    assert all(r["shape"][0] == 1 and r["label_tokens"] > 0 for r in rec["rows"])
    # The loss: finite, and close to the control's (same data and model; only the rows' grouping differs).
    assert len(rec["losses"]) == steps and all(math.isfinite(x) for x in rec["losses"])
    ours, theirs = sum(rec["losses"]) / len(rec["losses"]), sum(control["losses"]) / len(control["losses"])
    assert abs(ours - theirs) <= 0.05 * theirs, (ours, theirs)
