#!/usr/bin/env bash
# One command that proves packkit's device paths on a CUDA machine:
#
#   bash tests/gpu/run.sh [build|test|sanitize|bench]     (no argument: all four, in order)
#
# build     pip install -e . from this tree (no network, no build isolation); prints the GPU, torch /
#           triton / CUDA versions, compute capability, whether _ops_cuda.so was built and loaded
# test      the whole pytest suite with CUDA and compiled Triton; a skipped GPU test fails the step
# sanitize  compute-sanitizer memcheck and racecheck over tests/gpu (inconsistent plans included)
# bench     benchmarks/bench_pack_gpu.py
#
# Every step adds its row (step, result, seconds) to benchmarks/results/gpu-<device>-<date>.json
# (copied to $PACKKIT_GPU_OUT when set); the table is printed last. Steps run separately reuse the
# build of an earlier step in the same tree, so each fits a command limited to 10 minutes.
# Without a CUDA GPU the script says so and runs its CPU mode: it builds, runs the GPU test modules
# (which skip), checks that such a skip fails under PACKKIT_REQUIRE_GPU=1, collects the sanitizer
# module and runs the benchmark harness on CPU tensors. Exit status: non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
# The interpreter: $PYTHON, else this tree's .venv (README's test command makes it), else python3.
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
STEP_LIMIT=${PACKKIT_STEP_LIMIT:-470}  # seconds; each step stays under 8 minutes
LOGS=build/gpu-run
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
for d in /usr/local/cuda/bin /opt/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done

if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  GPU=1
else
  GPU=0
  echo "no CUDA GPU: $($PY -c "import torch; print(f'torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no GPU')" 2>&1 | tail -1); running the CPU mode"
fi

record() {  # step result seconds detail
  $PY tests/gpu/summary.py add "$1" "$2" "$3" "$4" || echo "could not record step $1" >&2
}

step_build() {
  local args=(-m pip install --no-index --no-build-isolation --no-deps -e .)
  if [ "$GPU" = 1 ]; then
    local cc
    cc=$($PY -c "import torch; print('%d%d' % torch.cuda.get_device_capability())")
    CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$cc ${CMAKE_ARGS:-}" timeout "$STEP_LIMIT" $PY "${args[@]}" >"$LOGS/build.log" 2>&1
  else
    timeout "$STEP_LIMIT" $PY "${args[@]}" >"$LOGS/build.log" 2>&1
  fi || { tail -40 "$LOGS/build.log"; echo "build failed (log: $LOGS/build.log)"; return 1; }
  $PY tests/gpu/summary.py info || return 1
  if [ "$GPU" = 1 ]; then
    $PY -c "import packkit, sys; sys.exit(0 if packkit.packing.ops.HAS_CUDA_KERNELS else 1)" \
      || { grep -i "packkit:\|cuda" "$LOGS/build.log" | tail -20; echo "_ops_cuda.so was not built or not loaded"; return 1; }
  fi
}

step_test() {
  if [ "$GPU" = 1 ]; then
    # pytest-xdist (on the GPU machine) splits the suite by file over workers sharing the GPU: the
    # whole suite then fits the step limit. PACKKIT_TEST_WORKERS=0 runs it in one process.
    local par=()
    [ "${PACKKIT_TEST_WORKERS:-6}" != 0 ] && $PY -c "import xdist" 2>/dev/null \
      && par=(-n "${PACKKIT_TEST_WORKERS:-6}" --dist loadfile)
    PACKKIT_REQUIRE_GPU=1 timeout "$STEP_LIMIT" $PY -m pytest -q -rs -p no:cacheprovider "${par[@]}" tests 2>&1 | tee "$LOGS/test.log"
    return "${PIPESTATUS[0]}"
  fi
  # CPU mode: the GPU modules collect and skip, and a tagged skip really fails a GPU run.
  timeout "$STEP_LIMIT" $PY -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 | tee "$LOGS/test.log"
  [ "${PIPESTATUS[0]}" = 0 ] || return 1
  if PACKKIT_REQUIRE_GPU=1 $PY -m pytest -q -p no:cacheprovider \
      tests/gpu/test_cuda_paths.py::test_auto_backend_uses_the_cuda_kernels >"$LOGS/require-gpu.log" 2>&1; then
    echo "PACKKIT_REQUIRE_GPU=1 did not turn a skipped GPU test into a failure"; return 1
  fi
  echo "PACKKIT_REQUIRE_GPU=1 turns a skipped GPU test into a failure: checked"
}

sanitizer() {
  command -v compute-sanitizer 2>/dev/null
}

step_sanitize() {
  local tool
  tool=$(sanitizer)
  if [ "$GPU" = 0 ]; then
    local n
    n=$($PY -m pytest -q --collect-only -p no:cacheprovider tests/gpu/test_cuda_plan_safety.py 2>/dev/null | grep -c "::")
    [ "$n" -ge 1 ] || { echo "the sanitizer module collected no tests"; return 1; }
    echo "sanitizer module collected ($n tests); compute-sanitizer: ${tool:-not found}"
    return 0
  fi
  [ -n "$tool" ] || { echo "compute-sanitizer not found"; return 1; }
  # Uncached allocations: memcheck then sees each tensor's exact bounds, not the allocator's pool.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PACKKIT_SAFETY_EXAMPLES=${PACKKIT_SAFETY_EXAMPLES:-40} timeout "$STEP_LIMIT" \
    "$tool" --tool memcheck --error-exitcode 3 --print-limit 20 \
    $PY -m pytest -q -x -p no:cacheprovider tests/gpu 2>&1 | tee "$LOGS/memcheck.log"
  local mem=${PIPESTATUS[0]}
  PACKKIT_SAFETY_EXAMPLES=10 timeout "$STEP_LIMIT" \
    "$tool" --tool racecheck --racecheck-report hazard --error-exitcode 3 --print-limit 20 \
    $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_cuda_plan_safety.py tests/gpu/test_cuda_paths.py \
    -k "not non_current" 2>&1 | tee "$LOGS/racecheck.log"
  local race=${PIPESTATUS[0]}
  echo "memcheck exit $mem, racecheck exit $race"
  [ "$mem" = 0 ] && [ "$race" = 0 ]
}

step_bench() {
  local out="$LOGS/bench.json" mode=()
  [ "$GPU" = 1 ] || mode=(--cpu)
  rm -f "$out"
  timeout "$STEP_LIMIT" $PY benchmarks/bench_pack_gpu.py "${mode[@]}" --out "$out" 2>&1 | tee "$LOGS/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] && [ -s "$out" ] && $PY tests/gpu/summary.py attach "$out"
}

run_step() {
  local name=$1 start=$SECONDS status detail
  echo "=== $name ($([ "$GPU" = 1 ] && echo GPU || echo CPU) mode) ==="
  "step_$name"
  status=$?
  detail="$([ "$GPU" = 1 ] && echo gpu || echo "cpu mode")"
  [ "$status" = 124 ] && detail="$detail; timed out after ${STEP_LIMIT}s"
  [ "$status" = 0 ] && result=PASS || result=FAIL
  local counts=""
  [ -f "$LOGS/$name.log" ] && counts=$(grep -Eo "[0-9]+ (passed|failed|skipped|errors?)" "$LOGS/$name.log" | tail -4 | paste -sd, -)
  [ -n "$counts" ] && detail="$detail; $counts"
  record "$name" "$result" "$((SECONDS - start))" "$detail"
  [ "$status" = 0 ]
}

case "${1:-all}" in
  build|test|sanitize|bench) run_step "$1"; status=$? ;;
  all)
    status=0
    if run_step build; then
      for s in test sanitize bench; do run_step "$s" || status=1; done
    else
      status=1
    fi ;;
  *) echo "usage: $0 [build|test|sanitize|bench]" >&2; exit 2 ;;
esac
$PY tests/gpu/summary.py show || status=1
exit "$status"
