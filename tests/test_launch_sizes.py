"""csrc/ops/launch_sizes.hpp, the host arithmetic of every CUDA launch, compiled with g++ and checked at the
largest sizes the ops accept (issue 48): grid.x stays within 2^31 - 1 blocks or the launch is refused on the
host, grid-stride launches are capped, nothing overflows int64, and a misaligned address gets a narrower word
(a 16-byte ulonglong2 load of an 8-byte-aligned address faults)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.core, pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")]

MAX_GRID_X = 2**31 - 1
MAX_TOKENS = 2**31 - 1  # checked_total_tokens: num_rows * row_len < 2^31 (int32 cu_seqlens)
TILE = 256 * 8  # pack_op.cu: kThreads * kItems positions per block
INT64_MAX = 2**63 - 1

# (expression, expected): evaluated in C++ and compared here.
CASES = [
    ("tiles(0, 2048)", 0), ("tiles(1, 2048)", 1), ("tiles(2048, 2048)", 1), ("tiles(2049, 2048)", 2),
    # pack_batch at the largest batch: one int per position
    (f"tiles({MAX_TOKENS}LL, {TILE})", -(-MAX_TOKENS // TILE)),
    # pack with F feature words per token: fits up to F = 2048 at the largest batch, refused past it
    (f"tiles({MAX_TOKENS}LL * 2048, {TILE})", -(-(MAX_TOKENS * 2048) // TILE)),
    (f"tiles({MAX_TOKENS}LL * 2049, {TILE})", -1),
    (f"tiles({MAX_GRID_X}LL * {TILE}, {TILE})", MAX_GRID_X), (f"tiles({MAX_GRID_X}LL * {TILE} + 1, {TILE})", -1),
    (f"tiles({INT64_MAX}LL, {TILE})", -1),  # no overflow in the rounding
    # the grid-stride launches: unpack's fill, cp_shard, tree_pack
    (f"strided({MAX_TOKENS}LL * 16, 256, 65536)", 65536), ("strided(300, 256, 65535)", 2),
    (f"strided({INT64_MAX}LL, 256, 65535)", 65535), ("strided(0, 256, 65535)", 0),
    # words: the element size where every address allows it, else the widest power of two that does
    ("aligned_word(16, {(const void*)0x1000, (const void*)0x2010})", 16),
    ("aligned_word(16, {(const void*)0x1008, (const void*)0x2000})", 8),
    ("aligned_word(16, {(const void*)0x1004})", 4),
    ("aligned_word(8, {(const void*)0x1001})", 1),
    ("aligned_word(2, {(const void*)0x1000})", 2),
    ("aligned_word(1, {(const void*)0x1003})", 1),
    ("aligned_word(4, {(const void*)0x1002, (const void*)0x1000})", 2),
]


def test_launch_arithmetic(tmp_path):
    lines = "\n".join(f'  std::cout << ({expr}) << "\\n";' for expr, _ in CASES)
    (tmp_path / "t.cpp").write_text(
        '#include <iostream>\n#include "launch_sizes.hpp"\nusing namespace packkit::ops::launch;\n'
        f"int main() {{\n{lines}\n  return 0;\n}}\n")
    subprocess.run(["g++", "-std=c++17", "-O1", "-fsanitize=undefined", "-fno-sanitize-recover=all",
                    f"-I{ROOT / 'csrc' / 'ops'}", str(tmp_path / "t.cpp"), "-o", str(tmp_path / "t")], check=True)
    got = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout.split()
    assert [int(v) for v in got] == [want for _, want in CASES]


def test_block_sizes_are_warp_multiples():
    """The constants the launches use (the resource check reads the same ones, per architecture)."""
    import re
    for src in (ROOT / "csrc").rglob("*.cu"):
        for name, value in re.findall(r"constexpr int (k\w*Threads) = (\d+);", src.read_text()):
            assert int(value) % 32 == 0 and int(value) <= 1024, (src.name, name, value)
