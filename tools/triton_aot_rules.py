"""The rules tools/triton_aot.py applies (pure: no triton, no torch; tests/test_triton_aot.py imports them): the
declared launch domains, what a device refuses (registers x threads, shared memory), i32 loop counters in the TTIR,
the cubin's resource usage, and the source scan that every @triton.jit function is covered."""
from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_DIR = ROOT / "triton_kernels"
REGS_PER_BLOCK = 65536
# Shared memory a block may use (the opt-in maximum Triton's launcher sets for dynamic shared memory), bytes.
SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}
WORD = ("i8", "i16", "i32", "i64")
IDS = ("i32", "i64")


# --- declared domains (from reading the launchers) -------------------------------------------------------------
def domains(config: dict, tiles: set) -> dict:
    """Kernel -> every (constexprs, data pointer dtypes) combination its launchers can produce."""
    block, layout_block = config["block"], config["layout_block"]
    out: dict = {}

    def add(kernel, cx, ptrs):
        out.setdefault(kernel, set()).add((tuple(sorted(cx.items())), tuple(sorted(ptrs.items()))))

    for flat in (False, True):
        add("_layout_kernel", dict(FLAT=flat, BLOCK=layout_block), {})
    for w, words, first, (bp, bf) in itertools.product(WORD, (1, 2), (False, True), sorted(tiles)):
        if words == 2 and (w != "i64" or bf < 2):  # 16-byte elements: int64 word pairs, records of >= 2 words
            continue
        add("_pack_kernel", dict(HAS_FIRST=first, WORDS=words, BLOCK_P=bp, BLOCK_F=bf), dict(src_ptr=w, out_ptr=w))
    for w, padded, (bp, bf) in itertools.product(WORD, (False, True), sorted(tiles)):
        add("_unpack_kernel", dict(PADDED=padded, BLOCK_P=bp, BLOCK_F=bf), dict(packed_ptr=w, out_ptr=w))
    for w, words in itertools.product(WORD, (1, 2)):
        if words == 1 or w == "i64":
            add("_fill_kernel", dict(WORDS=words, BLOCK=block), dict(out_ptr=w))
    for ids, labels, mask in itertools.product(IDS, IDS, (False, True)):
        add("_pack_batch_kernel", dict(MASK_FIRST=mask, BLOCK=block),
            dict(ids_ptr=ids, labels_ptr=labels, out_ids_ptr=ids, out_labels_ptr=labels))
    for ids, labels, zigzag, fused, first in itertools.product(IDS, IDS, (False, True), (False, True), (False, True)):
        if first and not fused:  # first_label applies to the fused mode only
            continue
        add("_cp_shard_kernel", dict(ZIGZAG=zigzag, FUSED=fused, HAS_FIRST=first, BLOCK=config["cp_block"]),
            dict(ids_ptr=ids, labels_ptr=labels, out_ids_ptr=ids, out_split_ptr=labels, out_labels_ptr=labels))
    for ids, labels in itertools.product(IDS, IDS):
        add("_tree_pack_kernel", dict(BLOCK=config["tree_block"]),
            dict(ids_ptr=ids, labels_ptr=labels, out_ids_ptr=ids, out_labels_ptr=labels))
    return out


# --- limits and cubin resources (pure: tested without triton) ---------------------------------------------------
def violations(regs: int, num_warps: int, shared: int, cc: int) -> list:
    """What a device would refuse to launch: registers x threads past a block's 65,536, shared memory past the
    architecture's limit."""
    bad = []
    threads = num_warps * 32
    if regs * threads > REGS_PER_BLOCK:
        bad.append(f"{regs} registers x {threads} threads = {regs * threads} > {REGS_PER_BLOCK}")
    limit = SMEM_LIMIT.get(cc)
    if limit is None:
        bad.append(f"no shared memory limit known for cc {cc}")
    elif shared > limit:
        bad.append(f"{shared} bytes of shared memory > {limit} (sm_{cc})")
    return bad


def i32_loops(ttir: str) -> list:
    """``range`` loops with an i32 counter: ``i0 + BLOCK`` wraps for bounds within BLOCK of 2^31 and the loop never
    ends (issue 48); bounds that may reach 2^31 go through ``_i64``, so every ``scf.for`` here must count in i64."""
    return [f"i32 loop counter: {line.strip()[:160]}" for line in ttir.splitlines()
            if re.search(r"\bscf\.for\b.*:\s*i32\s*\{\s*$", line)]


def parse_resource_usage(text: str) -> dict:
    """``cuobjdump --dump-resource-usage`` output -> {function: {REG, STACK, SHARED, LOCAL}}."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function\s+(\S+?):?\s*$", line)
        if m:
            name = m.group(1)
            continue
        if name and "REG:" in line:
            out[name] = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
            name = None
    return out


def jit_coverage(kernel_dir: Path = KERNEL_DIR):
    """Every @triton.jit function defined in ``kernel_dir``/*.py must be launched (passed to ``wrap_triton``) or be a
    helper another jit function names (calls, or passes as a combiner). Returns (launched, helpers, errors); reads
    the sources only."""
    defs, launched, errors = {}, set(), []
    for path in sorted(Path(kernel_dir).glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
                defs[node.name] = node
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "wrap_triton" and node.args:
                launched.add(ast.unparse(node.args[0]))
    for name in sorted(launched - set(defs)):
        errors.append(f"wrap_triton({name}) launches something that is not a @triton.jit function here")
    named = {n.id for name, node in defs.items() for n in ast.walk(node)
             if isinstance(n, ast.Name) and n.id in defs and n.id != name}
    helpers = set(defs) - launched
    for name in sorted(helpers - named):
        errors.append(f"@triton.jit {name} is neither launched nor called by a kernel: not covered")
    return launched, helpers & named, errors
