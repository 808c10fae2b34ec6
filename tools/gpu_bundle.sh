#!/usr/bin/env bash
# The bundle for the one-call GPU session (issue 48): the release wheel for the GPU image's Python 3.12 with CUDA
# kernels for the H100 / H200 (sm_90a), built against torch 2.11.0+cu130 (the image's torch) by tools/build_wheel.sh
# (Debian 11 build root, auditwheel), plus the test / benchmark packages the image lacks, as wheels, in one ignored
# folder under 40 MiB. Then it checks the wheel here (installed into a copy of the cp312 build venv's torch:
# `packkit info` loads _ops.so and _ops_cuda.so and runs the CPU self-check) and prints the device call:
#
#   bash tools/gpu_bundle.sh            # build gpu-bundle/, check it, print the call
#   bash tools/gpu_bundle.sh --check    # check the gpu-bundle/ already there, print the call
#   bash tools/gpu_bundle.sh --print    # print the call for the gpu-bundle/ already there
#
# The call runs `tests/gpu/run.sh session` (tests/gpu/session.py): it installs the carried wheel, never builds first.
#
# Settings (environment): PACKKIT_BUNDLE (folder, default gpu-bundle; ignored by .gitignore), PACKKIT_BUNDLE_ARCHS
# (CMake CUDA architectures, default 90a-real), PACKKIT_BUILD_TORCH (default 2.11.0), and build_wheel.sh's own.
# Needs root (the build root) and the package index (torch for the build venv, the dependency wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${PACKKIT_BUNDLE:-gpu-bundle}
ARCHS=${PACKKIT_BUNDLE_ARCHS:-90a-real}
LIMIT_BYTES=$((40 << 20))
DEADLINE_S=520  # tests/gpu/session.py's default: the call's limit (560 s) leaves 40 s for the start and the files
# Packages the device's tests and benchmarks import that its image lacks (KINDS.md lists the image's): the
# shared-prefix benchmark's PrefixGrouper peer. Pinned; pure-Python wheels, no dependencies of their own there.
DEPS=(prefix-grouper==0.0.1.post1)

find_python312() {
  local p
  for p in $(command -v python3.12 2>/dev/null) $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python 2>/dev/null | sort -rV); do
    "$p" -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))" 2>/dev/null && { echo "$p"; return 0; }
  done
  return 1
}

mode=${1:-build}
if [ "$mode" = build ]; then
  py=$(find_python312) || { echo "gpu_bundle.sh: no Python 3.12 found (PATH or pyenv)" >&2; exit 1; }
  start=$SECONDS
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE"
  PACKKIT_PYTHONS="$py" PACKKIT_CUDA_ARCHS="$ARCHS" PACKKIT_WHEEL_DIR="$BUNDLE" bash tools/build_wheel.sh
  rm -f "$BUNDLE"/packkit-*.tar.gz  # build_wheel.sh's sdist: the session installs the wheel
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$BUNDLE" "${DEPS[@]}"
  echo "bundle built in $((SECONDS - start)) s"
fi

if [ "$mode" != --print ]; then
  # The check here: the wheel into its own folder on top of the build venv's torch 2.11.0+cu130 (a CPU machine:
  # the CUDA library must load, the CPU ops must pass the self-check; the GPU checks are the device's).
  env_dir=${PACKKIT_BUILD_ENV:-build/wheel-env}
  case "$env_dir" in /*) ;; *) env_dir=$PWD/$env_dir ;; esac  # absolute, not resolved: the venv's own python
  env_py=$env_dir/cp312-torch${PACKKIT_BUILD_TORCH:-2.11.0}/bin/python
  check=build/gpu-bundle-check
  rm -rf "$check"
  "$env_py" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps --target "$check/site" "$BUNDLE"/packkit-*.whl
  mkdir -p "$check/cwd"
  (cd "$check/cwd" && PYTHONPATH="$PWD/../site" "$env_py" -m packkit info --save ../info.json >../info.txt 2>&1) \
    || { cat "$check/info.txt"; echo "gpu_bundle.sh: packkit info failed on the bundled wheel" >&2; exit 1; }
  "$env_py" - "$check/info.json" "$PWD/$check/site" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
env, b = doc["environment"], doc["backends"]
assert env["location"].startswith(sys.argv[2]), f"packkit imported from {env['location']}, not the wheel"
assert b["cuda"]["loaded"], f"_ops_cuda.so did not load: {b['cuda']['error']}"
cpu = next(r for r in doc["selfcheck"] if r["backend"] == "cpu")
assert cpu["checks"] and all(c["result"] == "PASS" for c in cpu["checks"]), cpu
print(f"checked here: torch {env['torch']}, CUDA kernels loaded ({len(b['cuda']['registered'])} ops registered), "
      f"CPU self-check {len(cpu['checks'])}/{len(cpu['checks'])} pass; wheel tags {', '.join(doc['wheel']['tags'])}")
EOF
fi

wheel=$(ls "$BUNDLE"/packkit-*-cp312-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "gpu_bundle.sh: no cp312 wheel in $BUNDLE/" >&2; exit 1; }
unzip -l "$wheel" | grep -q "packkit/_ops_cuda.so" || { echo "gpu_bundle.sh: $wheel has no CUDA kernels" >&2; exit 1; }
git check-ignore -q "$BUNDLE" || { echo "gpu_bundle.sh: $BUNDLE/ is not ignored by git (it must travel only as carry)" >&2; exit 1; }
size=$(du -sb "$BUNDLE" | cut -f1)
echo "bundle $BUNDLE/: $(ls "$BUNDLE" | tr '\n' ' ')($((size / 1024)) KiB)"
[ "$size" -le "$LIMIT_BYTES" ] || { echo "gpu_bundle.sh: $BUNDLE/ is $size bytes, over 40 MiB" >&2; exit 1; }
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "what travels: tracked files $((tree / 1024)) KiB + the bundle (the device takes 64 MiB in all)"
echo
echo "The device call (run, with nothing else in the same session's call):"
cat <<EOF
{"command": "PACKKIT_GPU_OUT=\$OUT PACKKIT_BUNDLE=$BUNDLE PACKKIT_DEADLINE=$DEADLINE_S bash tests/gpu/run.sh session", "carry": ["$BUNDLE"], "timeout_s": 560}
EOF
