"""torchtitan's own entry point with packkit's ``PackkitDataLoader`` wired in as docs/torchtitan.md says:
``torchrun --nproc_per_node 2 -m torchtitan.train --module torchtitan_entry_config --config packkit_tiny`` (2 gloo
ranks; tests/torchtitan_entry_config.py) on a tiny torchtitan Llama 3 (2 layers, dim 64), a byte-level BPE tokenizer
trained in the test and a local ``save_to_disk`` dataset (no hub); the control, ``python -m torchtitan.train ...
--config torchtitan_tiny``, is torchtitan's own text dataloader on the same documents, 1 rank with the same global
batch.

torchtitan 0.3.0 has no CPU device: tests/torchtitan_cpu_shims.py (loaded in the trainer processes only, through
tests/entry_site/sitecustomize.py) replaces its GPU-only pieces, none on the data path. A probe
(tests/entry_probe_torchtitan.py) records the dataloader class torchtitan's Trainer built and every micro-batch
that reached the model. Asserted: packkit's loader class on each rank; every step of each rank is exactly that
rank's rows of the step packkit's stream plans for these documents (whole documents, positions restarting per
document, steps balanced), where the control's batches cut documents at row ends; packkit's start line in
torchtitan's log, once, with that stream's figures; the loss finite, falling, and close to the control's.
Cost: ~52 s of CPU on the 2-core machine (each trainer process ~12 s, nearly all torchtitan's imports).
"""
from __future__ import annotations

import json
import math
import re
import sys
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

from packkit import transformer_cost  # noqa: E402
from packkit.integrations.torchtitan import BalancedDocumentStream  # noqa: E402

pytestmark = pytest.mark.full

SEQ_LEN, BATCH, STEPS, VOCAB = 128, 2, 8, 320  # as tests/torchtitan_entry_config.py
IGNORE = -100
LOSS = re.compile(r"step:\s+(\d+)\s+loss:\s+(\S+)")
START = re.compile(r"^\[titan\] .* - packkit\.integrations\.torchtitan\.stream - INFO - (packkit: first buffer (\d+) "
                   r"steps on (\d+) ranks, balance ([0-9.]+), efficiency ([0-9.]+); streaming, steps per epoch "
                   r"unknown up front)$", re.M)


def _tokenizer_files(texts: list[str], path: Path) -> None:
    """A byte-level BPE trained on the texts (``tokenizers``, offline) as torchtitan's HuggingFaceTokenizer reads
    it: ``tokenizer.json`` + ``tokenizer_config.json`` naming BOS and EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """``assets/`` (tokenizer), ``data/`` (400 alpaca-style documents of at most SEQ_LEN + 1 tokens, so every
    document fits a row whole) and the tokenizer as torchtitan builds it."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    root = tmp_path_factory.mktemp("tt-entry")
    texts = [" ".join(v for v in s.values() if v) for s in alpaca_samples(520, seed=3)]
    _tokenizer_files(texts, root / "assets")
    tokenizer = HuggingFaceTokenizer.Config().build(tokenizer_path=str(root / "assets"))
    texts = [t for t in texts if len(tokenizer.encode(t, add_bos=True, add_eos=True)) <= SEQ_LEN + 1][:400]
    assert len(texts) == 400 and tokenizer.get_vocab_size() <= VOCAB
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(root / "data"))
    return root, texts, tokenizer


def train(root: Path, config: str, ranks: int, *args: str) -> tuple[str, list[dict]]:
    """``torchrun --nproc_per_node <ranks> -m torchtitan.train`` (``python -m torch.distributed.run``, what the
    ``torchrun`` script runs) for 2 ranks, ``python -m torchtitan.train`` in the environment torchrun gives 1 rank;
    its output and each rank's probe."""
    probe = root / f"probe-{config}.json"
    titan = ["-m", "torchtitan.train", "--module", "torchtitan_entry_config", "--config", config, *args]
    for attempt in range(3):  # the free port can be taken between probing and binding
        port = str(free_port())
        env = {"PYTHONPATH": str(HERE / "entry_site"), "PACKKIT_TT_PROBE": str(probe), "PACKKIT_TT_ROOT": str(root)}
        if sys.platform.startswith("linux"):
            env["GLOO_SOCKET_IFNAME"] = "lo"  # containers without a resolvable hostname
        if ranks == 1:
            cmd = [PYTHON, *titan]
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port)
        else:
            cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr",
                   "127.0.0.1", "--master_port", port, *titan]
        try:
            out = run(cmd, cwd=root, env=env, timeout=900)
            break
        except AssertionError as exc:
            if attempt == 2 or "address already in use" not in str(exc).lower():
                raise
    return out, [json.loads(Path(f"{probe}.rank{r}").read_text()) for r in range(ranks)]


def losses(output: str, ranks: int) -> list[float]:
    """The loss torchtitan logs at each step (every rank logs the same global loss)."""
    found = {}
    for step, loss in LOSS.findall(output):
        found.setdefault(int(step), []).append(float(loss))
    assert sorted(found) == list(range(1, STEPS + 1)), output[-3000:]
    assert all(len(v) == ranks and len(set(v)) == 1 for v in found.values()), found
    return [found[s][0] for s in sorted(found)]


def documents(batch: dict) -> list[tuple]:
    """The documents of a batch as torchtitan's masks read them (a document starts where positions are 0): inputs
    plus the last label; the padding run (labels all ignored) is skipped."""
    docs = []
    for ids, pos, labels in zip(batch["input"], batch["positions"], batch["labels"]):
        starts = [k for k, p in enumerate(pos) if p == 0] + [len(pos)]
        for a, b in zip(starts[:-1], starts[1:]):
            if any(x != IGNORE for x in labels[a:b]):
                docs.append(tuple(ids[a:b] + [labels[b - 1]]))
    return docs


def test_torchtitan_train_entry_runs_packkits_loader_on_two_ranks(assets):
    root, texts, tokenizer = assets
    # torch 2.13's fully_shard refuses torchtitan 0.3.0's default spmd_types parameters when dp_shard > 1.
    out, recs = train(root, "packkit_tiny", 2, "--parallelism.spmd_backend", "partial_dtensor")
    # The control: torchtitan's own loader on the same documents, 1 rank with the same global batch (4 rows).
    control_out, (control,) = train(root, "torchtitan_tiny", 1, "--training.local_batch_size", str(2 * BATCH))

    # The loader torchtitan's Trainer built and ran on each rank, and the steps it ran.
    assert [r["loader"] for r in recs] == ["packkit.integrations.torchtitan.loader.PackkitDataLoader"] * 2
    assert control["loader"] == "torchtitan.hf_datasets.text_datasets.HuggingFaceTextDataLoader"
    assert [r["steps"] for r in recs] == [len(r["batches"]) for r in recs] == [STEPS, STEPS] == [control["steps"]] * 2

    # Every step of every rank is that rank's rows of the step packkit's stream plans for these documents under
    # the model's cost (torchtitan_cost of the config's model: 2 layers, dim 64, 4 heads of 16, FFN 256, vocab 320).
    cost = transformer_cost(hidden_size=64, num_layers=2, vocab_size=VOCAB, num_heads=4, num_kv_heads=4,
                            head_dim=16, intermediate_size=256)
    source = datasets.load_from_disk(str(root / "data"))
    streams = [BalancedDocumentStream(source, seq_len=SEQ_LEN, local_batch_size=BATCH, dp_rank=r, dp_world_size=2,
                                      tokenizer=tokenizer, cost=cost, infinite=True) for r in range(2)]
    for rank, (rec, stream) in enumerate(zip(recs, streams)):
        it = iter(stream)
        for step, got in enumerate(rec["batches"]):
            inputs, labels = next(it)
            assert got == {"input": inputs["input"].tolist(), "positions": inputs["positions"].tolist(),
                           "labels": labels.tolist()}, f"rank {rank} step {step + 1}"
    # ... rows of whole documents; torchtitan's own loader cuts documents at row ends (the control fails it).
    whole = {tuple(tokenizer.encode(t, add_bos=True, add_eos=True)) for t in texts}
    ours = [d for rec in recs for b in rec["batches"] for d in documents(b)]
    assert len(ours) > 4 * STEPS * BATCH and all(d in whole for d in ours)
    assert any(d not in whole for b in control["batches"] for d in documents(b))
    # ... and balanced: each step's costliest rank against the step's mean, over the steps run.
    a, b = cost
    step_costs = [[sum(a * (len(d) - 1) + b * (len(d) - 1) ** 2 for d in documents(rec["batches"][s])) for rec in recs]
                  for s in range(STEPS)]
    assert sum(max(c) for c in step_costs) / sum(sum(c) / 2 for c in step_costs) < 1.05, step_costs

    # The start line, once (dp rank 0), in torchtitan's log (its root-logger format), with the stream's figures.
    lines = START.findall(out)
    assert len(lines) == 1, out[-3000:]
    line, n, ranks, balance, efficiency = lines[0]
    fb = streams[0].first_buffer
    assert fb == streams[1].first_buffer == recs[0]["first_buffer"] == recs[1]["first_buffer"]
    assert line == (f"packkit: first buffer {fb['steps']} steps on 2 ranks, balance {fb['balance']:.5f}, "
                    f"efficiency {fb['efficiency']:.4f}; streaming, steps per epoch unknown up front")
    assert int(n) > STEPS and 1.0 <= float(balance) < 1.01 and 0.8 < float(efficiency) <= 1.0
    assert START.findall(control_out) == []

    # The loss: finite, falling, and close to the control's (same model, seed, documents and global batch).
    ours, theirs = losses(out, 2), losses(control_out, 1)
    assert all(math.isfinite(x) for x in ours + theirs)
    assert sum(ours[-3:]) / 3 < ours[0] - 0.2 and sum(theirs[-3:]) / 3 < theirs[0] - 0.2, (ours, theirs)
    assert abs(sum(ours) / STEPS - sum(theirs) / STEPS) <= 0.05 * sum(theirs) / STEPS, (ours, theirs)
