#!/usr/bin/env bash
# Compat stage (issue 22): build one wheel, then install that same file, unchanged, into a fresh venv per
# supported torch and prove it there: `packkit info` (self-check of every op, error probes in a child
# process), the op-layer tests (plan op, pack ops, out-ops, plan safety, cp_shard, opcheck, torch.compile) run
# against the installed wheel, never the source tree; then `nm -D` of every module against the oldest
# torch's libraries (tools/check_abi_symbols.py).
#
#   bash tools/compat_check.sh            # builds the wheel (tools/build_wheel.sh, this python3, sm_90 only)
#   bash tools/compat_check.sh WHEEL      # checks a wheel built elsewhere
#
# PACKKIT_COMPAT_TORCHES: torch versions (default "2.13.0 2.11.0 2.10.0"; the last is the stable-ABI floor
# and is checked only if it installs). PACKKIT_CUDA_ARCHS: archs of the CI build (default 90-real; release
# wheels build all of them). Everything (venvs, downloads, caches) lives in build/compat, inside the clone.
# PACKKIT_COMPAT_REUSE=1 reuses the venvs of an earlier run (packkit uninstalled first): local re-runs only.
# Exit status 1 if any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON_FOR_WHEEL:-python3}
read -r -a TORCHES <<<"${PACKKIT_COMPAT_TORCHES:-2.13.0 2.11.0 2.10.0}"
OPTIONAL_TORCH=2.10.0  # "if it installs": a failed install of the floor is reported, not fatal
WORK=build/compat
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_NO_COMPILE=1  # no byte-compiling of torch's thousands of files: halves pip's CPU time (50 s -> 22 s a venv)
# The build's torch is downloaded once into the clone and installed from there twice (build venv, test venv).
WHEELS=$ROOT/$WORK/wheels
# (added to the configured find-links, which may hold local torch wheels)
PIP_FIND_LINKS="$WHEELS $("$PY" -m pip config get global.find-links 2>/dev/null || true)"
export PIP_FIND_LINKS
export TORCHINDUCTOR_CACHE_DIR=$ROOT/$WORK/inductor  # torch.compile's cache stays inside the clone too
BUILD_TORCH=${PACKKIT_BUILD_TORCH:-2.11.0}
TESTS=(tests/test_plan_op.py tests/test_pack_ops.py tests/test_pack_out_ops.py tests/test_plan_safety.py
       tests/test_context_parallel.py)  # the cp_shard op (issue 25): reference, opcheck, compile
rm -rf "$WORK/run" "$WORK/logs" "$WORK/inductor"
mkdir -p "$WORK/logs" "$WORK/run" "$WORK/dist" "$WHEELS"
START=$SECONDS
declare -A RESULT PIDS

make_venv() {  # fresh venv with one torch and the test tools; never packkit's sources
  local v=$1 env=$WORK/venv-torch$1
  if [ "${PACKKIT_COMPAT_REUSE:-0}" = 1 ] && [ -x "$env/bin/python" ]; then  # local re-runs only, never CI
    "$env/bin/pip" uninstall -q -y packkit >/dev/null 2>&1
    return 0
  fi
  rm -rf "$env"
  "$PY" -m venv "$env" && "$env/bin/pip" install -q "torch==$v" numpy pytest hypothesis >"$WORK/logs/venv-$v.log" 2>&1 \
    && "$env/bin/python" -c "import torch" >>"$WORK/logs/venv-$v.log" 2>&1
}

# Network first, overlapped: the other torches install in the background while the build's torch is
# downloaded; its test venv then installs from the download while the wheel compiles.
for v in "${TORCHES[@]}"; do
  if [ "$v" != "$BUILD_TORCH" ]; then make_venv "$v" & PIDS[$v]=$!; fi
done
WHEEL=${1:-}
if [ -z "$WHEEL" ]; then
  "$PY" -m pip download -q -d "$WHEELS" "torch==$BUILD_TORCH" numpy pybind11 scikit-build-core cmake ninja pytest \
    hypothesis >"$WORK/logs/download.log" 2>&1 || { tail -5 "$WORK/logs/download.log"; echo "compat: download failed"; exit 1; }
  echo "torch $BUILD_TORCH and the build tools downloaded ($((SECONDS - START)) s)"
fi
for v in "${TORCHES[@]}"; do
  if [ "$v" = "$BUILD_TORCH" ]; then make_venv "$v" & PIDS[$v]=$!; fi
done
if [ -z "$WHEEL" ]; then
  echo "== building the wheel =="
  rm -f "$WORK"/dist/*.whl
  PACKKIT_PYTHONS=$PY PACKKIT_CUDA_ARCHS=${PACKKIT_CUDA_ARCHS:-90-real} PACKKIT_WHEEL_DIR=$WORK/dist \
    PACKKIT_BUILD_ENV=$WORK/build-env PACKKIT_BUILD_DIR=$WORK/wheel-build bash tools/build_wheel.sh || { echo "compat: the wheel did not build"; exit 1; }
  WHEEL=$(ls "$WORK"/dist/packkit-*.whl | head -1)
fi
WHEEL=$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")
SHA=$(sha256sum "$WHEEL" | cut -c1-16)
echo "wheel: $WHEEL (sha256 $SHA...), $(( $(stat -c %s "$WHEEL") / 1024 )) KiB ($((SECONDS - START)) s)"

status=0
OLDEST=""
for v in "${TORCHES[@]}"; do
  env=$WORK/venv-torch$v
  if ! wait "${PIDS[$v]}"; then
    tail -5 "$WORK/logs/venv-$v.log"
    if [ "$v" = "$OPTIONAL_TORCH" ]; then RESULT[$v]="SKIP: torch $v does not install here"; else RESULT[$v]="FAIL: torch $v did not install"; status=1; fi
    continue
  fi
  echo "== torch $("$env/bin/python" -c 'import torch; print(torch.__version__)') ($((SECONDS - START)) s) =="
  [ "$(sha256sum "$WHEEL" | cut -c1-16)" = "$SHA" ] || { echo "the wheel changed"; exit 1; }
  "$env/bin/pip" install -q --no-deps --no-index "$WHEEL" >"$WORK/logs/install-$v.log" 2>&1 \
    || { tail -5 "$WORK/logs/install-$v.log"; RESULT[$v]="FAIL: the wheel does not install"; status=1; continue; }
  # From a folder outside the source tree, so `import packkit` can only find the installed wheel.
  where=$(cd "$WORK/run" && "$ROOT/$env/bin/python" -c "import packkit; print(packkit.__file__)")
  case "$where" in */site-packages/packkit/__init__.py) ;; *) echo "packkit imported from $where"; RESULT[$v]="FAIL: not the wheel"; status=1; continue ;; esac
  (cd "$WORK/run" && "$ROOT/$env/bin/packkit" info) >"$WORK/logs/info-$v.log" 2>&1
  info=$?
  grep -E "^torch |^  (cpu|cuda|triton) +(_ops|triton_k)|error probe|CRASH|FAIL|PROBLEMS|^OK|^  - " "$WORK/logs/info-$v.log" | head -24
  # --rootdir: the clone's pytest settings and conftest; the interpreter's cwd stays outside the tree.
  (cd "$WORK/run" && "$ROOT/$env/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" \
    "${TESTS[@]/#/$ROOT/}") >"$WORK/logs/tests-$v.log" 2>&1
  tests=$?
  summary=$(grep -E "^=* ?[0-9]+ (passed|failed)" "$WORK/logs/tests-$v.log" | tail -1 | tr -d '=')
  [ -n "$summary" ] || summary="pytest died (exit $tests$([ "$tests" -gt 128 ] && echo ", signal $((tests - 128))"))"
  echo "tests: $summary"
  if [ "$info" = 0 ] && [ "$tests" = 0 ]; then
    RESULT[$v]="PASS: packkit info OK; $summary"
  else
    RESULT[$v]="FAIL: packkit info exit $info; tests exit $tests: $summary"; status=1
    grep -E "^(FAILED|ERROR)|Fatal Python error|CRASH" "$WORK/logs/tests-$v.log" "$WORK/logs/info-$v.log" | head -20
  fi
  OLDEST=$v  # torches are listed newest first: the last one installed is the oldest
done

echo "== symbols of each module against torch $OLDEST, the oldest installed =="
if [ -n "$OLDEST" ]; then
  torch_dir=$("$WORK/venv-torch$OLDEST/bin/python" -c "import os, torch; print(os.path.dirname(torch.__file__))")
  python3 tools/check_abi_symbols.py "$WHEEL" "$torch_dir" || status=1
else
  echo "no torch installed: nothing to check against"; status=1
fi

echo "== compat summary ($((SECONDS - START)) s) =="
for v in "${TORCHES[@]}"; do echo "  torch $v: ${RESULT[$v]:-not run}"; done
[ "$status" = 0 ] && echo "compat: PASS" || echo "compat: FAIL"
exit "$status"
