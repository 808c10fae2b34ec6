#!/usr/bin/env bash
# Release wheels: one per Python version, each holding packkit/_planner (pybind11), packkit/_ops.so (CPU
# ops) and packkit/_ops_cuda.so (CUDA kernels) on the LibTorch stable ABI (TORCH_TARGET_VERSION 2.10, so
# the same file loads in every torch >= 2.10), the Triton kernels, and packkit/_build_info.json (compiler,
# exact compile commands, link flags, torch headers, CUDA toolkit and architectures). No GPU needed.
#
#   bash tools/build_wheel.sh                 # Python 3.11 and 3.12, all CUDA archs, into dist/
#
# Settings (environment):
#   PACKKIT_PYTHONS      interpreters to build for (default: python3.11 and python3.12, from PATH or pyenv)
#   PACKKIT_BUILD_TORCH  the CUDA torch built against (default 2.11.0, a +cu130 wheel from the index; its
#                        headers compile the ops, its libtorch_cuda is linked by soname)
#   PACKKIT_CUDA_ARCHS   CMake CUDA architectures (default 80-real;90a-real;100-real;100-virtual: SASS for
#                        A100, H100/H200, B200, plus compute_100 PTX for newer GPUs); archs the nvcc found
#                        cannot build are dropped, and the script says which
#   NVCC                 the CUDA compiler (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc). Without
#                        one the wheel is CPU-only, and the script says so
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
mkdir -p "$OUT" "$ENVS"

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
  for v in 3.11 3.12; do
    p=$(find_python "$v") || true
    [ -n "$p" ] && PYTHONS+=("$p") || echo "warning: no Python $v found: no wheel for it" >&2
  done
fi
[ "${#PYTHONS[@]}" -gt 0 ] || { echo "no Python interpreter to build for" >&2; exit 1; }

NVCC=${NVCC:-$(command -v nvcc || true)}
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
CUDA_ARGS=""
if [ -n "$NVCC" ]; then
  # Keep the archs this nvcc can compile (sm_90a/sm_100a are not in --list-gpu-code: try each).
  kept=() dropped=()
  probe=$(mktemp -d)
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
  echo "CUDA kernels for: $ARCHS (nvcc $NVCC, $("$NVCC" --version | grep -o 'release [0-9.]*'))"
else
  echo "WARNING: no nvcc found: the wheels are CPU-only (no packkit/_ops_cuda.so)" >&2
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
  echo "== wheel for $tag against torch $("$env/bin/python" -c 'import torch; print(torch.__version__)') =="
  start=$SECONDS
  # Its own build folder, emptied: never mixed with an editable install's build/<tag> (another torch), and
  # no CMake cache keeps flags from an earlier build (e.g. a planted -static-libstdc++).
  rm -rf "${BUILD_DIR:?}"/"$tag"-*
  CMAKE_ARGS="$CUDA_ARGS ${CMAKE_ARGS:-}" "$env/bin/python" -m pip wheel --no-build-isolation --no-deps \
    --disable-pip-version-check -w "$OUT" -C build-dir="$ROOT/$BUILD_DIR/{wheel_tag}" . \
    >"$ENVS/$tag-build.log" 2>&1 || { tail -40 "$ENVS/$tag-build.log"; echo "build for $tag failed" >&2; exit 1; }
  wheel=$(ls -t "$OUT"/packkit-*-"$tag"-*.whl | head -1)
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
