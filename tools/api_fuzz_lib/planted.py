"""Planted bugs for the fuzzer's controls (tests/test_api_fuzz.py): copies of real APIs with one bug each, registered
only there, never in the real registry. Each must be caught: an allocation sized by ``dp_size`` (MemoryError or a
kill under the address-space limit), a loop that never ends on an empty pass (the timeout), a silent int cast
(accepted silently)."""
from __future__ import annotations

import numpy as np

import packkit
from packkit.packing.checks import check_int

from .checks import CAPACITY, LENGTHS
from .core import Api, Variant


def plan_alloc_by_dp(lengths, capacity: int, *, dp_size: int = 1):
    dp_size = check_int(dp_size, "dp_size", 1)
    per_rank = np.zeros(dp_size * 1024, np.int8)  # BUG: sized by the argument, not the data
    return packkit.plan(lengths, capacity, dp_size=min(dp_size, 2**16) if per_rank.size else 1)


def plan_touch_by_dp(lengths, capacity: int, *, dp_size: int = 1):
    dp_size = check_int(dp_size, "dp_size", 1)
    np.ones(min(dp_size, 2**28), np.int8)  # BUG: up to 256 MB touched for the argument, under the 4 GiB limit
    return packkit.plan(lengths, capacity)


def rows_until_nonempty(source, capacity: int = CAPACITY):
    capacity = check_int(capacity, "capacity", 1)
    rows = []
    while not rows:  # BUG: a pass that yields nothing is read again, forever
        rows = [list(doc) for doc in source]
    return packkit.pack_sequences(rows, capacity=capacity)


def plan_int_cast(lengths, capacity: int):
    return packkit.plan(lengths, int(capacity))  # BUG: 2.5 becomes 2, NaN raises numpy's message


def _check_plan(plan, kw):
    assert plan.kept_tokens == sum(int(n) for n in kw["lengths"])


def register(reg: dict) -> None:
    reg["planted.plan_alloc_by_dp"] = Api("planted.plan_alloc_by_dp", plan_alloc_by_dp,
                                          lambda: dict(lengths=list(LENGTHS), capacity=CAPACITY), _check_plan)
    reg["planted.plan_touch_by_dp"] = Api("planted.plan_touch_by_dp", plan_touch_by_dp,
                                          lambda: dict(lengths=list(LENGTHS), capacity=CAPACITY), _check_plan)
    reg["planted.rows_until_nonempty"] = Api(
        "planted.rows_until_nonempty", rows_until_nonempty, lambda: dict(source=[[1, 2, 3], [4, 5]]),
        lambda batch, kw: None, variants=[Variant("degenerate", "source", "empty", "either",
                                                  lambda kw: {**kw, "source": []})])
    reg["planted.plan_int_cast"] = Api("planted.plan_int_cast", plan_int_cast,
                                       lambda: dict(lengths=list(LENGTHS), capacity=CAPACITY), _check_plan)
