"""Every device launch runs under the tensors' device, checked in the sources on the CPU (the GPU twin, with tensors
on cuda:1 and device 0 current: tests/gpu/test_non_current_device.py). Without the guard a launch goes to the
*current* device against another device's stream and pointers (issue 48 review items 1 and 2).

- Triton: every ``kernel[grid](...)`` launch in triton_kernels/ is inside ``with _device_guard(...)``.
- CUDA: every op registered for the CUDA key in csrc/ops/*.cu constructs a
  ``torch::stable::accelerator::DeviceGuard`` before its first allocation, stream lookup or launch, or does none of
  those itself and only calls entries of the same file that do.
Each check is also run on a planted source without the guard (the code before commits 02f55b5 / 2acd0f9), which it
must flag."""
from __future__ import annotations

import ast
import re
from pathlib import Path
import pytest

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]
DEVICE_WORK = re.compile(r"new_empty\(|\bempty\(|current_stream\(|<<<|\blaunch_\w+\(")
GUARD = "torch::stable::accelerator::DeviceGuard"


# --- Triton ---------------------------------------------------------------------------------------------------
def unguarded_triton_launches(source: str, name: str = "<src>") -> list:
    """'file:line' of each ``f[grid](...)`` call not lexically inside ``with _device_guard(...)``."""
    found = []

    def visit(node, guarded):
        if isinstance(node, ast.With):
            guarded = guarded or any(isinstance(i.context_expr, ast.Call) and getattr(i.context_expr.func, "id", "")
                                     == "_device_guard" for i in node.items)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and not guarded:
            found.append(f"{name}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(ast.parse(source), False)
    return found


def test_every_triton_launch_is_device_guarded():
    files = sorted((ROOT / "triton_kernels").glob("*.py"))
    launches = sum(len(re.findall(r"\]\(", f.read_text())) for f in files)
    assert launches >= 7  # layout, pack, pack_batch, fill + unpack, cp_shard, tree_pack: the check saw them
    bad = [hit for f in files for hit in unguarded_triton_launches(f.read_text(), f.name)]
    assert bad == [], f"Triton launches outside `with _device_guard(tensor)`: {bad}"


def test_the_triton_check_flags_an_unguarded_launch():
    planted = ("def op(x, out):\n"
               "    with _device_guard(x):\n"
               "        wrap_triton(_k)[(1,)](x, out)\n"
               "    wrap_triton(_k)[_grid_1d('op', 4, 2)](x, out)\n")
    assert unguarded_triton_launches(planted) == ["<src>:4"]


# --- CUDA -----------------------------------------------------------------------------------------------------
def _bodies(source: str) -> dict:
    """name -> body text of every function defined at the top of a line (brace-matched)."""
    bodies = {}
    for m in re.finditer(r"^[A-Za-z][\w:<>,\s]*?[\s&*](\w+)\(([^;{}]*?)\)\s*\{", source, re.M):
        depth, i = 1, m.end()
        while depth and i < len(source):
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            i += 1
        bodies.setdefault(m.group(1), source[m.end():i - 1])
    return bodies


def unguarded_cuda_entries(source: str) -> list:
    """CUDA-key entries (STABLE_TORCH_LIBRARY_IMPL(packkit, CUDA, ...)) that allocate, look up a stream or launch
    before a DeviceGuard, or delegate to a local function that does."""
    entries = [m.group(1) for block in re.findall(r"STABLE_TORCH_LIBRARY_IMPL\(packkit, CUDA, m\) \{(.*?)\n\}",
                                                  source, re.S)
               for m in re.finditer(r"TORCH_BOX\(&(?:\w+::)*(\w+)\)", block)]
    assert entries, "no CUDA entries found"
    bodies = _bodies(source)

    def callees(name):
        return [c for c in dict.fromkeys(re.findall(r"\b(\w+)\(", bodies[name])) if c in bodies and c != name]

    def does_work(name, seen=()):
        return bool(DEVICE_WORK.search(bodies[name])) or any(
            does_work(c, seen + (name,)) for c in callees(name) if c not in seen)

    def guarded(name, seen=()):
        body = bodies[name]
        work, guard = DEVICE_WORK.search(body), body.find(GUARD)
        if guard >= 0 and (work is None or guard < work.start()):
            return True
        if work is not None:  # its own device work, before any guard
            return False
        return all(guarded(c, seen + (name,)) for c in callees(name) if c not in seen and does_work(c))

    return [name for name in entries if not guarded(name)]


def test_every_cuda_entry_is_device_guarded():
    sources = sorted((ROOT / "csrc" / "ops").glob("*.cu"))
    assert {s.name for s in sources} >= {"pack_op.cu", "context_parallel_op.cu", "tree_pack_op.cu"}
    bad = {s.name: unguarded_cuda_entries(s.read_text()) for s in sources}
    assert all(not v for v in bad.values()), f"CUDA entries without a DeviceGuard before device work: {bad}"


def test_the_cuda_check_flags_an_unguarded_entry():
    """cp_shard_cuda as it was before 2acd0f9 (allocations, stream and launch without a guard), and an entry that
    only delegates to such a function."""
    planted = """
std::tuple<Tensor, Tensor> shard_cuda(const Tensor& input_ids, int64_t out_len) {
  STD_TORCH_CHECK(input_ids.is_cuda(), "inputs must be CUDA tensors here");
  Tensor out = torch::stable::new_empty(input_ids, {out_len});
  cudaStream_t stream = current_stream(input_ids);
  shard_kernel<<<1, 256, 0, stream>>>(out.mutable_data_ptr<int64_t>());
  return {out, out};
}

Tensor guarded_cuda(const Tensor& t) {
  torch::stable::accelerator::DeviceGuard guard(t.get_device_index());
  Tensor out = torch::stable::new_empty(t, {4});
  return out;
}

Tensor delegate_cuda(const Tensor& t) {
  return std::get<0>(shard_cuda(t, 4));
}

STABLE_TORCH_LIBRARY_IMPL(packkit, CUDA, m) {
  m.impl("shard", TORCH_BOX(&packkit::ops::shard_cuda));
  m.impl("guarded", TORCH_BOX(&packkit::ops::guarded_cuda));
  m.impl("delegate", TORCH_BOX(&delegate_cuda));
}
"""
    assert unguarded_cuda_entries(planted) == ["shard_cuda", "delegate_cuda"]
