#!/usr/bin/env bash
# CI stage: builds the ASan+UBSan variant (tests/sanitize/build.sh) and runs the planner, pack-op and
# collator tests plus every committed fuzz corpus against it; with FUZZ_SECONDS > 0, each fuzz target
# runs that long (coverage-guided, normal build) and every input it kept is replayed against it too.
# Any sanitizer report aborts the process, so any report fails the stage.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
[ "${SKIP_BUILD:-0}" = 1 ] || tests/sanitize/build.sh

site_packages=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# -S skips the .pth files, so the editable install cannot redirect `import packkit` to the unsanitized
# build; site-packages is put back on PYTHONPATH behind the sanitized copy.
export PYTHONPATH="$PWD/build/sanitize/site:$site_packages"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
# Leaks: CPython and torch keep allocations alive at exit by design. Everything else reports and aborts.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0:strict_init_order=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
san() { "$PY" -S -P "$@"; }  # -P: the source tree (cwd) must not shadow the staged copy

san -c 'import packkit._planner as p, packkit.packing.ops; assert "/build/sanitize/site/" in p.__file__, p.__file__' \
  || { echo "the sanitized packkit is not the one imported" >&2; exit 1; }

san -m pytest -q -p no:cacheprovider --capture=sys tests/test_plan_op.py tests/test_plan_errors.py tests/test_plan_from_bins.py \
  tests/test_plan_properties.py tests/test_plan_hetero.py tests/test_context_parallel_plan.py tests/test_pack_ops.py \
  tests/test_pack_sequences.py tests/test_collator.py tests/test_pipeline_plan.py tests/test_pipeline_steps.py \
  tests/sanitize tests/fuzz
if [ "${FUZZ_SECONDS:-0}" -gt 0 ]; then
  # Fuzz with coverage on the normal build (a preloaded gcc libasan breaks atheris' coverage), then replay
  # every input it kept, crashes included, under the sanitizers.
  env -u LD_PRELOAD -u PYTHONPATH "$PY" -P tests/fuzz/run_all.py --seconds "$FUZZ_SECONDS" \
    --json build/sanitize/fuzz-results.json --keep build/sanitize/fuzz-corpus
  san tests/fuzz/replay.py build/sanitize/fuzz-corpus
fi
