"""Issue 46: ``BalancedDocumentStream(..., infinite=True)`` never hangs on a pass that yields nothing, and refuses a
state whose ``buffer_start`` lies past the source (instead of a silent empty epoch).

Each case runs in a daemon thread under a timeout: a hang fails the test instead of stalling the suite."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from packkit.integrations.torchtitan import BalancedDocumentStream

pytestmark = pytest.mark.full

TIMEOUT_S = 60  # generous for a loaded 2-core machine; each case takes milliseconds when it does not hang


def _outcome(stream, steps: int = 10**9):
    """('error', exc) / ('ended', n) / ('hung', None): ``steps`` batches of ``stream`` at most, in a thread."""
    result = {}

    def run():
        try:
            n = 0
            for _ in stream:
                n += 1
                if n >= steps:
                    break
            result["value"] = ("ended", n)
        except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
            result["value"] = ("error", exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    return result.get("value", ("hung", None))


def _stream(source, **kw):
    return BalancedDocumentStream(source, seq_len=16, local_batch_size=1, infinite=True, **kw)


def _one_shot():
    return (np.arange(1, n + 1) for n in (5, 9, 3, 12))


@pytest.mark.parametrize("case", ["empty", "one-token documents", "zero-token documents"])
def test_a_pass_with_nothing_to_yield_raises_instead_of_looping(case):
    source = {"empty": [], "one-token documents": [[7]] * 50, "zero-token documents": [[]] * 5}[case]
    kind, value = _outcome(_stream(source))
    assert kind == "error", (kind, value)
    assert isinstance(value, ValueError) and "yielded no step" in str(value) and "loop forever" in str(value)


def test_a_one_shot_generator_serves_one_pass_then_raises_naming_it():
    kind, value = _outcome(_stream(_one_shot()))
    assert kind == "error", (kind, value)
    assert "one-shot iterator" in str(value) and "callable returning a fresh iterable" in str(value)
    # A callable returning a fresh generator loops forever, as infinite=True asks.
    kind, value = _outcome(_stream(_one_shot), steps=50)
    assert (kind, value) == ("ended", 50)


def test_control_the_finite_stream_ends_and_an_infinite_one_keeps_going():
    docs = [np.arange(1, n + 1) for n in (5, 9, 3, 12, 16)]
    assert _outcome(BalancedDocumentStream(docs, seq_len=16, local_batch_size=1)) [0] == "ended"
    assert _outcome(_stream([]))[0] == "error"
    assert _outcome(BalancedDocumentStream([], seq_len=16, local_batch_size=1)) == ("ended", 0)  # finite: just ends
    assert _outcome(_stream(docs), steps=100) == ("ended", 100)


def test_a_resumed_pass_ending_empty_goes_on_to_the_next_pass():
    docs = [np.arange(1, n + 1) for n in (5, 9, 3, 12, 16, 7, 2, 11)]
    first = BalancedDocumentStream(docs, seq_len=16, local_batch_size=1, buffer_size=2)
    n_steps = sum(1 for _ in first)
    stream = BalancedDocumentStream(docs, seq_len=16, local_batch_size=1, buffer_size=2)
    it = iter(stream)
    for _ in range(n_steps):  # every step of the pass: the state is at the end of its last buffer
        next(it)
    state = stream.state_dict()
    resumed = _stream(docs, buffer_size=2)
    resumed.load_state_dict(state)
    assert _outcome(resumed, steps=n_steps + 3) == ("ended", n_steps + 3)


@pytest.mark.parametrize("indexable", [True, False])
def test_buffer_start_past_the_source_is_refused(indexable):
    docs = [np.arange(1, n + 1) for n in (5, 9, 3, 12)]
    stream = BalancedDocumentStream(docs, seq_len=16, local_batch_size=1)
    state = stream.state_dict()
    state["buffer_start"] = 10**9
    source = docs if indexable else (lambda: iter(docs))
    target = BalancedDocumentStream(source, seq_len=16, local_batch_size=1)
    if indexable:  # known at load time
        with pytest.raises(ValueError, match=r"buffer_start'\] is 1000000000 but the source has 4 documents"):
            target.load_state_dict(state)
        return
    target.load_state_dict(state)  # an iterable's length is known only once read
    kind, value = _outcome(target)
    assert kind == "error" and "buffer_start is 1000000000 but the source ended after 4 documents" in str(value)
    # The end of the source itself is a valid place to resume: the pass then ends (not an error).
    state["buffer_start"] = 4
    target = BalancedDocumentStream(source, seq_len=16, local_batch_size=1)
    target.load_state_dict(state)
    assert _outcome(target) == ("ended", 0)
