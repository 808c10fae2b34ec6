"""backend="auto" on CUDA uses only a device path that passed its self-check here (issue 48, part 2).

No GPU needed: the seam is the child's command line (``backend_check.selfcheck_command``). The "cuda" and "triton"
children run the real CPU self-check with a fault planted in one check (``selfcheck --plant``): a SIGSEGV, a wrong
answer, a hang. The parent must see each as a failed check, fall back CUDA -> Triton -> CPU ops, warn once naming the
check and the cache file, cache the verdict per build and GPU, and after the first call choose without any child.
An ``_ops_cuda.so`` that does not load must not break ``import packkit`` (item 9)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

import packkit
from packkit.packing import backend_check
from packkit.packing.sequences import _backend_for, _op

pytestmark = pytest.mark.full

CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A pretend GPU whose two device paths run the CPU self-check with the faults of ``plants[backend]``."""
    monkeypatch.setenv("PACKKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PACKKIT_BACKEND", raising=False)
    monkeypatch.setattr(backend_check, "_gpu_name", lambda index: "Planted GPU 80GB")
    monkeypatch.setattr(backend_check._ops, "HAS_CUDA_KERNELS", True)
    monkeypatch.setattr(backend_check, "_missing", lambda backend: None)
    plants, children = {}, []

    def command(backend, index=None, crash_control=False):
        children.append(backend)
        cmd = [sys.executable, "-m", "packkit.tools.selfcheck", "cpu"]
        return cmd + (["--plant", plants[backend]] if plants.get(backend) else [])

    monkeypatch.setattr(backend_check, "selfcheck_command", command)
    backend_check._reset_for_tests()
    yield plants, children
    backend_check._reset_for_tests()


def choose(expect_warning: bool):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = _backend_for(CUDA0, "auto")
    ours = [w for w in caught if "self-check" in str(w.message)]
    assert len(ours) == (1 if expect_warning else 0), [str(w.message) for w in caught]
    return chosen, str(ours[0].message) if ours else None


def cache_files():
    return sorted(p.name for p in backend_check.cache_dir().glob("backend-check-*.json"))


def test_all_pass_uses_cuda_checks_once_and_caches(gpu):
    plants, children = gpu
    assert choose(expect_warning=False) == ("cuda", None)
    assert children == ["cuda"]  # the first passing path ends the checks
    assert choose(expect_warning=False) == ("cuda", None) and children == ["cuda"]  # no second child
    assert len(cache_files()) == 1
    backend_check._reset_for_tests()  # a new process: reads the verdict, runs no child
    assert choose(expect_warning=False) == ("cuda", None) and children == ["cuda"]


@pytest.mark.parametrize("plant, detail", [("segv:pack_batch", "CRASH (process killed by SIGSEGV)"),
                                           ("wrong:pack", "FAIL (AssertionError: pack: planted wrong result)"),
                                           ("hang:layout", "CRASH (timed out after 20 s)")])
def test_a_failed_cuda_check_falls_back_to_triton(gpu, monkeypatch, plant, detail):
    plants, children = gpu
    run = backend_check.run_selfcheck  # the hanging child gets 20 s, the others the default

    def timed(backend, index=None, **kw):
        return run(backend, index, timeout=20 if plant.startswith("hang") and backend == "cuda" else None)

    monkeypatch.setattr(backend_check, "run_selfcheck", timed)
    plants["cuda"] = plant
    chosen, message = choose(expect_warning=True)
    assert chosen == "triton" and children == ["cuda", "triton"]
    check = plant.split(":")[1]
    # A loaded machine may take the 20 s to start the child: then the timeout names no check yet.
    named = f"cuda {check}: {detail}" in message or (plant.startswith("hang") and f"cuda checks: {detail}" in message)
    assert named, message
    assert "compiled Triton kernels" in message
    path = backend_check.cache_dir() / cache_files()[0]
    assert str(path) in message and path.exists()
    assert choose(expect_warning=False)[0] == "triton"  # one warning per process
    backend_check._reset_for_tests()  # a new process: the cached verdict, warned again, no child
    assert choose(expect_warning=True)[0] == "triton" and children == ["cuda", "triton"]


def test_both_fail_falls_back_to_the_cpu_ops(gpu):
    plants, children = gpu
    plants["cuda"], plants["triton"] = "segv:layout", "wrong:unpack"
    chosen, message = choose(expect_warning=True)
    assert chosen == backend_check.HOST and children == ["cuda", "triton"]
    assert "CPU ops" in message and "cuda layout: CRASH" in message and "(and 1 more)" in message


def test_the_verdict_is_per_gpu_and_build(gpu, monkeypatch):
    plants, children = gpu
    plants["cuda"] = "wrong:pack"
    assert choose(expect_warning=True)[0] == "triton"
    backend_check._reset_for_tests()
    monkeypatch.setattr(backend_check, "_gpu_name", lambda index: "Another GPU")
    plants["cuda"] = None
    assert choose(expect_warning=False)[0] == "cuda"  # its own check: the other GPU's verdict does not apply
    assert len(cache_files()) == 2
    backend_check._reset_for_tests()
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".other")
    assert choose(expect_warning=False)[0] == "cuda" and len(cache_files()) == 3 and len(children) == 4


def test_a_corrupt_cache_file_is_checked_again(gpu):
    plants, children = gpu
    choose(expect_warning=False)
    (backend_check.cache_dir() / cache_files()[0]).write_text('{"format": 1, "chosen": "cuda"')
    backend_check._reset_for_tests()
    assert choose(expect_warning=False)[0] == "cuda" and children == ["cuda", "cuda"]


@pytest.mark.parametrize("value, expected", [("cuda", "cuda"), ("triton", "triton"), ("CPU", backend_check.HOST)])
def test_packkit_backend_forces_one_without_a_check(gpu, monkeypatch, value, expected):
    plants, children = gpu
    plants["cuda"] = "segv:layout"
    monkeypatch.setenv("PACKKIT_BACKEND", value)
    assert choose(expect_warning=False)[0] == expected and children == [] and cache_files() == []


def test_packkit_backend_refuses_unknown_values(gpu, monkeypatch):
    monkeypatch.setenv("PACKKIT_BACKEND", "gpu")
    with pytest.raises(ValueError, match="PACKKIT_BACKEND='gpu'; allowed: cuda, triton, cpu"):
        _backend_for(CUDA0, "auto")
    monkeypatch.setenv("PACKKIT_BACKEND", "cuda")
    monkeypatch.setattr(backend_check._ops, "HAS_CUDA_KERNELS", False)
    with pytest.raises(ValueError, match="PACKKIT_BACKEND=cuda but packkit's CUDA kernels are not loaded"):
        _backend_for(CUDA0, "auto")


def test_cpu_tensors_and_explicit_backends_need_no_check(gpu):
    plants, children = gpu
    assert _backend_for(torch.device("cpu"), "auto") == "cpu"
    assert _backend_for(CUDA0, "triton") == "triton" and children == []


def test_the_hot_path_is_a_lookup(gpu, monkeypatch):
    choose(expect_warning=False)
    monkeypatch.setattr(backend_check, "_decide", lambda index: pytest.fail("decided again"))
    for _ in range(100):
        assert _backend_for(CUDA0, "auto") == "cuda"


def test_host_ops_equal_the_cpu_ops():
    """The last resort runs the CPU op itself; out-variants write their outputs (schema's written arguments)."""
    from pack_samples import make_case

    case = make_case(3, dtype=torch.int64, flat=False, extra_rows=1, max_seqs=8)
    n_cu = case.layout.num_cu_seqlens
    args = (case.src, None, case.src_offsets, *case.plan_tensors, case.num_rows, case.row_len, False, n_cu)
    want = torch.ops.packkit.pack_batch(*args)
    got = _op("pack_batch", backend_check.HOST)(*args)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    outs = [torch.full_like(t, -7) for t in want] + [torch.full((n_cu - 1,), -7, dtype=torch.int32)]
    _op("pack_batch_out", backend_check.HOST)(*args[:7], False, *outs)
    assert all(torch.equal(a, b) for a, b in zip(want, outs))


def test_a_broken_ops_cuda_so_does_not_break_import(tmp_path):
    """Item 9: an _ops_cuda.so that exists but does not load (built for another torch: an undefined symbol; or not
    an ELF file at all) costs the CUDA kernels with a warning, never ``import packkit``."""
    planted = [tmp_path / "garbage_ops_cuda.so"]
    planted[0].write_bytes(b"not an ELF file\n" * 64)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:  # a real shared library needing a symbol no torch has: what an ABI mismatch looks like
        src = tmp_path / "abi.c"
        src.write_text("extern void torch_symbol_of_another_abi(void);\nvoid packkit_probe(void) "
                       "{ torch_symbol_of_another_abi(); }\n")
        so = tmp_path / "abi_ops_cuda.so"
        subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
        planted.append(so)
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import packkit, torch\n"
            "from packkit.packing import ops\n"
            "print('HAS', ops.HAS_CUDA_KERNELS)\n"
            "print('WHY', ops.cuda_kernels_status())\n"
            "b = packkit.pack_sequences([[1, 2, 3], [4, 5]], capacity=8)\n"
            "print('PACKED', b['input_ids'].tolist())\n")
    for so in planted:
        env = dict(os.environ, PACKKIT_OPS_CUDA_SO=str(so))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "HAS False" in proc.stdout and f"WHY {so.name} did not load: OSError" in proc.stdout, proc.stdout
        assert "PACKED [[1, 2, 3, 4, 5]]" in proc.stdout
        assert f"{so} did not load" in proc.stderr and "the CUDA kernels are disabled" in proc.stderr, proc.stderr
        if so.name.startswith("abi"):
            assert "undefined symbol: torch_symbol_of_another_abi" in proc.stdout
