#!/usr/bin/env bash
# One command that proves packkit's device paths on a CUDA machine:
#
#   bash tests/gpu/run.sh [wheel|build|diagnose|compare|test|sanitize|bench|prefix]   (no argument: all, in order)
#   PACKKIT_GPU_OUT=$OUT bash tests/gpu/run.sh session    # one device call under a global deadline (session.py)
#
# session   tests/gpu/session.py: install the carried wheel (tools/gpu_bundle.sh), packkit info, a diagnosis if a
#           backend crashed, the device tests, bench_pack_gpu --quick, the shared-prefix / varlen steps and a
#           compute-sanitizer subset, in that order, under PACKKIT_DEADLINE (520 s); session.json and <= 6 logs
#           written to $PACKKIT_GPU_OUT as each step ends
# wheel     installs a carried wheel instead of building here (tools/build_wheel.sh on the CPU machine):
#           $PACKKIT_WHEEL, else the newest dist/packkit-*-cpXY-*.whl for this Python; no network, no compiler
# build     pip install -e . from this tree (no network, no build isolation); prints the GPU, torch /
#           triton / CUDA versions, compute capability, whether _ops_cuda.so was built and loaded
# diagnose  `packkit info` (self-check of every op per backend and error probes, in child processes), the
#           toolchain here (c++ --version, CMake's compiler line, compiler/linker variables, readelf -d of
#           the installed modules, the libstdc++ on the loader path), a native backtrace under cuda-gdb (or
#           gdb) of any self-check that crashed, and a minimal throwing stable-ABI op built here with this
#           machine's compiler (tests/gpu/throw_probe), and the stable-ABI bisect (tests/gpu/abi_bisect: one child
#           per facility of the CUDA op host code, a verdict each: ok / raised / crashed (SIGNAL) / timeout).
#           Writes build/gpu-run/diagnose-<wheel|build>.{txt,json} and diagnose-<...>-bisect.json
# compare   the diagnose reports of the carried wheel and of the build here, side by side
# test      the whole pytest suite with CUDA and compiled Triton; a skipped GPU test fails the step
# sanitize  compute-sanitizer memcheck and racecheck over tests/gpu (inconsistent plans included)
# bench     benchmarks/bench_pack_gpu.py
# prefix    benchmarks/bench_shared_prefix.py --device cuda --dtype bf16: one training step, shared-prefix
#           two-pass varlen vs FlexAttention vs unshared varlen vs PrefixGrouper (issue 30's GPU rows; writes
#           benchmarks/results/shared_prefix_<gpu>.json); CPU mode: its --quick smoke run
#
# No argument: with a wheel found, first the wheel (wheel, diagnose), then a build here (build, diagnose,
# compare), so the two are compared; then test, sanitize and bench on the build. Without a wheel: build,
# diagnose, test, sanitize, bench. On a device with a per-command limit, call the steps one by one.
#
# Every step adds its row (step, result, seconds) to benchmarks/results/gpu-<device>-<date>.json
# (copied to $PACKKIT_GPU_OUT when set); the table is printed last. Steps run separately reuse the
# build of an earlier step in the same tree, so each fits a command limited to 10 minutes.
# Without a CUDA GPU the script says so and runs its CPU mode: it builds, runs the GPU test modules
# (which skip), checks that such a skip fails under PACKKIT_REQUIRE_GPU=1, diagnoses, collects the
# sanitizer module and runs the benchmark harness on CPU tensors. Exit status: non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
# The interpreter: $PYTHON, else this tree's .venv (README's test command makes it), else python3.
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
STEP_LIMIT=${PACKKIT_STEP_LIMIT:-470}  # seconds; each step stays under 8 minutes
LOGS=build/gpu-run
ROOT=$PWD
# Python runs from here when it imports packkit: from the repository root, ./packkit (the sources) would
# shadow an installed wheel.
NEUTRAL=$LOGS/cwd
mkdir -p "$LOGS" "$NEUTRAL"
case "$PY" in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") ;; esac  # absolute: used from $NEUTRAL
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

installed_from() { cat "$LOGS/installed_from" 2>/dev/null || echo unknown; }

# Where pytest runs: the repository root for a build of this tree (as CI does), elsewhere for a wheel.
test_dir() { [ "$(installed_from)" = wheel ] && echo "$NEUTRAL" || echo "$ROOT"; }

find_wheel() {  # $PACKKIT_WHEEL, else the newest dist/ wheel for this Python
  if [ -n "${PACKKIT_WHEEL:-}" ]; then echo "$PACKKIT_WHEEL"; return; fi
  local tag
  tag=$($PY -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  ls -t dist/packkit-*-"$tag"-*.whl 2>/dev/null | head -1
}

step_wheel() {
  local whl
  whl=$(find_wheel)
  [ -n "$whl" ] && [ -f "$whl" ] || { echo "no wheel: set PACKKIT_WHEEL or put one for this Python in dist/"; return 1; }
  echo "installing $whl (sha256 $(sha256sum "$whl" | cut -c1-16)...)"
  $PY -m pip uninstall -y packkit >"$LOGS/wheel.log" 2>&1  # an editable build of this tree would shadow it
  local args=(-m pip install --no-index --no-deps --force-reinstall "$whl")
  timeout "$STEP_LIMIT" $PY "${args[@]}" >>"$LOGS/wheel.log" 2>&1 \
    || { grep -q externally-managed "$LOGS/wheel.log" && $PY "${args[@]}" --break-system-packages >>"$LOGS/wheel.log" 2>&1; } \
    || { tail -20 "$LOGS/wheel.log"; echo "the wheel did not install (log: $LOGS/wheel.log)"; return 1; }
  echo wheel >"$LOGS/installed_from"
  local where
  where=$(cd "$NEUTRAL" && $PY -c "import packkit; print(packkit.__file__)") || return 1
  echo "packkit imports from $where"
  $PY tests/gpu/summary.py info || return 1
  if [ "$GPU" = 1 ]; then
    (cd "$NEUTRAL" && $PY -c "import packkit, sys; sys.exit(0 if packkit.ops.HAS_CUDA_KERNELS else 1)") \
      || { echo "_ops_cuda.so from the wheel was not loaded"; return 1; }
  fi
}

step_diagnose() {
  local src out
  src=$(installed_from)
  out="$LOGS/diagnose-$src"
  (  # a subshell, so its exit status survives the tee
    echo "## packkit installed from: $src"
    (cd "$NEUTRAL" && timeout "$STEP_LIMIT" $PY -m packkit info --save "$ROOT/$out.json")
    info=$?
    echo "(packkit info exit status $info)"
    echo "## toolchain here"
    for tool in c++ gcc nvcc cmake; do
      printf '%s: ' "$tool"; { command -v "$tool" && "$tool" --version 2>&1 | grep -m1 -E "[0-9]+\.[0-9]+"; } || echo "not found"
    done
    probe=$LOGS/cmake-probe
    mkdir -p "$probe"
    printf 'cmake_minimum_required(VERSION 3.18)\nproject(probe CXX)\n' >"$probe/CMakeLists.txt"
    cmake -S "$probe" -B "$probe/build" 2>&1 | grep -E "compiler identification|Check for working CXX" \
      || echo "CMake's compiler line: cmake not usable here"
    echo "compiler / linker variables:"; env | grep -E 'LD_PRELOAD|CXX|CFLAGS|LDFLAGS|LD_LIBRARY_PATH' || echo "  (none set)"
    echo "C++ runtimes on the loader path:"; ldconfig -p 2>/dev/null | grep -E 'libstdc\+\+\.so|libgcc_s\.so' || echo "  (ldconfig -p unavailable)"
    pkg=$(cd "$NEUTRAL" && $PY -c "import packkit.packing.ops as o; print(o._HERE)")
    for so in "$pkg"/_ops*.so "$pkg"/_planner*.so; do
      [ -f "$so" ] || continue
      echo "readelf -d $so:"; readelf -d "$so" 2>&1 | grep -E "NEEDED|RPATH|RUNPATH" || echo "  (readelf not found)"
    done
    echo "## a minimal throwing stable-ABI op, built here"
    timeout "$STEP_LIMIT" $PY tests/gpu/throw_probe/run_probe.py "$LOGS/throw_probe" 2>&1
    echo "## the stable-ABI bisect: each facility of the CUDA op host code in its own child (tests/gpu/abi_bisect)"
    if [ -n "${PACKKIT_BISECT_DONE:-}" ]; then
      echo "(already run: $PACKKIT_BISECT_DONE)"
    else
      timeout "$STEP_LIMIT" $PY tests/gpu/abi_bisect/run_bisect.py "$LOGS/abi_bisect" --json "$out-bisect.json" 2>&1
    fi
    echo "## native backtraces of self-checks that crashed"
    crashed=$($PY -c "
import json, sys
doc = json.load(open(sys.argv[1]))
print(' '.join(r['backend'] for r in doc['selfcheck'] if any(c['result'] == 'CRASH' for c in r['checks'])))" "$out.json" 2>/dev/null)
    [ -n "$crashed" ] || echo "(none crashed)"
    dbg=$(command -v cuda-gdb || command -v gdb)
    for backend in $crashed; do
      if [ -z "$dbg" ]; then echo "$backend crashed; neither cuda-gdb nor gdb is installed"; continue; fi
      echo "### $dbg -batch: python -m packkit.tools.selfcheck $backend"
      (cd "$NEUTRAL" && timeout "$STEP_LIMIT" "$dbg" -batch -ex run -ex bt -ex "info sharedlibrary" \
        --args "$PY" -m packkit.tools.selfcheck "$backend" 2>&1 | grep -vE "^\[(New|Thread) " | tail -150)
    done
    exit "$info"
  ) 2>&1 | tee "$out.txt"
  return "${PIPESTATUS[0]}"
}

step_compare() {
  $PY tests/gpu/compare_reports.py "$LOGS/diagnose-wheel.json" "$LOGS/diagnose-build.json"
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
  echo build >"$LOGS/installed_from"
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
    (cd "$(test_dir)" && PACKKIT_REQUIRE_GPU=1 timeout "$STEP_LIMIT" $PY -m pytest -q -rs -p no:cacheprovider \
      --rootdir "$ROOT" "${par[@]}" "$ROOT/tests") 2>&1 | tee "$LOGS/test.log"
    return "${PIPESTATUS[0]}"
  fi
  # CPU mode: the GPU modules collect and skip, and a tagged skip really fails a GPU run. The session's fake-deadline
  # test (~100 s) and the bisect's planted-crash test (~30 s), CPU-only, already ran in the main suite: not twice.
  timeout "$STEP_LIMIT" $PY -m pytest -q -rs -p no:cacheprovider --ignore tests/gpu/test_session.py \
    --ignore tests/gpu/test_abi_bisect.py tests/gpu 2>&1 \
    | tee "$LOGS/test.log"
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

step_prefix() {
  local mode=(--quick)
  [ "$GPU" = 1 ] && mode=(--device cuda --dtype bf16)
  timeout "$STEP_LIMIT" $PY benchmarks/bench_shared_prefix.py "${mode[@]}" 2>&1 | tee "$LOGS/prefix.log"
  [ "${PIPESTATUS[0]}" = 0 ] && ! grep -q "LOSS DIFFERS" "$LOGS/prefix.log"
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
  session) PYTHON=$PY exec "$PY" tests/gpu/session.py ;;  # the one-call session: its own JSON and logs
  wheel|build|diagnose|compare|test|sanitize|bench|prefix) run_step "$1"; status=$? ;;
  all)
    status=0
    if [ -n "$(find_wheel)" ]; then  # the carried wheel first, then a build here, compared
      if run_step wheel; then run_step diagnose || status=1; else status=1; fi
      if run_step build; then run_step diagnose || status=1; run_step compare || status=1; else status=1; fi
    elif run_step build; then
      run_step diagnose || status=1
    else
      status=1
    fi
    if [ "$(installed_from)" = build ]; then
      for s in test sanitize bench prefix; do run_step "$s" || status=1; done
    fi ;;
  *) echo "usage: $0 [session|wheel|build|diagnose|compare|test|sanitize|bench|prefix]" >&2; exit 2 ;;
esac
$PY tests/gpu/summary.py show || status=1
exit "$status"
