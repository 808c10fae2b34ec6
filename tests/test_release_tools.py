"""The release checks (issue 31) on binaries made here: the ELF symbol-version reader `packkit info` uses
agrees with binutils, and tools/check_abi_symbols.py fails a wheel whose binaries need newer glibc symbols than
its manylinux tag promises, or that has no manylinux tag at all."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from packkit.tools.elf import newest_versions, read_elf

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.full, pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None,
                                reason="needs gcc and binutils")]


def _check_abi():
    spec = importlib.util.spec_from_file_location("check_abi_symbols", ROOT / "tools" / "check_abi_symbols.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def modern_so(tmp_path_factory) -> Path:
    """A shared library built with this machine's gcc and glibc, using a function whose symbol version
    moved in glibc 2.34 (pthread_once, merged into libc) and libstdc++ as a C++ module would."""
    d = tmp_path_factory.mktemp("so")
    src = d / "m.cpp"
    src.write_text('#include <pthread.h>\n#include <string>\n#include <stdexcept>\n'
                   'static pthread_once_t once = PTHREAD_ONCE_INIT; static void init() {}\n'
                   'extern "C" int f(const char* s) { pthread_once(&once, init); std::string t(s);'
                   ' if (t.empty()) throw std::runtime_error(t); return (int)t.size(); }\n')
    out = d / "_ops.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out


def _libc_version() -> tuple:
    return tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split("."))


def test_elf_versions_match_objdump(modern_so):
    elf = read_elf(modern_so)
    objdump = subprocess.run(["objdump", "-T", str(modern_so)], capture_output=True, text=True, check=True).stdout
    ours = {v for names in elf.versions.values() for v in names}
    theirs = {tok.strip("()") for line in objdump.splitlines() for tok in line.split()
              if tok.strip("()").startswith(("GLIBC_", "GLIBCXX_", "CXXABI_", "GCC_"))}
    assert theirs <= ours  # objdump lists versions of undefined symbols; .gnu.version_r holds every needed one
    assert "libc.so.6" in elf.versions and "libstdc++.so.6" in elf.versions
    newest = newest_versions(elf.versions)
    assert set(newest) >= {"GLIBC", "GLIBCXX", "CXXABI"}
    if _libc_version() >= (2, 34):
        assert tuple(map(int, newest["GLIBC"].split("."))) >= (2, 34)


def _wheel(tmp_path: Path, so: Path, platform: str) -> Path:
    wheel = tmp_path / f"packkit-0.1.0-cp311-cp311-{platform}.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(so, "packkit/_ops.so")
    return wheel


def _torch_dir() -> Path:
    return Path(torch.__file__).parent


@pytest.mark.skipif(_libc_version() < (2, 34), reason="the host glibc is old enough for manylinux_2_28 anyway")
def test_symbols_newer_than_tag_fail(modern_so, tmp_path, capsys):
    check = _check_abi().check
    assert check(_wheel(tmp_path, modern_so, "manylinux_2_24_x86_64.manylinux_2_28_x86_64"), _torch_dir()) == 1
    out = capsys.readouterr().out
    assert "NEWER THAN ITS TAG manylinux_2_24" in out and "GLIBC_2.3" in out
    # The tag its symbols do satisfy (this machine's own glibc) passes the version check.
    major, minor = _libc_version()[:2]
    tag = f"manylinux_{major}_{minor}_x86_64"
    module = _check_abi()
    module.MANYLINUX[(major, minor)] = {"GLIBC": f"{major}.{minor}", "GLIBCXX": "3.4.99", "CXXABI": "1.3.99"}
    assert module.check(_wheel(tmp_path, modern_so, tag), _torch_dir()) == 0, capsys.readouterr().out


def test_linux_tag_is_not_a_release(modern_so, tmp_path, capsys):
    assert _check_abi().check(_wheel(tmp_path, modern_so, "linux_x86_64"), _torch_dir()) == 1
    assert "NOT A RELEASE TAG: linux_x86_64" in capsys.readouterr().out


def test_build_backend_refuses_without_torch(tmp_path):
    """tools/build_backend: where torch cannot be imported, every wheel hook stops with the instructions
    (pip then never resolves `torch>=2.10` into a CUDA download); the sdist hook needs no torch."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); sys.modules['torch'] = None\n"
            "import importlib.util; importlib.util.find_spec = lambda name, *a: None if name == 'torch' else "
            "__import__('importlib.machinery').machinery.PathFinder.find_spec(name)\n"
            "import packkit_backend as b\n"
            "for hook in ('get_requires_for_build_wheel', 'get_requires_for_build_editable'):\n"
            "    try:\n        getattr(b, hook)()\n    except RuntimeError as e:\n        print('REFUSED', hook, str(e)[:60])\n"
            "print('SDIST', callable(b.build_sdist))\n")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "tools" / "build_backend")], capture_output=True,
                         text=True, check=True).stdout
    assert out.count("REFUSED") == 2 and "packkit builds its ops against the torch that is installed" in out
    assert "SDIST True" in out
