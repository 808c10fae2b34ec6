"""torchtitan's own entry point, ``python -m torchtitan.train --module torchtitan_entry_config --config
packkit_tiny``, with packkit's ``PackkitDataLoader`` wired in as docs/torchtitan.md says (tests/
torchtitan_entry_config.py), on a tiny torchtitan Llama 3 (2 layers, dim 64), a byte-level BPE tokenizer trained in
the test and a local ``save_to_disk`` dataset (no hub), 1 rank on CPU; and ``--config torchtitan_tiny``
(torchtitan's own text dataloader on the same documents) as the control.

torchtitan 0.3.0 has no CPU device: tests/torchtitan_cpu_shims.py (loaded in the child only, through
tests/entry_site/sitecustomize.py) replaces its GPU-only pieces, none on the data path. A probe
(tests/entry_probe_torchtitan.py) records the dataloader class torchtitan's Trainer built and every micro-batch
that reached the model. Asserted: packkit's loader class; every step's batch is exactly the step packkit's stream
plans for these documents (rows of whole documents, positions restarting per document), where the control's
batches cut documents at row ends; packkit's start line in torchtitan's log, once, with that stream's figures; the
loss finite, falling, and close to the control's.
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


def train(root: Path, config: str) -> tuple[str, dict]:
    """``python -m torchtitan.train`` on 1 rank (the environment torchrun gives it); its output and the probe."""
    probe = root / f"probe-{config}.json"
    cmd = [PYTHON, "-m", "torchtitan.train", "--module", "torchtitan_entry_config", "--config", config]
    for attempt in range(3):  # the free port can be taken between probing and binding
        env = {"PYTHONPATH": str(HERE / "entry_site"), "PACKKIT_TT_PROBE": str(probe), "PACKKIT_TT_ROOT": str(root),
               "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo"}
        try:
            out = run(cmd, cwd=root, env=env, timeout=900)
            break
        except AssertionError as exc:
            if attempt == 2 or "Address already in use" not in str(exc):
                raise
    return out, json.loads(Path(f"{probe}.rank0").read_text())


def losses(output: str) -> list[float]:
    found = [(int(s), float(x)) for s, x in LOSS.findall(output)]
    assert [s for s, _ in found] == list(range(1, STEPS + 1)), output[-3000:]
    return [x for _, x in found]


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


def test_torchtitan_train_entry_runs_packkits_loader(assets):
    root, texts, tokenizer = assets
    out, rec = train(root, "packkit_tiny")
    control_out, control = train(root, "torchtitan_tiny")

    # The loader torchtitan's Trainer built and ran, and the steps it ran.
    assert rec["loader"] == "packkit.integrations.torchtitan.loader.PackkitDataLoader"
    assert control["loader"] == "torchtitan.hf_datasets.text_datasets.HuggingFaceTextDataLoader"
    assert rec["steps"] == control["steps"] == STEPS == len(rec["batches"]) == len(control["batches"])

    # Every step is the step packkit's stream plans for these documents, under the model's cost
    # (torchtitan_cost of the config's model: 2 layers, dim 64, 4 heads of 16, FFN 256, vocab 320).
    cost = transformer_cost(hidden_size=64, num_layers=2, vocab_size=VOCAB, num_heads=4, num_kv_heads=4,
                            head_dim=16, intermediate_size=256)
    stream = BalancedDocumentStream(datasets.load_from_disk(str(root / "data")), seq_len=SEQ_LEN,
                                    local_batch_size=BATCH, tokenizer=tokenizer, cost=cost, infinite=True)
    it = iter(stream)
    for step, got in enumerate(rec["batches"]):
        inputs, labels = next(it)
        assert got == {"input": inputs["input"].tolist(), "positions": inputs["positions"].tolist(),
                       "labels": labels.tolist()}, f"step {step + 1}"
    # ... rows of whole documents; torchtitan's own loader cuts documents at row ends (the control fails it).
    whole = {tuple(tokenizer.encode(t, add_bos=True, add_eos=True)) for t in texts}
    ours = [d for b in rec["batches"] for d in documents(b)]
    assert len(ours) > 2 * STEPS * BATCH and all(d in whole for d in ours)
    assert any(d not in whole for b in control["batches"] for d in documents(b))

    # The start line, once, in torchtitan's log (its root-logger format), with the stream's first-buffer figures.
    lines = START.findall(out)
    assert len(lines) == 1, out[-3000:]
    line, n, ranks, balance, efficiency = lines[0]
    fb = stream.first_buffer
    assert (int(n), int(ranks)) == (fb["steps"], 1) and n == str(rec["first_buffer"]["steps"])
    assert line == (f"packkit: first buffer {fb['steps']} steps on 1 ranks, balance {fb['balance']:.5f}, "
                    f"efficiency {fb['efficiency']:.4f}; streaming, steps per epoch unknown up front")
    assert int(n) > STEPS and float(balance) == 1.0 and 0.8 < float(efficiency) <= 1.0
    assert START.findall(control_out) == []

    # The loss: finite, falling, and close to the control's (same model, seed and documents; other rows).
    ours, theirs = losses(out), losses(control_out)
    assert all(math.isfinite(x) for x in ours + theirs)
    assert sum(ours[-3:]) / 3 < ours[0] - 0.2 and sum(theirs[-3:]) / 3 < theirs[0] - 0.2
    assert abs(sum(ours) / STEPS - sum(theirs) / STEPS) <= 0.05 * sum(theirs) / STEPS, (ours, theirs)
