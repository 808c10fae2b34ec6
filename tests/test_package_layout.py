"""The package is laid out by stage (planning -> packing -> training -> datasets -> tools): no module imports
from a later stage, and there is no import circle, counting imports inside functions. The graph is read
from the source with ``ast``, so a lazy import cannot hide a circle. The public API is listed too."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import packkit

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> module prefix (triton_kernels/ ships as packkit.triton_kernels).
SOURCES = {ROOT / "packkit": "packkit", ROOT / "triton_kernels": "packkit.triton_kernels"}
# Stage of each subpackage; a module may import its own stage or an earlier one, never a later one.
STAGES = {"packkit._version": 0, "packkit._planner": 0, "packkit.planning": 1, "packkit.pipeline": 1, "packkit.packing": 2,
          "packkit.triton_kernels": 2, "packkit.context_parallel": 2, "packkit.models": 2, "packkit.training": 3, "packkit.rl": 3, "packkit.shared_prefix": 3,
          "packkit.datasets": 4, "packkit.integrations": 4, "packkit.tools": 5, "packkit.analyze": 5,
          "packkit.__main__": 5, "packkit": 6}


def module_files() -> dict[str, Path]:
    out = {}
    for folder, prefix in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = path
    return out


COMPILED = {"packkit._planner"}  # extension modules: imported, never importing


def stage(module: str) -> int:
    best = max((p for p in STAGES if module == p or module.startswith(p + ".")), key=len, default=None)
    assert best is not None, f"{module} belongs to no stage: add its subpackage to STAGES"
    return STAGES[best]


def resolve(importer: str, is_package: bool, node: ast.ImportFrom, modules: set) -> list[str]:
    if node.level:
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    # `from pkg import name` imports pkg.name when that is a module, else pkg itself.
    found = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
    return found if len(found) == len(node.names) else found + [target]


def import_graph() -> dict[str, set]:
    files = module_files()
    modules = set(files) | COMPILED
    graph = {m: set() for m in modules}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):  # every import, at module level or inside a function
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = resolve(module, path.name == "__init__.py", node, modules)
            else:
                continue
            graph[module].update(t for t in targets if t in modules and t != module)
    return graph


def find_cycle(graph: dict[str, set]):
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def parent_packages(module: str) -> set:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_the_graph_sees_the_imports_it_must():
    graph = import_graph()
    assert "packkit.planning.planner" in graph["packkit.packing.sequences"]
    assert "packkit.packing.fields" in graph["packkit.packing.sequences"]
    # an import inside a function counts (pack_dataset imports ray_data lazily)
    assert "packkit.datasets.ray_data" in graph["packkit.datasets.hf_datasets"]


def test_no_import_circle():
    graph = import_graph()
    # A package's __init__ re-exporting its own modules is no circle: only module -> module edges count,
    # and edges from a module into its own parent packages (never taken at import time here) are left out.
    edges = {m: {t for t in ts if t not in parent_packages(m)} for m, ts in graph.items()}
    cycle = find_cycle(edges)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_circle():
    graph = import_graph()
    graph["packkit.planning.planner"].add("packkit.packing.sequences")  # sequences already imports planner
    cycle = find_cycle(graph)
    assert cycle is not None and "packkit.planning.planner" in cycle and "packkit.packing.sequences" in cycle


def test_no_import_from_a_later_stage():
    bad = [f"{m} (stage {stage(m)}) imports {t} (stage {stage(t)})"
           for m, targets in import_graph().items() for t in targets if stage(t) > stage(m)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", sorted(module_files()))
def test_every_module_has_a_stage(module):
    stage(module)


PUBLIC_API = ["ALGORITHMS", "LAYOUTS", "OVERLONG_POLICIES", "PLAN_ERRORS", "PackBuffers", "PackInfo", "PackLayout",
              "PackReport", "PackedBatchSampler", "PackedIterableDataset", "PackedRowsCollator", "PackingCollator",
              "Plan", "Segments", "check_plan", "document_causal_block_mask", "mrope_position_ids", "pack_context_parallel",
              "pack_dataset",
              "pack_layout", "pack_on_device", "pack_sequences", "packing_support", "plan", "prepare_model",
              "register_varlen_attention",
              "shard_context_parallel", "transformer_cost", "unpack_sequences", "unprepare_model", "vision_cost",
              "unshard_context_parallel",
              "varlen_attention_forward", "plan_context_parallel", "ContextParallelPlan", "pack_context_parallel_pass",
              "iter_context_parallel"]


def test_public_api_is_unchanged():
    assert sorted(packkit.__all__) == sorted(PUBLIC_API)
    for name in PUBLIC_API:
        assert getattr(packkit, name) is not None
    assert callable(packkit.plan) and isinstance(packkit.__version__, str)
    import torch

    for op in ("plan", "layout", "pack", "pack_batch", "unpack", "unpack_padded", "layout_out", "pack_out",
               "pack_batch_out", "unpack_out", "unpack_padded_out", "cp_shard"):
        assert hasattr(torch.ops.packkit, op), op


def test_import_packkit_loads_no_optional_integration():
    import subprocess
    import sys

    code = ("import sys, packkit; bad = [m for m in ('datasets', 'pyarrow', 'ray', 'transformers', 'trl', 'triton', "
            "'matplotlib', 'verl') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
