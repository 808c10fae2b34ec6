"""``swift sft``, ms-swift's own command line, with packkit's plugin as docs/ms_swift.md says, on a tiny local Qwen2, a
byte-level BPE tokenizer trained in the test and alpaca json (tests/entry_assets.py; no hub), CPU, no flash-attn:
``--packing true --attn_impl sdpa`` (ms-swift alone refuses packing without flash-attn; the plugin lets sdpa / eager
through, where transformers keeps packed documents apart by their position_ids). Runs in ms-swift's venv
(.ci/trainers/swift.sh). A probe plugin of the test (tests/entry_probe_swift.py) casts the model to float64 and
records every step's collated batch and trainer loss. Asserted:

* packkit's dataset and sampler in effect, the trainer's steps = the schedule's = the plan's rows, each step's row
  the planned row (its samples), the start line in ms-swift's output;
* exactness through ms-swift's template and trainer: with learning rate 0, every packed step's loss equals the
  token-weighted mean of its samples' losses as ``swift sft`` computes them without packing (the control run,
  rel <= 1e-9, fp64); the same packed row with positions that do not restart (documents see each other) differs;
* the refusals that remain (ms-swift's own ``SftArguments._check_padding_free`` as the plugin wraps it, and the
  train-start check): other attention implementations, a forward without ``position_ids``, a KV cache. (The
  packkit run above passes ms-swift's argument check only through the plugin's wrapper, so that wrapper is what
  ``swift sft`` calls; a third CLI run for a refusal would cost ~1/3 of this file's time for no new code path.)
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

swift = pytest.importorskip("swift", reason="ms-swift is not installed (see .ci/trainers/swift.sh)")
if not hasattr(swift, "get_template"):  # a namespace package from a stray 'swift' folder, not ms-swift
    pytest.skip("ms-swift is not installed", allow_module_level=True)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from entry_assets import PYTHON, bin_of, run, save_tiny_model, start_lines, train_tokenizer, write_dataset  # noqa: E402

pytestmark = pytest.mark.full

PLUGIN = subprocess.run([PYTHON, "-P", "-m", "packkit.integrations.swift.plugin"], capture_output=True, text=True,
                        check=True).stdout.strip()


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("swift-entry")
    samples = write_dataset(root / "alpaca.json", n=48, seed=1)
    save_tiny_model(root / "model", train_tokenizer(samples), family="qwen2")
    return root


def sft(root: Path, name: str, *extra: str, plugins=(PLUGIN,), model_type="qwen2", template="qwen2_5",
        dataset="alpaca.json", max_length=512):
    probe = root / f"probe-{name}"
    cmd = [bin_of(PYTHON, "swift"), "sft", "--model", str(root / "model"), "--model_type", model_type, "--template",
           template, "--dataset", str(root / dataset), "--tuner_type", "full", "--torch_dtype", "float32",
           "--max_length", str(max_length), "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "1",
           "--num_train_epochs", "1", "--learning_rate", "0", "--warmup_ratio", "0", "--lr_scheduler_type",
           "constant", "--split_dataset_ratio", "0", "--dataset_num_proc", "1", "--dataloader_num_workers", "0",
           "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1", "--use_hf", "true",
           "--output_dir", str(root / f"out-{name}"), "--seed", "3", "--data_seed", "3",
           "--external_plugins", *plugins, str(HERE / "entry_probe_swift.py"), *extra]
    env = {"PACKKIT_PROBE_OUT": str(probe), "PYTHONPATH": str(HERE)}
    out = run(cmd, cwd=root, env=env)
    return out, torch.load(f"{probe}.0.pt", weights_only=False)


def documents(step):
    """(input ids, labels) of each sample in a packed row: the runs where position_ids restart at 0."""
    ids, labels = step["input_ids"][0], step["labels"][0]
    pos = step.get("text_position_ids", step["position_ids"])  # Qwen-VL: text row apart from the 3 mRoPE rows
    pos = pos.reshape(-1, pos.shape[-1])[0]
    starts = torch.nonzero(pos == 0).flatten().tolist() + [len(pos)]
    return [(tuple(ids[a:b].tolist()), labels[a:b]) for a, b in zip(starts[:-1], starts[1:])]


def label_tokens(labels) -> int:
    return int((labels[1:] != -100).sum())  # each token predicts the next label


def check_packed_run(out, rec, alone, attn):
    """packkit in effect in a packed ``swift sft`` run, and every step's loss the token-weighted mean of its samples'
    unpacked losses (``alone``: input ids -> (loss, label tokens), from the control run)."""
    assert rec["dataset"] == "PlannedPackingDataset" and rec["sampler"] == "PlannedBatchSamplerShard", rec
    assert rec["dtype"] == "torch.float64" and rec["attn"] == attn
    lines = start_lines(out)
    assert len(lines) == 1, out[-3000:]
    steps, ranks, balance, efficiency = lines[0]
    assert ranks == 1 and balance >= 1.0 and 0.5 < efficiency <= 1.0
    assert rec["max_steps"] == rec["batches"] == steps == len(rec["packed_idx"]) == len(rec["steps"])
    seen = []
    assert sorted(i for batch in rec["order"] for i in batch) == list(range(len(rec["packed_idx"])))
    for step, batch in zip(rec["steps"], rec["order"]):
        planned = rec["packed_idx"][batch[0]]  # the row the sampler dealt for this step (batch size 1)
        docs = documents(step)
        assert len(docs) == len(planned), "each step trains the planned row: its samples, one document each"
        weights = [alone[ids] for ids, _ in docs]  # KeyError: a document that is not a whole sample
        for (ids, labels), (_, n) in zip(docs, weights):
            assert label_tokens(labels) == n
        want = sum(loss * n for loss, n in weights) / sum(n for _, n in weights)
        assert math.isfinite(step["loss"])
        assert abs(step["loss"] - want) <= 1e-9 * abs(want), (step["loss"], want)
        seen += [ids for ids, _ in docs]
    assert sorted(seen) == sorted(alone), "every sample exactly once"


def test_swift_sft_packs_with_packkit_on_sdpa_and_packkit_varlen_exactly(assets):
    out, rec = sft(assets, "packkit", "--packing", "true", "--attn_impl", "sdpa")
    # packkit_varlen: ms-swift's text collator gives no cu_seq_lens; the attention reads the restarting position_ids.
    varlen_out, varlen = sft(assets, "varlen", "--packing", "true", "--attn_impl", "packkit_varlen")
    control_out, control = sft(assets, "control", "--attn_impl", "sdpa")  # no packing: one sample per step
    assert start_lines(control_out) == []

    # The control's loss of each sample, as swift sft computes it unpacked (fp64, lr 0: the same weights throughout).
    alone = {}
    for step in control["steps"]:
        ids = tuple(step["input_ids"][0].tolist())
        alone[ids] = (step["loss"], label_tokens(step["labels"][0]))
    assert len(alone) == len(control["steps"])
    check_packed_run(out, rec, alone, "sdpa")
    check_packed_run(varlen_out, varlen, alone, "packkit_varlen")
    assert "cu_seq_lens_q" not in varlen["keys"], "the boundaries came from position_ids, not from the collator"

    # Control: the first packed row with positions that run on across documents makes them attend to each other.
    from transformers import AutoModelForCausalLM

    from entry_fp64 import to_fp64

    model = AutoModelForCausalLM.from_pretrained(assets / "model", attn_implementation="sdpa")
    to_fp64(model)
    model.config.use_cache = False
    step = next(s for s in rec["steps"] if len(documents(s)) > 1)
    ids, labels = step["input_ids"], step["labels"]
    with torch.no_grad():
        exact = model(input_ids=ids, labels=labels, position_ids=step["position_ids"].reshape(1, -1)[:, -ids.shape[1]:],
                      use_cache=False).loss.item()
        leak = model(input_ids=ids, labels=labels, position_ids=torch.arange(ids.shape[1])[None],
                     use_cache=False).loss.item()
    assert abs(exact - step["loss"]) <= 1e-9 * abs(exact)
    assert abs(leak - exact) > 1e-6 * abs(exact)


# Qwen2.5-VL runs in CI; Qwen3-VL (seed 001's family; passes too) costs ~50 s of CPU more, so it runs on request:
# PACKKIT_SWIFT_VL="qwen2_5_vl qwen3_vl".
VL_FAMILIES = os.environ.get("PACKKIT_SWIFT_VL", "qwen2_5_vl").split()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_swift_sft_packs_qwen_vl_with_images_exactly(tmp_path, family):
    """Seed 001's setup on a tiny scale: ``swift sft --packing true`` on a Qwen2.5-VL / Qwen3-VL with PNG images,
    through the plugin (sdpa, fp64, lr 0), against the same command unpacked: packkit's dataset and sampler, the start
    line, steps = the plan's rows, each step's row the planned samples with their images (one image grid per
    document), and every step's loss the token-weighted mean of its samples' unpacked losses, vision tower included."""
    if family not in VL_FAMILIES:
        pytest.skip(f"{family}: not in PACKKIT_SWIFT_VL={' '.join(VL_FAMILIES)!r} (CI budget)")
    from entry_assets_vl import save_tiny_qwen_vl, write_vl_dataset

    vl_assets = tmp_path
    write_vl_dataset(vl_assets, n=12, seed=2)
    save_tiny_qwen_vl(vl_assets / "model", family)
    kw = dict(model_type=family, template=family, dataset="vl.jsonl", max_length=256)
    out, rec = sft(vl_assets, "vl-packkit", "--packing", "true", "--attn_impl", "sdpa", **kw)
    control_out, control = sft(vl_assets, "vl-control", "--attn_impl", "sdpa", **kw)
    assert start_lines(control_out) == []
    alone = {}
    for step in control["steps"]:
        assert step["image_grid_thw"].shape[0] == 1
        alone[tuple(step["input_ids"][0].tolist())] = (step["loss"], label_tokens(step["labels"][0]))
    assert len(alone) == len(control["steps"]) == 12
    check_packed_run(out, rec, alone, "sdpa")
    assert any(len(documents(step)) > 1 for step in rec["steps"]), "some row packs several samples"
    for step in rec["steps"]:  # each sample's image travelled with it: one grid per document, in row order
        docs = documents(step)
        assert step["image_grid_thw"].shape[0] == len(docs)
        image_tokens = [int((torch.tensor(ids) == 151655).sum()) for ids, _ in docs]
        assert image_tokens == (step["image_grid_thw"].prod(-1) // 4).tolist()


class _Args:
    def __init__(self, attn_impl, packing=True, padding_free=False):
        self.attn_impl, self.packing, self.padding_free = attn_impl, packing, padding_free


def _ms_swift_check(args):  # ms-swift 4.6's SftArguments._check_padding_free, as the plugin wraps it
    from swift.arguments.sft_args import SftArguments

    return SftArguments._check_padding_free(args)


@pytest.mark.parametrize("impl", ["sdpa", "eager", "packkit_varlen"])
def test_args_check_lets_position_masked_attention_through(impl):
    from packkit.integrations.swift.patch import check_padding_free_args

    args = _Args(impl)
    check_padding_free_args(args, _ms_swift_check)
    assert args.padding_free  # packing implies the padding-free collator, as in ms-swift
    args = _Args(impl, packing=False, padding_free=True)
    check_padding_free_args(args, _ms_swift_check)


@pytest.mark.parametrize("impl", [None, "flex_attention", "packkit_shared_prefix"])
def test_args_check_keeps_ms_swifts_refusal_elsewhere(impl):
    from packkit.integrations.swift.patch import check_padding_free_args

    with pytest.raises(ValueError, match="requires a flash attention implementation.*'sdpa', 'eager', "
                                         "'packkit_varlen'"):
        check_padding_free_args(_Args(impl), _ms_swift_check)
    check_padding_free_args(_Args(impl, packing=False), _ms_swift_check)  # neither feature: nothing to check


def test_train_start_check_refuses_what_would_leak():
    import types

    from packkit.integrations.swift.patch import check_exact_attention

    class WithPositions(torch.nn.Module):
        def forward(self, input_ids=None, position_ids=None):
            return input_ids

    class WithoutPositions(torch.nn.Module):
        def forward(self, input_ids=None):
            return input_ids

    def trainer(model_cls, impl, use_cache=False, padding_free=True):
        model = model_cls()
        model.config = types.SimpleNamespace(_attn_implementation=impl, use_cache=use_cache)
        template = types.SimpleNamespace(padding_free=padding_free, get_base_model=lambda m: m)
        return types.SimpleNamespace(model=model, template=template)

    for impl in ("sdpa", "eager", "packkit_varlen", "flash_attention_2"):
        check_exact_attention(trainer(WithPositions, impl))
    check_exact_attention(trainer(WithoutPositions, "flex_attention", padding_free=False))  # not packed: no check
    with pytest.raises(ValueError, match="flex_attention.*does not separate"):
        check_exact_attention(trainer(WithPositions, "flex_attention"))
    with pytest.raises(ValueError, match="takes no position_ids"):
        check_exact_attention(trainer(WithoutPositions, "sdpa"))
    with pytest.raises(ValueError, match="use_cache=True"):
        check_exact_attention(trainer(WithPositions, "eager", use_cache=True))


def test_qwen_vl_text_positions_go_back_in_front_of_the_mrope_rows():
    """ms-swift's trainer pops the Qwen-VL collator's ``text_position_ids``; without them sdpa / eager build no
    per-document mask (the Qwen2.5-VL run above then differs from its control by ~5e-5 relative). The plugin puts
    them back as row 0 of ``[4, 1, T]``, only for padding-free batches on sdpa / eager / packkit_varlen."""
    import types

    from packkit.integrations.swift.patch import with_text_positions

    text, mrope = torch.tensor([[0, 1, 2, 0, 1]]), torch.arange(15).reshape(3, 1, 5)

    def hooked(impl, padding_free=True):
        model = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation=impl))
        return with_text_positions(types.SimpleNamespace(padding_free=padding_free), model,
                                   {"text_position_ids": text, "position_ids": mrope, "labels": 1})

    for impl in ("sdpa", "eager", "packkit_varlen"):
        out = hooked(impl)
        assert out["position_ids"].shape == (4, 1, 5) and out["labels"] == 1
        assert torch.equal(out["position_ids"][0], text) and torch.equal(out["position_ids"][1:], mrope)
    for out in (hooked("flash_attention_2"), hooked("sdpa", padding_free=False)):
        assert out["position_ids"] is mrope
