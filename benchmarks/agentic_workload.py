"""The agent-RL workload of issue 49: trajectories sharing one system prompt, then branching turns.

One task: a system prompt of ``system`` tokens, then ``turns`` turns, each node of the turn tree with ``branches``
children; every trajectory picks a random branch at each turn (so trajectories may repeat once they outnumber the
leaves). A turn is ``lo..hi`` tokens (uniform), split into an assistant part (scored) and a tool-output part (not
scored: label -100). Node contents are drawn once per tree node, so equal paths give equal tokens."""
from __future__ import annotations

import numpy as np

IGNORE = -100


def agentic_trajectories(n: int, *, system: int = 2000, turns: int = 6, branches: int = 4, lo: int = 150,
                         hi: int = 600, vocab: int = 32000, seed: int = 0, labels: bool = False):
    """``n`` trajectories as lists of token ids (and, with ``labels``, their per-token labels: the system prompt and
    each turn's tool output -100, the assistant part the tokens themselves)."""
    rng = np.random.default_rng(seed)
    system_tokens = rng.integers(1, vocab, system).tolist()
    nodes: dict = {}
    out, out_labels = [], []
    for _ in range(n):
        path, tokens, labs = (), list(system_tokens), [IGNORE] * system
        for _turn in range(turns):
            path = path + (int(rng.integers(branches)),)
            if path not in nodes:
                length = int(rng.integers(lo, hi + 1))
                turn = rng.integers(1, vocab, length).tolist()
                cut = int(rng.integers(1, length))  # assistant tokens, then the tool's output
                nodes[path] = (turn, turn[:cut] + [IGNORE] * (length - cut))
            turn, turn_labels = nodes[path]
            tokens = tokens + turn
            labs = labs + turn_labels
        out.append(tokens)
        out_labels.append(labs)
    return (out, out_labels) if labels else out
