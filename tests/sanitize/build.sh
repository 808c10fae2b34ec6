#!/usr/bin/env bash
# Builds the AddressSanitizer + UndefinedBehaviorSanitizer variant of the planner and the CPU ops in
# build/sanitize (CMake option PACKKIT_SANITIZE=ON) and stages an importable copy of packkit in
# build/sanitize/site: the Python sources linked from packkit/, the sanitized extensions beside them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
BUILD=build/sanitize
cmake -S . -B "$BUILD" -G Ninja -DPACKKIT_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPython_EXECUTABLE="$("$PY" -c 'import sys; print(sys.executable)')" -DCMAKE_MAKE_PROGRAM="$(cd "$(dirname "$PY")" && pwd)/ninja" >/dev/null
cmake --build "$BUILD" --target _planner _ops -j "${JOBS:-2}"
site="$BUILD/site/packkit"
rm -rf "$BUILD/site" && mkdir -p "$site"
for entry in packkit/*; do
  case "$entry" in *.so) continue ;; esac
  ln -s "$PWD/$entry" "$site/"
done
ln -s "$PWD/triton_kernels" "$site/triton_kernels"
cp "$BUILD"/_planner*.so "$BUILD"/_ops.so "$site/"
echo "sanitized packkit staged in $BUILD/site"
