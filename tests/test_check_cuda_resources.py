"""tools/check_cuda_resources.py: every CUDA kernel's registers x block and shared memory must fit every
architecture the wheel ships. The parsing and the block-size mapping are checked everywhere; the planted kernels
under tests/cuda_fixtures/ are compiled where nvcc exists and must be caught."""
from __future__ import annotations

import importlib.util
import io
import re
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.full

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "cuda_fixtures"
spec = importlib.util.spec_from_file_location("check_cuda_resources", ROOT / "tools" / "check_cuda_resources.py")
ccr = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = ccr  # dataclasses look their module up there
spec.loader.exec_module(ccr)

NVCC = shutil.which("nvcc") or (Path("/usr/local/cuda/bin/nvcc") if Path("/usr/local/cuda/bin/nvcc").exists() else None)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found: nothing to compile")

# What nvcc 13.0 --resource-usage printed for the unbounded layout_kernel (issue 48), trimmed.
PTXAS = """\
ptxas info    : 28 bytes gmem, 224 bytes cmem[4]
ptxas info    : Compiling entry function '_ZN7packkit3ops43_GLOBAL__N__2897a974_10_pack_op_cu_a4017e1d13layout_kernelEPKlS3_lllllbPiS4_l' for 'sm_90a'
ptxas info    : Function properties for _ZN7packkit3ops43_GLOBAL__N__2897a974_10_pack_op_cu_a4017e1d13layout_kernelEPKlS3_lllllbPiS4_l
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 88 registers, used 1 barriers, 8480 bytes smem
ptxas info    : Compile time = 117.574 ms
ptxas info    : Compiling entry function '_ZN7packkit3ops43_GLOBAL__N__2897a974_10_pack_op_cu_a4017e1d11fill_kernelImEEvPT_lS3_' for 'sm_80'
ptxas info    : Function properties for _ZN7packkit3ops43_GLOBAL__N__2897a974_10_pack_op_cu_a4017e1d11fill_kernelImEEvPT_lS3_
    128 bytes stack frame, 272 bytes spill stores, 264 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 376 bytes cmem[0]
"""


def test_parse_ptxas_and_names():
    usages = ccr.parse_ptxas(PTXAS)
    assert [(ccr.kernel_name(u.mangled), u.arch, u.registers, u.smem) for u in usages] == [
        ("layout_kernel", "sm_90a", 88, 8480), ("fill_kernel", "sm_80", 24, 0)]
    assert (usages[1].stack, usages[1].spill_stores, usages[1].spill_loads) == (128, 272, 264)
    assert ccr.kernel_name("_Z12heavy_kernelPKfPfi") == "heavy_kernel"
    assert ccr.kernel_name("plain_c_kernel") == "plain_c_kernel"


def test_wheel_archs_are_build_wheels():
    """The checked archs come from build_wheel.sh's default, so the two cannot drift apart."""
    default = re.search(r"PACKKIT_CUDA_ARCHS:-([^}]+)\}", (ROOT / "tools" / "build_wheel.sh").read_text()).group(1)
    real = [e for e in default.split(";") if not e.endswith("-virtual")]
    assert ccr.wheel_archs() == [f"sm_{e.removesuffix('-real')}" for e in real]
    assert ccr.wheel_archs() == ["sm_80", "sm_90a", "sm_100"]


def test_block_sizes_from_the_source():
    over = ccr.launches(ccr.source_text(FIXTURES / "over_limit.cu"))
    assert (over["heavy_kernel"].blocks, over["small_kernel"].blocks, over["small_kernel"].smem) == ([1024], [128], [0])
    unknown = ccr.launches(ccr.source_text(FIXTURES / "unknown_block.cu"))
    assert unknown["runtime_block_kernel"].errors and not unknown["runtime_block_kernel"].blocks
    assert unknown["bounded_kernel"].bounds == 256 and not unknown["bounded_kernel"].errors
    assert ccr.evaluate("int64_t{kThreads} * kItems", {"kThreads": "256", "kItems": "8"}) == 2048
    with pytest.raises(ValueError, match="threads"):
        ccr.evaluate("threads", {})


def test_every_packkit_kernel_has_a_known_block():
    """Each __global__ in csrc/ has launch sites whose block sizes are constants (or __launch_bounds__)."""
    sources = sorted((ROOT / "csrc").rglob("*.cu"))
    assert sources
    for src in sources:
        text = ccr.source_text(src)
        kernels = {m.group(3) for m in ccr.KERNEL_DEF.finditer(text)}
        info = ccr.launches(text)
        assert kernels, src
        for name in kernels:
            assert not info[name].errors and (info[name].blocks or info[name].bounds), (src, name, info[name])
            assert all(b % 32 == 0 and b <= 1024 for b in info[name].blocks), (src, name, info[name].blocks)


def _usage(regs, smem=0, arch="sm_90a"):
    return ccr.Usage("_Z1kv", arch, registers=regs, smem=smem)


def test_limits():
    launch = ccr.Launch(blocks=[1024], smem=[0])
    assert ccr.check_kernel(_usage(88), launch)[2]  # issue 48: 90,112 registers
    assert not ccr.check_kernel(_usage(64), launch)[2]  # exactly 65,536
    assert ccr.check_kernel(_usage(63), launch)[2] == []
    assert ccr.regs_per_block(61, 512) == 64 * 512  # allocated 8 per thread at a time
    assert ccr.check_kernel(_usage(65), launch)[2]
    assert ccr.check_kernel(_usage(32), ccr.Launch(blocks=[100], smem=[0]))[2]  # not a warp multiple
    assert ccr.check_kernel(_usage(32), ccr.Launch(blocks=[512], smem=[0], bounds=256))[2]  # over its bounds
    assert ccr.check_kernel(_usage(32, smem=49 * 1024), ccr.Launch(blocks=[256], smem=[0]))[2]
    assert ccr.check_kernel(_usage(32, arch="sm_80"), ccr.Launch(blocks=[256], smem=[200 * 1024]))[2]
    assert not ccr.check_kernel(_usage(32, arch="sm_90a"), ccr.Launch(blocks=[256], smem=[200 * 1024]))[2]
    assert ccr.check_kernel(_usage(32), None)[0] is None  # unknown kernel: no block, a failure
    assert ccr.check_kernel(_usage(32), ccr.Launch(bounds=256))[:2] == (256, 0)


@needs_nvcc
def test_planted_kernels_are_caught():
    """Compiled for sm_90a: the 128-register kernel at 1,024 threads, the run-time block, the 100-thread block
    and the 300 KiB of dynamic shared memory fail; the legal kernels beside them pass."""
    out = io.StringIO()
    sources = [FIXTURES / "over_limit.cu", FIXTURES / "unknown_block.cu", FIXTURES / "odd_block.cu"]
    failures = ccr.run(sources, ["sm_90a"], str(NVCC), None, 2, out=out)
    text = out.getvalue()
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("tests/")}
    assert set(rows) == {"heavy_kernel", "small_kernel", "runtime_block_kernel", "bounded_kernel", "odd_kernel",
                         "smem_kernel"}, text
    failed = {name for name, line in rows.items() if "FAIL" in line}
    assert failed == {"heavy_kernel", "runtime_block_kernel", "odd_kernel", "smem_kernel"}, text
    assert failures == 4
    assert "registers per block" in rows["heavy_kernel"] and "block size unknown" in rows["runtime_block_kernel"]


@needs_nvcc
def test_exit_status(tmp_path):
    """main(): 1 on a violation, 0 on a clean source, 1 on a compile error."""
    ok = tmp_path / "ok.cu"
    ok.write_text("constexpr int kT = 256;\n__global__ void k(float* o) { o[threadIdx.x] = 0.f; }\n"
                  "void go(float* o) { k<<<1, kT>>>(o); }\n")
    broken = tmp_path / "broken.cu"
    broken.write_text("__global__ void k(float* o) { o[threadIdx.x] = undefined_name; }\n")
    args = ["--arch", "sm_80", "--nvcc", str(NVCC), "--torch-include", str(tmp_path)]
    assert ccr.main(args + [str(ok)]) == 0
    assert ccr.main(args + [str(broken)]) == 1
    assert ccr.main(args + [str(FIXTURES / "over_limit.cu")]) == 1
