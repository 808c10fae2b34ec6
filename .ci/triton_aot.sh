#!/usr/bin/env bash
# Triton AOT stage (issue 48): every packkit Triton kernel compiled ahead of time for real GPU targets (no GPU here)
# with CI's triton (the main venv's) and with the GPU image's triton 3.6.0, in a venv of its own made here. Fails on
# any compile error, registers x threads > 65,536, shared memory over the arch's limit, or an i32 loop counter; and
# (before compiling) when the launch enumeration misses a kernel or a combination its launchers can produce.
# CI's budget: the covering subset (every constexpr value and data dtype of every kernel at least once), one arch
# list per triton version, the two in parallel. tools/triton_aot.py --select all compiles every combination.
# Cost (2026-11-27, the shared 2-core machine at load average ~20, 8 sessions on it): 892 s wall, of which the
# triton-3.6 venv 160 s (26 s on a quieter machine), but 96 s user + 7 s system CPU in all (168 compiles, ~0.5 CPU-s
# each): ~1.5 min on an idle 2-core CI machine.
# The triton-3.6 venv has only triton; torch and packkit come from the main venv (same Python, its site folder
# added after triton 3.6's own, so that triton 3.6 is the one imported).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
VENV36=${TRITON36_VENV:-build/triton36-venv}

start=$(date +%s)
base=$("$PY" -c 'import sys; print(sys._base_executable)')
site=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
rm -rf "$VENV36"
"$base" -m venv "$VENV36"
"$VENV36/bin/pip" install -q triton==3.6.0
own=$("$VENV36/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "import site; site.addsitedir('$site')" > "$own/zz_packkit_main_venv.pth"
"$VENV36/bin/python" -c 'import triton, torch, packkit; assert triton.__version__ == "3.6.0", triton.__version__'
echo "triton-aot: triton 3.6.0 venv ready in $(( $(date +%s) - start )) s"

cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
TRITON_CACHE_DIR="$cache/main" "$PY" -W ignore tools/triton_aot.py --select cover --cc ${AOT_CC_MAIN:-80 100} --jobs 1 \
  > "$cache/main.log" 2>&1 & main_pid=$!
TRITON_CACHE_DIR="$cache/t36" "$VENV36/bin/python" -W ignore tools/triton_aot.py --select cover --cc ${AOT_CC_36:-90} \
  --jobs 1 > "$cache/t36.log" 2>&1 & t36_pid=$!
rc=0
wait "$main_pid" || rc=1
wait "$t36_pid" || rc=1
cat "$cache/main.log" "$cache/t36.log"
echo "triton-aot: $(( $(date +%s) - start )) s in all"
exit "$rc"
