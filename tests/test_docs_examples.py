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
                exec(code, namespace)
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
