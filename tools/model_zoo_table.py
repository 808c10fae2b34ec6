"""Regenerate the model-zoo table in docs/reliability.md from the suite's own cases (tests/model_zoo.py).

    python tools/model_zoo_table.py          # rewrite the table between the markers
    python tools/model_zoo_table.py --check  # exit 1 if the committed table differs
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import model_zoo as zoo  # noqa: E402


def main(argv) -> int:
    doc = ROOT / "docs" / "reliability.md"
    with zoo.zoo_session():
        results = {}
        for name in zoo.ARCHITECTURES:
            for path in zoo.PATHS:
                results[(name, path)] = zoo.run_case(name, path)
                print(f"{name:24s} {path:16s} {results[(name, path)].cell()[:100]}", file=sys.stderr)
        table = zoo.render_table(results)
    text = doc.read_text()
    if "--check" in argv:
        return 0 if zoo.table_in(text) == table else 1
    start, end = text.index(zoo.BEGIN) + len(zoo.BEGIN), text.index(zoo.END)
    doc.write_text(text[:start] + "\n" + table + "\n" + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
