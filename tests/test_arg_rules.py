"""packkit.planning.arg_rules: each declared rule accepts what it says and refuses the rest by name (issue 57), and
the one callback rule (callback_costs) refuses every bad return the API fuzzer draws."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from packkit.planning.arg_rules import (Bool, Choice, Instance, Int, Real, callback_costs, check_args,
                                        check_rows_per_step)

pytestmark = pytest.mark.core


@pytest.mark.parametrize("value, want", [(3, 3), (np.int64(3), 3), (torch.tensor(3), 3), (np.uint8(7), 7)])
def test_int_accepts(value, want):
    got = Int("n", 1, 10).check(value)
    assert got == want and type(got) is int


@pytest.mark.parametrize("value, exc, match", [
    (True, TypeError, r"n must be an int, got bool"), (np.bool_(True), TypeError, r"n must be an int"),
    (2.5, TypeError, r"n must be an int, got float"), ("3", TypeError, r"n must be an int, got str"),
    (torch.tensor(2.5), TypeError, r"n must be an int"), (torch.tensor([3]), TypeError, r"n must be a number"),
    (0, ValueError, r"n must be >= 1 \(an int in \[1, 10\]\), got 0"),
    (11, ValueError, r"n must be <= 10 \(an int in \[1, 10\]\), got 11"),
    (2**64, ValueError, r"n must be <= 10"), (complex(3, 0), TypeError, r"n must be an int"),
    (torch.tensor(3, device="meta"), ValueError, r"n is a meta tensor"),  # no data: named (issue 63), never .item()
])
def test_int_refuses(value, exc, match):
    with pytest.raises(exc, match=match):
        Int("n", 1, 10).check(value)


def test_optional_and_unbounded():
    assert Int("n", optional=True).check(None) is None
    with pytest.raises(TypeError, match="n must be an int"):
        Int("n").check(None)
    assert Int("n").check(-2**70) == -2**70


@pytest.mark.parametrize("value, exc, match", [
    (math.nan, ValueError, r"r must be a finite number"), (math.inf, ValueError, r"r must be a finite number"),
    (True, TypeError, r"r must be a real number, got bool"), (1 + 1j, TypeError, r"r must be a real number"),
    ("0.5", TypeError, r"r must be a real number"), (1.5, ValueError, r"r must be in \[0.0, 1.0\], got 1.5"),
])
def test_real_refuses(value, exc, match):
    with pytest.raises(exc, match=match):
        Real("r", 0.0, 1.0).check(value)


def test_real_accepts():
    assert Real("r", 0.0, 1.0).check(np.float32(0.5)) == 0.5
    assert Real("r", inf=True).check(math.inf) == math.inf
    assert Real("r").check(torch.tensor(2)) == 2.0


def test_bool_choice_instance():
    assert Bool("b").check(np.bool_(False)) is False
    for bad in (0, 1, "no", 2.0, None):
        with pytest.raises(TypeError, match=r"b must be a bool"):
            Bool("b").check(bad)
    assert Choice("c", ("x", "y")).check("y") == "y"
    with pytest.raises(ValueError, match=r"c must be one of 'x', 'y', got 'z'"):
        Choice("c", ("x", "y")).check("z")
    with pytest.raises(TypeError, match=r"i must be a list of rows, got tuple"):
        Instance("i", list, "a list of rows").check(())


def test_check_args_in_order_and_strict():
    assert check_args(Int("a", 0), Bool("b"), values=(1, True)) == (1, True)
    with pytest.raises(TypeError, match=r"b must be a bool"):
        check_args(Int("a", 0), Bool("b"), values=(1, 1))
    with pytest.raises(ValueError):  # a rule without its value is a programming error, not a silent skip
        check_args(Int("a", 0), Bool("b"), values=(1,))


BAD = [(None, r"returned None"), (np.array([1.0, 2.0]) + 1j, r"returned complex128"),
       (torch.tensor([1.0, 2.0, 3.0]) + 1j, r"complex64 tensor"), (np.array([True, False, True]), r"returned bool"),
       (np.array(["1", "2", "3"]), r"returned str"), (np.array(["1", "2", "3"], dtype=object), r"returned None"),
       ([1.0, 2.0], r"shape \(2,\) for 3 sequences"), (np.ones((3, 2)), r"shape \(3, 2\)"),
       ([1.0, math.nan, 1.0], r"non-finite cost \(nan\) for sequence 1"),
       ([1.0, 2.0, -0.5], r"negative cost \(-0.5\) for sequence 2"),
       ([1.7e308, 1.7e308, 1.0], r"sum to inf")]


@pytest.mark.parametrize("values, match", BAD)
def test_callback_costs_refuses(values, match):
    with pytest.raises(ValueError, match=r"^the cost callable (returned .*)?" + match):
        callback_costs(values, 3, "the cost callable")


@pytest.mark.parametrize("values", [[1, 2, 3], np.arange(3.0), torch.arange(3), np.ones((1, 3)), np.ones((3, 1)),
                                    np.array([1, 2, 3], dtype=object)])
def test_callback_costs_accepts(values):
    out = callback_costs(values, 3, "cost")
    assert out.dtype == np.float64 and out.shape == (3,)


def test_rows_per_step():
    check_rows_per_step(2**16, 5, "dp_size")
    check_rows_per_step(10**6, 10**6, "dp_size")  # as many rows as sequences
    with pytest.raises(ValueError, match=r"dp_size \* batch_size = 2 \* 40000 = 80000 rows per step is more than "
                                         r"65536"):
        check_rows_per_step(80000, 5, "dp_size * batch_size = 2 * 40000")
