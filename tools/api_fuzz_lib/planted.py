"""Planted bugs for the fuzzer's controls (tests/test_api_fuzz.py): copies of real APIs with one bug each, registered
only there, never in the real registry. One per rule of the oracle (core.judge), each must be caught: an allocation
sized by ``dp_size`` (MemoryError or a kill under the address-space limit), memory and CPU time sized by it (the sizes
oracle), a loop that never ends on an empty pass (the timeout), a silent int cast (accepted silently), a message
naming nothing, an IndexError, a wrong result (the checker), a valid call refused, a complex cost cast to real (the
callback oracle)."""
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


def plan_spin_by_dp(lengths, capacity: int, *, dp_size: int = 1):
    dp_size = check_int(dp_size, "dp_size", 1)
    spin = 0
    for _ in range(min(dp_size, 2**26)):  # BUG: seconds of CPU for the argument, none for the data
        spin += 1
    return packkit.plan(lengths, capacity)


def plan_unnamed_message(lengths, capacity: int):
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError("must be a positive int")  # BUG: says nothing of which argument
    return packkit.plan(lengths, capacity)


def plan_index_error(lengths, capacity: int):
    if not (isinstance(capacity, int) and capacity > 0):
        return list(lengths)[len(lengths)]  # BUG: an IndexError, not a clear error
    return packkit.plan(lengths, capacity)


def plan_drops_last(lengths, capacity: int):
    capacity = check_int(capacity, "capacity", 1)
    if capacity > CAPACITY:
        lengths = list(lengths)[:-1]  # BUG: a large capacity loses the last sequence
    return packkit.plan(lengths, capacity)


def plan_refuses_valid(lengths, capacity: int):
    raise ValueError(f"capacity={capacity!r} refused")  # BUG: the valid baseline refused


def plan_cost_cast(lengths, capacity: int, *, cost=None):
    if callable(cost):
        user = cost
        cost = lambda x: np.real(np.asarray(user(x), dtype=np.complex128))  # noqa: E731 - BUG: complex cast to real
    return packkit.plan(lengths, capacity, cost="tokens" if cost is None else cost, dp_size=2)


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
    base = lambda: dict(lengths=list(LENGTHS), capacity=CAPACITY)  # noqa: E731
    for fn in (plan_spin_by_dp, plan_unnamed_message, plan_index_error, plan_drops_last, plan_refuses_valid):
        reg[f"planted.{fn.__name__}"] = Api(f"planted.{fn.__name__}", fn, base, _check_plan)
    reg["planted.plan_cost_cast"] = Api("planted.plan_cost_cast", plan_cost_cast, base, _check_plan, skip=("cost",),
                                        callbacks=("cost",))
    reg["planted.plan_int_cast"] = Api("planted.plan_int_cast", plan_int_cast,
                                       lambda: dict(lengths=list(LENGTHS), capacity=CAPACITY), _check_plan)
