"""The test tree must not shadow real packages: pytest puts tests/ on sys.path, so a folder named like
a library (tests/triton once) is importable as a namespace package under that name, and torch's
opcheck then mistakes it for the real triton when triton is not installed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.core

TESTS = Path(__file__).resolve().parent
SHADOWABLE = ("triton", "torch", "numpy", "packkit", "transformers", "datasets", "pyarrow", "hypothesis", "ray")


@pytest.mark.parametrize("name", SHADOWABLE)
def test_no_test_folder_shadows_a_package(name):
    assert not (TESTS / name).exists(), f"tests/{name} would shadow the real `{name}` package on sys.path"


def test_triton_spec_is_not_a_test_folder():
    spec = importlib.util.find_spec("triton")
    if spec is None:
        pytest.skip("triton is not installed")
    for loc in spec.submodule_search_locations or ():
        assert not Path(loc).resolve().is_relative_to(TESTS), f"`triton` resolves to {loc}"
