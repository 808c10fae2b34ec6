"""Checks that every packkit CUDA kernel can launch on every architecture the wheel ships.

A kernel compiles for every architecture and still fails at launch ("too many resources requested for
launch") when its registers x its block size exceed the 65,536 registers a block may hold, and the register
count changes per architecture: ``layout_kernel`` at 1,024 threads used 40 registers on sm_80 but 88 on sm_90
(issue 48). Nothing runs a kernel on the CPU machine, so this reads what ptxas reports instead:

1. compiles every ``.cu`` under csrc/ once, for every architecture in tools/build_wheel.sh's default
   ``PACKKIT_CUDA_ARCHS`` (the ``-real`` entries; ``-virtual`` PTX is compiled on the user's GPU), with
   ``--resource-usage``, sources in parallel (this also is the CI compile check: an error fails);
2. takes each kernel's block size from the source: every launch site ``kernel<...><<<grid, block, smem, ...>>>``
   in the kernel's file, ``block`` and ``smem`` evaluated from integer literals and the file's (or its quoted
   headers') ``constexpr`` integers; ``__launch_bounds__(n)`` bounds it. A kernel with no launch site, or a block
   or shared-memory size that is not such a constant (say a value computed at run time), fails: the check
   cannot vouch for it, so the kernel must get a constant or ``__launch_bounds__``;
3. fails when registers x block (allocated per warp, in units of 256 registers) > 65,536, a block is over
   1,024 threads, not a multiple of 32, or over the kernel's ``__launch_bounds__``, static shared memory
   > 48 KiB, or static + dynamic shared memory > the architecture's per-block maximum.

Prints one row per kernel and architecture with registers, block, registers per block, shared memory and spill
bytes (spills are reported, not failed: they cost speed, not correctness).

    python tools/check_cuda_resources.py                 # every csrc/**/*.cu, the wheel's archs
    python tools/check_cuda_resources.py --arch sm_90a X.cu
Exit status 1 on any violation or compile error, 2 when nvcc is missing.
"""
from __future__ import annotations

import argparse
import ast
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REGS_PER_BLOCK = 65536
MAX_THREADS = 1024
STATIC_SMEM = 48 * 1024
# Largest shared memory one block may use (static + dynamic, after cudaFuncSetAttribute), per major arch:
# sm_80 163 KiB, sm_90 / sm_100 227 KiB (CUDA C Programming Guide, compute capabilities table).
MAX_SMEM = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}
TORCH_TARGET_VERSION = "0x020a000000000000"  # as the CI compile check and CMakeLists build them


@dataclass
class Usage:
    """What ptxas reported for one entry function on one architecture."""
    mangled: str
    arch: str
    registers: int = 0
    smem: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


@dataclass
class Launch:
    """What the source says about how a kernel is launched."""
    blocks: list = field(default_factory=list)  # evaluated block sizes of every launch site
    smem: list = field(default_factory=list)  # evaluated dynamic shared memory of every launch site
    bounds: int | None = None  # __launch_bounds__ max threads
    errors: list = field(default_factory=list)


# --- architectures ----------------------------------------------------------------------------------
def wheel_archs(build_wheel: Path = ROOT / "tools" / "build_wheel.sh") -> list:
    """The SASS architectures of the release wheel: build_wheel.sh's default PACKKIT_CUDA_ARCHS, -real
    and plain entries (``90a-real`` -> ``sm_90a``); -virtual entries are PTX, compiled on the GPU."""
    m = re.search(r"PACKKIT_CUDA_ARCHS:-([^}]+)\}", build_wheel.read_text())
    if not m:
        raise SystemExit(f"cannot find the default PACKKIT_CUDA_ARCHS in {build_wheel}")
    archs = []
    for entry in m.group(1).split(";"):
        num, _, kind = entry.strip().partition("-")
        if kind in ("", "real"):
            archs.append(f"sm_{num}")
    return archs


def arch_major(arch: str) -> int:
    return int(re.match(r"sm_(\d+)", arch).group(1))


# --- ptxas output -------------------------------------------------------------------------------------
ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> list:
    """Entry functions with their registers, static shared memory, stack and spills (``--resource-usage``)."""
    out, cur = [], None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            cur = Usage(m.group(1), m.group(2))
            out.append(cur)
            continue
        if cur is None:
            continue
        m = PROPS.search(line)
        if m:
            cur.stack, cur.spill_stores, cur.spill_loads = (int(g) for g in m.groups())
        m = USED.search(line)
        if m:
            cur.registers = int(m.group(1))
            s = SMEM.search(line)
            cur.smem = int(s.group(1)) if s else 0
            cur = None  # the "Used" line ends an entry's report
    return out


def kernel_name(mangled: str) -> str:
    """The unqualified function name of an Itanium-mangled (or plain extern "C") kernel symbol."""
    if not mangled.startswith("_Z"):
        return mangled
    i = 2
    nested = mangled[i] == "N"
    if nested:
        i += 1
    last = None
    while i < len(mangled) and mangled[i].isdigit():
        m = re.match(r"\d+", mangled[i:])
        n = int(m.group(0))
        i += len(m.group(0))
        last = mangled[i:i + n]
        i += n
        if not nested:
            break
    if last is None:
        raise ValueError(f"cannot read the kernel name of {mangled}")
    return last


def display_name(mangled: str) -> str:
    """``name<template args>`` for the table (c++filt where present, else the bare name)."""
    base = kernel_name(mangled)
    if shutil.which("c++filt"):
        full = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
        at = full.find(base + "<")
        if at >= 0:
            depth, j = 0, at + len(base)
            for j in range(at + len(base), len(full)):
                depth += {"<": 1, ">": -1}.get(full[j], 0)
                if depth == 0:
                    break
            return full[at:j + 1]
    return base


# --- the source's launch sizes --------------------------------------------------------------------------
CONSTEXPR = re.compile(r"constexpr\s+(?:unsigned\s+|signed\s+)?(?:int|long|int32_t|int64_t|uint32_t|uint64_t|"
                       r"size_t|unsigned)\s+(\w+)\s*=\s*([^;]+);")
KERNEL_DEF = re.compile(r"__global__\s+(?:__launch_bounds__\s*\(([^)]*)\)\s+)?void\s+"
                        r"(?:__launch_bounds__\s*\(([^)]*)\)\s+)?(\w+)\s*\(")
BRACE_INIT = re.compile(r"\b(?:int|int32_t|int64_t|uint32_t|uint64_t|size_t|unsigned)\s*\{([^{}]*)\}")


def source_text(path: Path) -> str:
    """The .cu with its quoted local headers (where its constexpr sizes may live), comments removed."""
    seen, parts = set(), []

    def add(p: Path):
        if p in seen or not p.exists():
            return
        seen.add(p)
        text = p.read_text()
        for inc in re.findall(r'#include\s+"([^"]+)"', text):
            add((p.parent / inc).resolve())
        parts.append(text)

    add(path.resolve())
    text = "\n".join(parts)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def constants(text: str) -> dict:
    return {name: expr.strip() for name, expr in CONSTEXPR.findall(text)}


def evaluate(expr: str, consts: dict, depth: int = 0) -> int:
    """An integer constant expression of literals, the given constexprs, + - * / % and parentheses;
    ValueError for anything else (a run-time value)."""
    if depth > 20:
        raise ValueError(f"constants nest too deep at {expr!r}")
    expr = BRACE_INIT.sub(r"(\1)", expr.strip())
    expr = re.sub(r"\b(\d+)(?:[uU]?[lL]{0,2}|[lL]{1,2}[uU]?)\b", r"\1", expr)  # 1024u, 256LL
    try:
        tree = ast.parse(expr.replace("/", "//"), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not a constant expression: {expr!r}") from e

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in consts:
                raise ValueError(f"{node.id!r} is not a constexpr integer of the kernel's file")
            return evaluate(consts[node.id], consts, depth + 1)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
            if type(node.op) in ops:
                return ops[type(node.op)]()
        raise ValueError(f"not a constant expression: {expr!r}")

    return ev(tree)


def split_top(args: str) -> list:
    """Comma-separated arguments at nesting depth 0 (parentheses, brackets, braces)."""
    out, depth, cur = [], 0, ""
    for ch in args:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [a.strip() for a in out]


def launches(text: str) -> dict:
    """kernel name -> Launch: its __launch_bounds__ and the evaluated block / dynamic shared memory of
    every ``name<...><<<...>>>`` launch site in text."""
    consts = constants(text)
    info: dict = {}
    for m in KERNEL_DEF.finditer(text):
        name = m.group(3)
        lb = m.group(1) or m.group(2)
        launch = info.setdefault(name, Launch())
        if lb:
            try:
                launch.bounds = evaluate(split_top(lb)[0], consts)
            except ValueError as e:
                launch.errors.append(f"__launch_bounds__: {e}")
    for m in re.finditer(r"\b(\w+)\s*(?:<[^;<>]*(?:<[^;<>]*>[^;<>]*)*>)?\s*<<<(.*?)>>>", text, flags=re.S):
        name, args = m.group(1), split_top(m.group(2))
        launch = info.setdefault(name, Launch())
        if len(args) < 2:
            launch.errors.append(f"launch site without a block size: <<<{m.group(2)}>>>")
            continue
        try:
            launch.blocks.append(evaluate(args[1], consts))
        except ValueError as e:
            launch.errors.append(f"block size {args[1]!r}: {e}")
        try:
            launch.smem.append(evaluate(args[2], consts) if len(args) > 2 else 0)
        except ValueError as e:
            launch.errors.append(f"dynamic shared memory {args[2]!r}: {e}")
    return info


# --- the check ------------------------------------------------------------------------------------------
def regs_per_block(registers: int, threads: int) -> int:
    """Registers a block of `threads` holds: allocated per warp, in units of 256 (8 per thread)."""
    return math.ceil(registers / 8) * 8 * 32 * math.ceil(threads / 32)


def check_kernel(u: Usage, launch: Launch | None) -> tuple:
    """(block, dynamic smem, problems) for one kernel on one arch."""
    problems = []
    if launch is None or (not launch.blocks and launch.bounds is None) or launch.errors:
        why = "; ".join(launch.errors) if launch and launch.errors else "no launch site and no __launch_bounds__"
        return None, None, [f"block size unknown ({why}): give it a constexpr block or __launch_bounds__"]
    block = max(launch.blocks) if launch.blocks else launch.bounds
    dyn = max(launch.smem) if launch.smem else 0
    if launch.bounds is not None and block > launch.bounds:
        problems.append(f"block {block} > __launch_bounds__({launch.bounds})")
    if block < 1 or block > MAX_THREADS:
        problems.append(f"block {block} outside [1, {MAX_THREADS}]")
    if block % 32:
        problems.append(f"block {block} is not a multiple of the 32-thread warp")
    if regs_per_block(u.registers, block) > REGS_PER_BLOCK:
        problems.append(f"{u.registers} registers x {block} threads = {regs_per_block(u.registers, block):,} "
                        f"> {REGS_PER_BLOCK:,} registers per block")
    if u.smem > STATIC_SMEM:
        problems.append(f"static shared memory {u.smem:,} > {STATIC_SMEM:,} bytes")
    limit = MAX_SMEM.get(arch_major(u.arch), STATIC_SMEM)
    if u.smem + dyn > limit:
        problems.append(f"shared memory {u.smem:,} + {dyn:,} > {limit:,} bytes on {u.arch}")
    return block, dyn, problems


def nvcc_command(nvcc: str, src: Path, archs: list, include: str | None, obj: Path) -> list:
    cmd = [nvcc, "-std=c++17", f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}", "--resource-usage",
           "-c", str(src), "-o", str(obj)]
    for arch in archs:
        cmd += ["-gencode", f"arch=compute_{arch[3:]},code={arch}"]
    if include:
        cmd += [f"-I{include}"]
    return cmd


def torch_include() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return os.path.join(os.path.dirname(torch.__file__), "include")


def run(sources: list, archs: list, nvcc: str, include: str | None, jobs: int, out=sys.stdout) -> int:
    """Compiles, checks and prints; returns the number of failures (compile errors count)."""
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        def compile_one(i_src):
            i, src = i_src
            cmd = nvcc_command(nvcc, src, archs, include, Path(tmp) / f"{i}.o")
            return src, subprocess.run(cmd, capture_output=True, text=True)

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            results = list(pool.map(compile_one, enumerate(sources)))
    rows = []
    for src, proc in results:
        rel = os.path.relpath(src, ROOT) if src.resolve().is_relative_to(ROOT) else str(src)
        if proc.returncode != 0:
            failures += 1
            print(f"FAIL {rel}: nvcc exited {proc.returncode}\n{proc.stdout}{proc.stderr}", file=out)
            continue
        info = launches(source_text(src))
        usages = parse_ptxas(proc.stdout + proc.stderr)
        seen_archs = {u.arch for u in usages}
        if usages and seen_archs != set(archs):
            failures += 1
            print(f"FAIL {rel}: ptxas reported {sorted(seen_archs)}, expected {archs}", file=out)
        for u in usages:
            block, dyn, problems = check_kernel(u, info.get(kernel_name(u.mangled)))
            failures += bool(problems)
            rows.append((rel, display_name(u.mangled), u, block, dyn, problems))
    header = ("source", "kernel", "arch", "regs", "block", "regs/block", "smem", "dyn", "spill st/ld", "")
    table = [header] + [
        (rel, name, u.arch, str(u.registers), str(block) if block else "?",
         f"{regs_per_block(u.registers, block):,}" if block else "?", str(u.smem), str(dyn) if dyn is not None else "?",
         f"{u.spill_stores}/{u.spill_loads}", "FAIL: " + "; ".join(problems) if problems else "ok")
        for rel, name, u, block, dyn, problems in sorted(rows, key=lambda r: (r[0], r[1], r[2].arch))]
    widths = [max(len(r[c]) for r in table) for c in range(len(header) - 1)]
    for r in table:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1], file=out)
    print(f"{len(rows)} kernel x arch rows from {len(sources)} sources for {', '.join(archs)}: "
          f"{failures} failure(s)", file=out)
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sources", nargs="*", type=Path, help="the .cu files (default: every csrc/**/*.cu)")
    p.add_argument("--arch", action="append", help="sm_XX to check (default: the wheel's, build_wheel.sh)")
    p.add_argument("--nvcc", default=os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    p.add_argument("--torch-include", default=None, help="torch's include folder (default: the importable torch's)")
    p.add_argument("-j", "--jobs", type=int, default=2, help="sources compiled at once (default 2)")
    args = p.parse_args(argv)
    if not Path(args.nvcc).exists() and not shutil.which(args.nvcc):
        print(f"nvcc not found ({args.nvcc})", file=sys.stderr)
        return 2
    sources = args.sources or sorted((ROOT / "csrc").rglob("*.cu"))
    archs = args.arch or wheel_archs()
    include = args.torch_include or torch_include()
    return 1 if run(sources, archs, args.nvcc, include, args.jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
