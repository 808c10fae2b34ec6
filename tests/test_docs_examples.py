"""Every ```python block in README.md and docs/**/*.md runs, so no example rots.

The blocks of one page run in order in one shared namespace (like a notebook), with a temporary
directory as the working directory. A block that cannot run on a CPU-only machine is preceded, on the
line just before its fence, by ``<!-- docs-test: compile-only -->``: it is then only compiled and its
top-level ``import``/``from`` statements executed. Blocks in other languages (bash, text) are not run.
"""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMPILE_ONLY = "<!-- docs-test: compile-only -->"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """(line number, source, compile_only) of every fenced block whose info string is ``python``."""
    blocks = []
    for m in FENCE.finditer(text):
        if m.group("info").strip() != "python":
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        indent = m.group("indent")
        body = "\n".join(l[len(indent):] if l.startswith(indent) else l for l in m.group("body").split("\n"))
        blocks.append((line, body, before == COMPILE_ONLY))
    return blocks


# A top-level expression followed by ``# -> value`` states what it gives: the test evaluates it and fails when the
# value differs (``print(x)  # -> value`` checks ``x``). ``value`` is a Python literal, compared by ==, floats to 4
# significant digits (what an example shows), numpy arrays by their ``tolist()``; anything else (``array([0, 1])``,
# ``range(0, 8)``) is compared with the value's repr, whitespace ignored.
CHECKED = re.compile(r"#\s*->\s*(?P<value>.+?)\s*$")


def _same(got, want) -> bool:
    import math

    import numpy as np

    if isinstance(got, np.ndarray):
        got = got.tolist()
    elif isinstance(got, np.generic):
        got = got.item()
    if isinstance(want, float) or (isinstance(got, float) and isinstance(want, int) and not isinstance(want, bool)):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, want, rel_tol=5e-4,
                                                                                             abs_tol=1e-12)
    if isinstance(want, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(want)
                and all(_same(g, w) for g, w in zip(got, want)))
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want if isinstance(want, bool) else got == want


def check_value(got, expected: str, where: str) -> None:
    """AssertionError at ``where`` when ``got`` is not what the example's ``# -> expected`` says."""
    try:
        want = ast.literal_eval(expected)
    except (ValueError, SyntaxError):
        ok = re.sub(r"\s+", "", repr(got)) == re.sub(r"\s+", "", expected)
    else:
        ok = _same(got, want)
    if not ok:
        raise AssertionError(f"{where}: the example says {expected}, the code gives {got!r}")


def run_block(src: str, where: str, namespace: dict) -> None:
    """Runs one block statement by statement; a statement with ``# -> value`` has its value checked."""
    lines = src.split("\n")
    for node in ast.parse(src, where).body:
        m = CHECKED.search(lines[node.end_lineno - 1]) if isinstance(node, ast.Expr) else None
        if m is None:
            exec(compile(ast.Module(body=[node], type_ignores=[]), where, "exec"), namespace)
            continue
        expr = node.value
        if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "print"
                and len(expr.args) == 1 and not expr.keywords):
            exec(compile(ast.Module(body=[node], type_ignores=[]), where, "exec"), namespace)
            expr = expr.args[0]
        got = eval(compile(ast.Expression(body=expr), where, "eval"), namespace)
        check_value(got, m.group("value"), f"{where} (line {node.lineno} of the block)")


def run_page(path: Path, text: str, workdir: Path) -> int:
    """Runs the page's python blocks; returns how many there were."""
    namespace: dict = {"__name__": "__docs__"}
    blocks = python_blocks(text)
    old = os.getcwd()
    os.chdir(workdir)
    try:
        for line, src, compile_only in blocks:
            where = f"{path.name}:{line}"
            code = compile(src, where, "exec")
            if compile_only:
                imports = [node for node in ast.parse(src).body if isinstance(node, (ast.Import, ast.ImportFrom))]
                exec(compile(ast.Module(body=imports, type_ignores=[]), where, "exec"), namespace)
            else:
                run_block(src, where, namespace)
    finally:
        os.chdir(old)
    return len(blocks)


# What README's test command installs (the core tier): a page whose blocks import anything else (trl, ray, verl,
# a trainer, packkit.integrations) runs in the full tier, tests/test_docs_examples_full.py.
CORE_MODULES = {"packkit", "torch", "numpy", "transformers", "datasets", "pyarrow", "matplotlib", "tqdm",
                "accelerate", "pandas"}


def imported_modules(text: str) -> set[str]:
    mods = set()
    for _, src, _ in python_blocks(text):
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                mods |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mods.add(node.module)
    return mods


def needs_full_tier(text: str) -> bool:
    import sys

    def outside(m: str) -> bool:
        top = m.split(".")[0]
        return m.startswith("packkit.integrations") or not (top in CORE_MODULES or top in sys.stdlib_module_names)
    return any(outside(m) for m in imported_modules(text))


CORE_PAGES = [p for p in PAGES if not needs_full_tier(p.read_text())]
FULL_PAGES = [p for p in PAGES if p not in CORE_PAGES]


def run_page_test(page, tmp_path):
    import torch

    torch.manual_seed(0)
    run_page(page, page.read_text(), tmp_path)


def test_pages_split_between_tiers():
    assert "README.md" in {p.name for p in CORE_PAGES} and "trl.md" in {p.name for p in FULL_PAGES}
    assert needs_full_tier("```python\nfrom packkit.integrations.verl import install\n```\n")
    assert not needs_full_tier("```python\nimport os, packkit\nfrom torch import nn\n```\n")


@pytest.mark.parametrize("page", CORE_PAGES, ids=[str(p.relative_to(ROOT)) for p in CORE_PAGES])
def test_page_examples_run(page, tmp_path):
    run_page_test(page, tmp_path)


def test_every_page_with_code_is_covered():
    """The pages that show code hold python blocks the parser finds (a parser change cannot silently find none)."""
    counts = {p.name: len(python_blocks(p.read_text())) for p in PAGES}
    with_code = ("README.md", "quickstart.md", "planner.md", "packing.md", "hf_trainer.md", "trl.md", "vlm.md",
                 "datasets.md", "data_parallel.md", "streaming.md", "analyze.md")
    assert all(counts.get(name, 0) >= 1 for name in with_code), counts


def test_a_failing_block_fails(tmp_path):
    """Control: a block that raises fails the check; a compile-only block is not run but is compiled."""
    page = tmp_path / "page.md"
    bad = "text\n\n```python\nx = 1\n```\n\n```python\nraise RuntimeError('rotted example')\n```\n"
    with pytest.raises(RuntimeError, match="rotted example"):
        run_page(page, bad, tmp_path)
    skipped = f"{COMPILE_ONLY}\n```python\nimport math\nraise RuntimeError('needs a GPU')\n```\n```python\nmath.pi\n```\n"
    assert run_page(page, skipped, tmp_path) == 2  # imports of a compile-only block still run
    with pytest.raises(SyntaxError):
        run_page(page, f"{COMPILE_ONLY}\n```python\ndef broken(:\n```\n", tmp_path)
    assert python_blocks("```bash\nexit 1\n```\n```text\nnot python\n```\n") == []


def test_a_wrong_printed_value_fails(tmp_path):
    """Control: a ``# -> value`` that the code does not give fails the page; the right one passes."""
    page = tmp_path / "page.md"
    good = ("```python\nimport numpy as np\nx = [1, 2]\nx  # -> [1, 2]\nnp.arange(3)  # -> [0, 1, 2]\n"
            "2 / 3  # -> 0.6667\nrange(0, 8)  # -> range(0, 8)\nprint(len(x))  # -> 2\n```\n")
    assert run_page(page, good, tmp_path) == 1
    for wrong in ("x = [1, 2]\nx  # -> [1, 3]", "2 / 3  # -> 0.7", "print(1 + 1)  # -> 3",
                  "(range(0, 8), 1)  # -> (range(0, 4), 1)"):
        with pytest.raises(AssertionError, match="the example says"):
            run_page(page, f"```python\n{wrong}\n```\n", tmp_path)
