"""The one line each trainer integration logs at train start, in the trainer's own log, so a user can see packkit
is in effect: ``packkit: N steps on R ranks, balance B, efficiency E``.

``N``: the micro-steps the planned epoch gives each rank; ``R``: the data-parallel ranks it was planned for;
``B``: sum over steps of the costliest rank / sum of the step means (1 is perfect); ``E``: real tokens / row slots.

A streaming loader (torchtitan's) plans buffer by buffer and cannot know an epoch's step count up front: it logs
:func:`stream_start_line` once, for the first buffer it plans, with the same figures of that buffer.
"""
from __future__ import annotations


def start_line(steps: int, ranks: int, balance: float, efficiency: float) -> str:
    return f"packkit: {int(steps)} steps on {int(ranks)} ranks, balance {balance:.5f}, efficiency {efficiency:.4f}"


def stream_start_line(steps: int, ranks: int, balance: float, efficiency: float) -> str:
    return (f"packkit: first buffer {int(steps)} steps on {int(ranks)} ranks, balance {balance:.5f}, efficiency "
            f"{efficiency:.4f}; streaming, steps per epoch unknown up front")
