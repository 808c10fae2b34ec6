"""torchtitan's own pipeline-parallel path fed by packkit's loader, through torchtitan's own entry point on the CPU
(issue 61 part 4): ``torchrun --nproc_per_node 2 -m torchtitan.train --module torchtitan_pp_entry_config --config
packkit_pp_tiny`` (tests/torchtitan_pp_entry_config.py): 2 gloo processes = 2 pipeline stages, torchtitan's
``parallelism.pipeline_parallel_degree=2`` with its ``1F1B`` schedule and ``Interleaved1F1B`` (2 virtual stages per
process), 4 micro-batches of 1 packed row per step, the tiny torchtitan Llama 3 of tests/test_torchtitan_entry.py
with varlen attention (the per-micro-batch ``cu_seq_q`` is what the attention reads).

torchtitan 0.3.0 under PP builds the loader with the micro-batch size and fetches one loader batch per micro-batch
(``Trainer.train_step``), so each micro-batch is one of packkit's batches and its positions / ``cu_seq_q`` are its
own. tests/torchtitan_cpu_shims.py adds two shims for this path: 8 (torch 2.13.0's ``schedule.step`` lacks the
``arg_mbs=`` / ``kwarg_mbs=`` / ``target_mbs=`` form torchtitan 0.3.0 calls; routed to torch's own
``_step_microbatches``) and 9 (varlen attention has no CPU kernel; per-document SDPA over the same offsets).

Asserted: torchtitan's Trainer ran packkit's ``PackkitTrainer`` and ``PackkitDataLoader`` and torch's schedule class
on both stages; every micro-batch that reached the first stage is exactly one of the batches packkit's stream plans
(positions restarting per document, the ``cu_seq_q`` the stage got running from 0 to that micro-batch's tokens with
a document start at every offset, accepted by packkit's guard); every document of each step reached the model exactly
once across its micro-batches; the loss finite, falling, and equal to the non-PP run (pp=1 on 1 process, gradient
accumulation over the same 4 micro-batches, same seed checkpoint) within ``steps x micro-batches x eps_fp32``; the
control: a trainer handing each micro-batch its dim-0 chunk of one batch-wide ``cu_seq_q`` (the torchtitan PR 4098
form) is refused by name on the first stage, and its peer exits (no hang). Cost: ~2 min on the 2-core machine.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torchtitan.components.tokenizer",
                    reason="torchtitan is not installed (README's test command installs 0.3.0)")
pytest.importorskip("tyro", reason="torchtitan's config parser tyro is not installed")
pytest.importorskip("typeguard", reason="tyro (torchtitan's config parser) needs typeguard: pip install --no-deps "
                                         "typeguard==4.6.0 beside tyro")
datasets = pytest.importorskip("datasets")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from dist_helpers import free_port  # noqa: E402
from entry_assets import PYTHON, alpaca_samples, run  # noqa: E402
from test_torchtitan_entry import _tokenizer_files  # noqa: E402

import torch  # noqa: E402

from packkit import transformer_cost  # noqa: E402
from packkit.integrations.torchtitan import BalancedDocumentStream  # noqa: E402
from packkit.training.pipeline import check_microbatch  # noqa: E402

pytestmark = pytest.mark.full

SEQ_LEN, VOCAB, MICROBATCHES, STEPS = 128, 320, 4, 6  # as tests/torchtitan_pp_entry_config.py
IGNORE = -100
EPS32 = float(torch.finfo(torch.float32).eps)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """The tokenizer and 400 documents of tests/test_torchtitan_entry.py (every document fits a row whole)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    root = tmp_path_factory.mktemp("tt-pp-entry")
    texts = [" ".join(v for v in s.values() if v) for s in alpaca_samples(520, seed=3)]
    _tokenizer_files(texts, root / "assets")
    tokenizer = HuggingFaceTokenizer.Config().build(tokenizer_path=str(root / "assets"))
    texts = [t for t in texts if len(tokenizer.encode(t, add_bos=True, add_eos=True)) <= SEQ_LEN + 1][:400]
    assert len(texts) == 400 and tokenizer.get_vocab_size() <= VOCAB
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(root / "data"))
    return root, texts, tokenizer


def train(root: Path, name: str, config: str, ranks: int, *args: str, check: bool = True):
    """``torchrun --nproc_per_node <ranks> -m torchtitan.train`` (``python -m torch.distributed.run``) for 2
    ranks, ``python -m torchtitan.train`` in torchrun's environment for 1; (exit code, output, each rank's probe).
    With ``check`` a non-zero exit raises (with the output's tail)."""
    probe = root / f"probe-{name}.json"
    titan = ["-m", "torchtitan.train", "--module", "torchtitan_pp_entry_config", "--config", config,
             "--dump_folder", str(root / f"out-{name}"), *args]
    for attempt in range(3):  # the free port can be taken between probing and binding
        port = str(free_port())
        env = {"PYTHONPATH": str(HERE / "entry_site"), "PACKKIT_TT_PROBE": str(probe), "PACKKIT_TT_ROOT": str(root),
               "PACKKIT_TT_STAGE_PROBE": "1"}
        if sys.platform.startswith("linux"):
            env["GLOO_SOCKET_IFNAME"] = "lo"  # containers without a resolvable hostname
        if ranks == 1:
            cmd = [PYTHON, *titan]
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port)
        else:
            cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr",
                   "127.0.0.1", "--master_port", port, *titan]
        if check:
            try:
                out, code = run(cmd, cwd=root, env=env, timeout=600), 0
            except AssertionError as exc:  # entry_assets.run: a non-zero exit, with the output's tail
                out, code = str(exc), 1
        else:  # the whole output (the refusal is far from its end)
            proc = subprocess.run(cmd, cwd=root, env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                                                      "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
            out, code = proc.stdout, proc.returncode
        if code and "address already in use" in out.lower() and attempt < 2:
            continue
        if code and check:
            raise AssertionError(out)
        break
    recs = [json.loads(Path(f"{probe}.rank{r}").read_text()) for r in range(ranks)
            if Path(f"{probe}.rank{r}").exists()]
    return code, out, recs


def documents(input_ids, positions, labels) -> list[tuple]:
    """A micro-batch's documents (a document starts where positions are 0): inputs plus the last label; the
    padding run (labels all ignored) is skipped."""
    docs = []
    for ids, pos, lab in zip(input_ids, positions, labels):
        starts = [k for k, p in enumerate(pos) if p == 0] + [len(pos)]
        for a, b in zip(starts[:-1], starts[1:]):
            if any(x != IGNORE for x in lab[a:b]):
                docs.append(tuple(ids[a:b] + [lab[b - 1]]))
    return docs


def test_torchtitans_pipeline_path_runs_packkits_microbatches_exactly(assets):
    """One test, not one per schedule: under pytest-xdist the tests of a module may land on two workers, and the
    runs (a seed checkpoint, two pipelined runs, the pp=1 run: ~2 min) would be made twice."""
    root = assets[0]
    # One seed checkpoint (torchtitan's own way to start PP and non-PP runs from the same weights: under PP each
    # stage draws its initial weights with its own seed, distinct_seed_mesh_dims=["pp"]).
    train(root, "seed", "packkit_pp_tiny", 1, "--parallelism.pipeline_parallel_degree", "1",
          "--checkpoint.enable", "--checkpoint.create_seed_checkpoint", "--checkpoint.folder", "seed")
    seed = ["--checkpoint.enable", "--checkpoint.initial_load_path", str(root / "out-seed" / "seed" / "step-0"),
            "--checkpoint.load_only"]
    runs = {
        "1f1b": train(root, "1f1b", "packkit_pp_tiny", 2, *seed),
        "interleaved": train(root, "interleaved", "packkit_pp_tiny", 2, *seed,
                             "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"),
        # pp=1, 1 process, the same global batch as gradient accumulation over the same 4 one-row micro-batches
        "no_pp": train(root, "no-pp", "packkit_pp_tiny", 1, *seed, "--parallelism.pipeline_parallel_degree", "1",
                       "--training.local_batch_size", "1", "--training.global_batch_size", str(MICROBATCHES)),
    }
    for schedule in ("1f1b", "interleaved"):
        check_pipelined_run(schedule, runs[schedule], assets)
    check_loss_equals_the_non_pipelined_run(runs)


def check_pipelined_run(schedule, result, assets):
    root, texts, tokenizer = assets
    code, out, recs = result
    assert code == 0 and len(recs) == 2
    cls, stages = {"1f1b": ("Schedule1F1B", [[0], [1]]), "interleaved": ("ScheduleInterleaved1F1B", [[0, 2], [1, 3]])}[
        schedule]
    # torchtitan built its own schedule over its own stages, with packkit's trainer and loader, on both processes
    assert [r["schedule"] for r in recs] == [cls, cls] and [r["stage_indices"] for r in recs] == stages
    assert [r["num_stages"] for r in recs] == [len(stages[0]) * 2] * 2
    assert [r["n_microbatches"] for r in recs] == [MICROBATCHES] * 2
    assert [r["trainer"] for r in recs] == ["PackkitTrainer"] * 2
    assert [r["loader"] for r in recs] == ["packkit.integrations.torchtitan.loader.PackkitDataLoader"] * 2
    assert [r["steps"] for r in recs] == [STEPS, STEPS]
    # every stage ran every micro-batch of every step (plus the schedule's one shape-inference forward)
    for rank, rec in enumerate(recs):
        per_stage = Counter(c["stage"] for c in rec["stage_calls"])
        assert per_stage == {s: STEPS * MICROBATCHES + 1 for s in stages[rank]}, per_stage

    # Each micro-batch is one batch of packkit's stream: torchtitan asks the loader for micro-batch-size batches
    # (1 row), dp world 1 (both processes are pipeline stages), under the model's cost.
    cost = transformer_cost(hidden_size=64, num_layers=2, vocab_size=VOCAB, num_heads=4, num_kv_heads=4,
                            head_dim=16, intermediate_size=256)
    stream = iter(BalancedDocumentStream(datasets.load_from_disk(str(root / "data")), seq_len=SEQ_LEN,
                                         local_batch_size=1, dp_rank=0, dp_world_size=1, tokenizer=tokenizer,
                                         cost=cost, infinite=True))
    planned = [next(stream) for _ in range(STEPS * MICROBATCHES)]
    for rec in recs:  # both processes fetched the same batches (each builds the kwargs of every stage)
        assert len(rec["batches"]) == STEPS * MICROBATCHES
        for got, (inputs, labels) in zip(rec["batches"], planned):
            assert got == {"input": inputs["input"].tolist(), "positions": inputs["positions"].tolist(),
                           "labels": labels.tolist()}
    first = [c for c in recs[0]["stage_calls"] if c["stage"] == 0]
    assert first[0]["input"] == first[1]["input"]  # the shape-inference forward is micro-batch 0 of step 1
    whole = Counter(tuple(tokenizer.encode(t, add_bos=True, add_eos=True)) for t in texts)
    for step in range(STEPS):
        calls = first[1 + step * MICROBATCHES: 1 + (step + 1) * MICROBATCHES]
        batches = recs[0]["batches"][step * MICROBATCHES:(step + 1) * MICROBATCHES]
        reached = []
        for call, batch in zip(calls, batches):
            # the micro-batch that reached the first stage is that loader batch, with its own metadata
            assert call["input"] == batch["input"] and call["positions"] == batch["positions"]
            assert call["shape"] == [1, SEQ_LEN]
            pos = call["positions"][0]
            starts = [k for k, p in enumerate(pos) if p == 0]
            assert starts[0] == 0 and all(pos[k] == pos[k - 1] + 1 for k in range(1, SEQ_LEN) if k not in starts)
            assert call["given_cu_seq_q"] == call["cu_seq_q"] == starts + [SEQ_LEN]  # 0 .. its own tokens
            check_microbatch(torch.tensor(call["given_cu_seq_q"]), SEQ_LEN, torch.tensor(pos))
            reached += documents(batch["input"], batch["positions"], batch["labels"])
        # every document of the step reached the model exactly once across the step's micro-batches, whole
        expected = [d for inputs, labels in planned[step * MICROBATCHES:(step + 1) * MICROBATCHES]
                    for d in documents(inputs["input"].tolist(), inputs["positions"].tolist(), labels.tolist())]
        assert Counter(reached) == Counter(expected) and len(reached) >= MICROBATCHES
        assert all(whole[d] >= n for d, n in Counter(reached).items())
    # no document in two steps either (the stream's order, no repeats within an epoch)
    seen = Counter(d for b in recs[0]["batches"] for d in documents(b["input"], b["positions"], b["labels"]))
    assert all(whole[d] >= n for d, n in seen.items())


def check_loss_equals_the_non_pipelined_run(runs):
    """The loss the last stage logs equals the pp=1 run's step by step. The two runs do the same fp32 operations on
    the same micro-batches (1 row each) from the same seed checkpoint; what may differ is reduction order: the sum
    of the micro-batches' losses (stacked under PP, accumulated without) and the gradient norm over 2 stages (one
    all-reduce) for clipping. The tolerance is one fp32 rounding per micro-batch per step, compounding over the
    steps: STEPS x MICROBATCHES x eps_fp32 relative (2.9e-6). Measured: 0 (bitwise equal) on the 2-core VM."""
    ref = [loss for _, loss in runs["no_pp"][2][0]["losses"]]
    assert len(ref) == STEPS and all(math.isfinite(x) for x in ref)
    assert sum(ref[-2:]) / 2 < ref[0] - 0.2, ref  # falling
    tol = STEPS * MICROBATCHES * EPS32
    for schedule in ("1f1b", "interleaved"):
        recs = runs[schedule][2]
        # the loss is known on the last stage's process only (torchtitan logs -1 on the others)
        assert [loss for _, loss in recs[0]["losses"]] == [-1.0] * STEPS
        ours = [loss for _, loss in recs[1]["losses"]]
        assert [s for s, _ in recs[1]["losses"]] == list(range(1, STEPS + 1))
        worst = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
        assert worst <= tol, (schedule, ours, ref)


def test_the_batch_wide_form_is_refused_by_name(assets):
    """The torchtitan PR 4098 form through this path: one ``cu_seq_q`` for the local batch, each micro-batch handed
    its dim-0 chunk (``BatchWideTrainer``). Micro-batch 0's chunk may happen to be right; micro-batch 1's starts
    inside another micro-batch's tokens, and packkit's stage check refuses it before attention reads it."""
    root, _, _ = assets
    code, out, recs = train(root, "batch-wide", "packkit_pp_batch_wide", 2, check=False)
    assert code != 0 and recs == [] and "timed out" not in out.lower()
    refusals = [line for line in out.splitlines() if line.startswith("[rank0]: ValueError: attention_masks.cu_seq_q")]
    assert refusals, out[-4000:]
    assert "not 0: a slice of a batch-wide cu_seqlens" in refusals[0] or "not at this micro-batch" in refusals[0]
    assert "4098" in refusals[0]
    assert "Connection closed by peer" in out  # the other stage exits on the closed connection: no hang
