"""Every test file declares exactly one tier: `core` (README's test command, `pytest -m core`) or `full` (the rest of
what CI runs, `pytest -m full`), as a module-level `pytestmark`. A file without one would run in neither command."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.core

TESTS = Path(__file__).resolve().parent
TIERS = ("core", "full")


def declared_tiers(source: str) -> list[str]:
    """The tier markers (`pytest.mark.core` / `pytest.mark.full`) of a module's top-level `pytestmark`."""
    tiers = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            for sub in ast.walk(node.value):
                if (isinstance(sub, ast.Attribute) and sub.attr in TIERS and isinstance(sub.value, ast.Attribute)
                        and sub.value.attr == "mark"):
                    tiers.append(sub.attr)
    return tiers


def test_every_test_file_declares_exactly_one_tier():
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 100
    wrong = {str(f.relative_to(TESTS)): declared_tiers(f.read_text()) for f in files}
    wrong = {f: t for f, t in wrong.items() if len(t) != 1}
    assert not wrong, f"test files without exactly one tier (pytestmark = pytest.mark.core or .full): {wrong}"


@pytest.mark.parametrize("source, tiers", [
    ("import pytest\npytestmark = pytest.mark.core\n", ["core"]),
    ("import pytest\npytestmark = [pytest.mark.full, pytest.mark.skipif(True, reason='x')]\n", ["full"]),
    ("import pytest\npytestmark = pytest.mark.skipif(True, reason='x')\n", []),  # a mark, but no tier
    ("import pytest\n\ndef test_x():\n    pytestmark = pytest.mark.core\n", []),  # not module level
    ("import pytest\npytestmark = [pytest.mark.core, pytest.mark.full]\n", ["core", "full"]),  # two: refused above
])
def test_the_tier_reader(source, tiers):
    assert declared_tiers(source) == tiers


def test_collected_items_carry_their_files_tier(request):
    """The marker reaches pytest's `-m` selection: this module's own items are `core`."""
    assert request.node.get_closest_marker("core") is not None
    assert request.node.get_closest_marker("full") is None
