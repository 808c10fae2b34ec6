"""Checks a packkit wheel's compiled modules against the oldest torch it must run on, with ``nm -D``:

* every symbol a module imports from torch (the stable C shim: ``aoti_torch_*``, ``torch_*``) is defined
  in that torch's libraries (libtorch_cpu, libtorch_cuda, libc10);
* no module imports a C++ symbol of torch (``c10::``, ``at::``, ``torch::``): those are not part of the
  stable ABI and change between versions;
* every module needs the shared C++ runtime (DT_NEEDED libstdc++.so.6 and libgcc_s.so.1): a module with
  its own copy cannot pass a C++ exception into torch, so every error it raises kills the process.

* every module's newest GLIBC / GLIBCXX / CXXABI symbol version is within what the wheel's platform tag
  promises (the oldest manylinux tag in its file name; the limits are auditwheel's policy): a module built
  outside the release build root (glibc 2.36, gcc 12) needs GLIBC_2.34 and fails here. A ``linux_x86_64``
  wheel fails: no package index takes it.

    python tools/check_abi_symbols.py dist/packkit-...whl /path/to/site-packages/torch
Exit status 1 on any violation.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

TORCH_LIBS = ("libtorch_cpu.so", "libtorch_cuda.so", "libc10.so", "libc10_cuda.so", "libtorch.so")
SHARED_RUNTIME = ("libstdc++.so.6", "libgcc_s.so.1")
TORCH_C_API = re.compile(r"^(aoti_torch_|torch_)")
TORCH_CXX = re.compile(r"^_Z\w*(N3c10|N2at|N5torch)")  # mangled names in torch's C++ namespaces
VERSIONED = re.compile(r"@+(GLIBCXX|CXXABI|GLIBC|GCC)_([\d.]+)$")
# The newest version each manylinux platform provides (auditwheel 6.8's policy file, x86_64).
MANYLINUX = {(2, 17): {"GLIBC": "2.17", "GLIBCXX": "3.4.19", "CXXABI": "1.3.7"},
             (2, 24): {"GLIBC": "2.24", "GLIBCXX": "3.4.22", "CXXABI": "1.3.10"},
             (2, 27): {"GLIBC": "2.27", "GLIBCXX": "3.4.24", "CXXABI": "1.3.11"},
             (2, 28): {"GLIBC": "2.28", "GLIBCXX": "3.4.24", "CXXABI": "1.3.11"},
             (2, 31): {"GLIBC": "2.31", "GLIBCXX": "3.4.28", "CXXABI": "1.3.12"},
             (2, 34): {"GLIBC": "2.34", "GLIBCXX": "3.4.29", "CXXABI": "1.3.13"}}


def nm(path: Path, *flags: str) -> list[tuple[str, str]]:
    """(type, name) of the dynamic symbols of ``path``."""
    out = subprocess.run(["nm", "-D", *flags, str(path)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            rows.append((parts[-2], parts[-1]))
    return rows


def needed(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def key(v: str) -> tuple:
    return tuple(int(x) for x in v.split("."))


def newest(versions: list[str]) -> str:
    return max(versions, key=key) if versions else "-"


def platform_limits(wheel: Path):
    """(tag, limits) of the oldest manylinux tag in the wheel's file name, or (platform, None)."""
    platforms = wheel.name[:-len(".whl")].split("-")[-1].split(".")
    tags = sorted((int(m.group(1)), int(m.group(2))) for m in
                  (re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", p) for p in platforms) if m)
    if not tags:
        return ".".join(platforms), None
    if tags[0] not in MANYLINUX:
        return f"manylinux_{tags[0][0]}_{tags[0][1]}", {}
    return f"manylinux_{tags[0][0]}_{tags[0][1]}", MANYLINUX[tags[0]]


def check(wheel: Path, torch_dir: Path) -> int:
    lib_dir = torch_dir / "lib"
    provided = set()
    libs = [lib_dir / name for name in TORCH_LIBS if (lib_dir / name).exists()]
    for lib in libs:
        provided.update(name.split("@")[0] for kind, name in nm(lib, "--defined-only") if kind in "TtWiVvBDR")
    print(f"torch libraries checked against: {', '.join(p.name for p in libs)} in {lib_dir}")
    cuda_torch = (lib_dir / "libtorch_cuda.so").exists()
    errors = 0
    tag, limits = platform_limits(wheel)
    if limits is None:
        print(f"NOT A RELEASE TAG: {tag} (package indexes take manylinux_2_X_x86_64; build with tools/build_wheel.sh)")
        errors += 1
    elif not limits:
        print(f"UNKNOWN TAG {tag}: no symbol limits known for it")
        errors += 1
    else:
        print(f"platform tag {tag}: symbols up to " + ", ".join(f"{k}_{v}" for k, v in limits.items()))
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            modules = [n for n in z.namelist() if n.endswith(".so")]
            z.extractall(tmp, modules)
        for name in sorted(modules):
            path = Path(tmp) / name
            undefined = [sym for _, sym in nm(path, "--undefined-only")]
            torch_c = sorted({s.split("@")[0] for s in undefined if TORCH_C_API.match(s)})
            torch_cxx = sorted({s.split("@")[0] for s in undefined if TORCH_CXX.match(s)})
            missing = [s for s in torch_c if s not in provided]
            versions: dict[str, list[str]] = {}
            for s in undefined:
                m = VERSIONED.search(s)
                if m:
                    versions.setdefault(m.group(1), []).append(m.group(2))
            libs_needed = needed(path)
            static = [lib for lib in SHARED_RUNTIME if lib not in libs_needed]
            print(f"{name}: {len(torch_c)} torch C-shim symbols, {len(missing)} missing; "
                  f"{len(torch_cxx)} torch C++ symbols; needs " + ", ".join(
                      f"{k}_{newest(v)}" for k, v in sorted(versions.items())))
            if name.endswith("_ops_cuda.so") and not cuda_torch:
                print("  (a CUDA module checked against a CPU torch: its CUDA shim symbols cannot be found there)")
            for s in missing:
                print(f"  MISSING in this torch: {s}")
            for s in torch_cxx:
                print(f"  NOT STABLE ABI (torch C++ symbol): {s}")
            if static:
                print(f"  C++ RUNTIME NOT SHARED: no DT_NEEDED {', '.join(static)} (linked statically?): a C++ "
                      "exception raised in this module cannot pass into torch")
            too_new = [f"{k}_{newest(v)} (> {k}_{limits[k]})" for k, v in sorted(versions.items())
                       if limits and k in limits and key(newest(v)) > key(limits[k])]
            if too_new:
                print(f"  NEWER THAN ITS TAG {tag}: needs {', '.join(too_new)}: it will not load on every {tag} system")
            errors += len(missing) + len(torch_cxx) + len(static) + len(too_new)
    print("symbol check:", "PASS" if errors == 0 else f"FAIL ({errors} problems)")
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(check(Path(sys.argv[1]), Path(sys.argv[2])))
