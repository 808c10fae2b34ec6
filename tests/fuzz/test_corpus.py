"""Replays every committed fuzz input (tests/fuzz/corpus/TARGET/*) through its target: seeds and every
crash the fuzzer ever found stay fixed. Runs in the normal suite and under the sanitizers."""
from __future__ import annotations

from pathlib import Path

import pytest

from targets import TARGETS

pytestmark = pytest.mark.core

CORPUS = Path(__file__).parent / "corpus"
CASES = sorted((t, p) for t in TARGETS for p in (CORPUS / t).glob("*"))


def test_every_target_has_a_seed_corpus():
    assert set(TARGETS) == {p.name for p in CORPUS.iterdir() if p.is_dir()}
    for target in TARGETS:
        assert any((CORPUS / target).iterdir()), target


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_corpus_replays(target):
    files = sorted((CORPUS / target).glob("*"))
    for path in files:
        TARGETS[target](path.read_bytes())  # raises on a property violation; crashes kill the run
