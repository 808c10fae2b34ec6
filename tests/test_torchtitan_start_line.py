"""The streaming torchtitan loader's start line: ``BalancedDocumentStream`` cannot know an epoch's step count up
front, so dp rank 0 logs once, for the first buffer it plans, ``packkit: first buffer N steps on R ranks, balance B,
efficiency E; streaming, steps per epoch unknown up front``. Checked against figures recomputed from what every
rank yields (not from the planner); once per process across buffers and passes; rank 0 only. (That torchtitan's
log shows it: tests/test_torchtitan_entry.py.)"""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from packkit.integrations.start_line import start_line, stream_start_line
from packkit.integrations.torchtitan import BalancedDocumentStream

pytestmark = pytest.mark.full

LOGGER = "packkit.integrations.torchtitan.stream"
LINE = re.compile(r"^packkit: first buffer (\d+) steps on (\d+) ranks, balance ([0-9.]+), efficiency ([0-9.]+); "
                  r"streaming, steps per epoch unknown up front$")
IGNORE = -100


def docs(n, seed=0, seq_len=96):
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(3.0, 0.9, n), 2, seq_len + 1).astype(int)
    return [rng.integers(1, 1000, int(m)).tolist() for m in lengths]


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def run_lengths(row_positions, row_labels):
    """Input tokens of each document of a row (positions restart at 0 per document; padding: labels ignored)."""
    pos, labels = row_positions.tolist(), row_labels.tolist()
    starts = [k for k, p in enumerate(pos) if p == 0] + [len(pos)]
    return [b - a for a, b in zip(starts[:-1], starts[1:]) if any(x != IGNORE for x in labels[a:b])]


@pytest.mark.parametrize("world, batch, cost", [(2, 2, (96.0, 1.0)), (3, 1, "tokens"), (1, 3, "attention")])
def test_the_line_states_the_first_buffers_steps_balance_and_efficiency(caplog, world, batch, cost):
    """One buffer holds the whole pass: its figures are those of every step every rank yields."""
    seq_len, source = 96, docs(300, seed=world)
    a, b = {"tokens": (1.0, 0.0), "attention": (0.0, 1.0)}.get(cost, cost)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        ranks = [list(BalancedDocumentStream(source, seq_len=seq_len, local_batch_size=batch, dp_rank=r,
                                             dp_world_size=world, buffer_size=10_000, cost=cost))
                 for r in range(world)]
    steps = len(ranks[0])
    costs = np.zeros((steps, world))
    tokens = 0
    for r, batches in enumerate(ranks):
        for s, (inputs, labels) in enumerate(batches):
            for pos, lab in zip(inputs["positions"], labels):
                lengths = np.array(run_lengths(pos, lab), dtype=float)
                costs[s, r] += (a * lengths + b * lengths ** 2).sum()
                tokens += int(lengths.sum())
    balance = costs.max(axis=1).sum() / costs.mean(axis=1).sum()
    efficiency = tokens / (steps * world * batch * seq_len)
    assert lines(caplog) == [stream_start_line(steps, world, balance, efficiency)]
    n, r, bal, eff = LINE.match(lines(caplog)[0]).groups()
    assert (int(n), int(r)) == (steps, world) and 1.0 <= float(bal) < 1.05 and 0.5 < float(eff) <= 1.0


def test_logged_once_for_the_first_buffer_of_many_and_across_passes(caplog):
    """Many buffers, two passes: one line, whose N is the steps yielded while the state's buffer_start is 0."""
    stream = BalancedDocumentStream(docs(400, seed=5), seq_len=96, local_batch_size=2, dp_world_size=2,
                                    buffer_size=64, infinite=True)
    first = 0
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for k, _ in enumerate(stream):
            state = stream.state_dict()
            if state["epoch"] == 0 and state["buffer_start"] == 0:
                first += 1
            if state["epoch"] == 1 and state["buffer_start"] > 0:  # into the second pass's second buffer
                break
    assert 0 < first < k
    (line,) = lines(caplog)
    assert int(LINE.match(line).group(1)) == first == stream.first_buffer["steps"]


def test_only_dp_rank_zero_logs_and_every_rank_knows_the_figures(caplog):
    source = docs(200, seed=7)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        streams = [BalancedDocumentStream(source, seq_len=96, local_batch_size=1, dp_rank=r, dp_world_size=3)
                   for r in (1, 2)]
        for s in streams:
            next(iter(s))
        assert lines(caplog) == []
        zero = BalancedDocumentStream(source, seq_len=96, local_batch_size=1, dp_rank=0, dp_world_size=3)
        assert zero.first_buffer is None
        next(iter(zero))
    assert len(lines(caplog)) == 1
    assert zero.first_buffer == streams[0].first_buffer == streams[1].first_buffer


def test_the_stream_line_is_the_trainers_line_plus_its_streaming_caveat():
    assert stream_start_line(12, 4, 1.000123, 0.98765) == (
        start_line(12, 4, 1.000123, 0.98765).replace("packkit: ", "packkit: first buffer ", 1)
        + "; streaming, steps per epoch unknown up front")
