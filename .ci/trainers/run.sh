#!/usr/bin/env bash
# The trainer stages of issue 40 (axolotl, ms-swift, LLaMA-Factory), each in a venv of its own pinned to that
# trainer's versions (their transformers pins exclude each other and the main venv's).
#     bash .ci/trainers/run.sh start   # starts every trainer's venv install in the background, returns at once
#     bash .ci/trainers/run.sh         # waits for those installs (starts them if none were), then the tests
# .ci/run calls `start` before the main install, so the three installs (mostly disk writes: ~30 s of CPU each
# with PIP_COMPILE=0) overlap the main install and the suite instead of running one after another at the end.
# The tests then run side by side (below): packkit goes into each venv as one wheel of the main venv's build
# (seconds: the build dir is up to date), so no trainer stage compiles C++.
set -euo pipefail
cd "$(dirname "$0")/../.."
TRAINERS=${PACKKIT_TRAINERS:-axolotl swift llamafactory}
LOGS=build/ci-trainers

start_installs() {
  rm -rf "$LOGS" && mkdir -p "$LOGS"
  for trainer in $TRAINERS; do
    (  # its wall and CPU time go to .ci/run's stage table (GNU time, where installed); set +e: the .rc file is
      set +e  # written whatever the install's status (set -e would leave the subshell first)
      if [ -x /usr/bin/time ]; then
        /usr/bin/time -a -o build/ci-stages.txt -f "trainer-install-$trainer|%e|%U|%S" nice -n 10 bash ".ci/trainers/$trainer.sh" install
      else
        nice -n 10 bash ".ci/trainers/$trainer.sh" install
      fi >"$LOGS/$trainer.log" 2>&1; echo $? >"$LOGS/$trainer.rc"
    ) &
  done
  echo "trainer stages: venv installs started in the background ($TRAINERS), logs in $LOGS/"
}

if [ "${1:-}" = start ]; then start_installs; exit 0; fi
[ -d "$LOGS" ] || start_installs

start=$(date +%s)
if [ -z "${PACKKIT_WHEEL:-}" ]; then  # .ci/run makes it before the suite starts (the suite rebuilds the same build dir)
  rm -rf build/ci-wheel
  .venv/bin/pip wheel -q --no-build-isolation --no-deps . -w build/ci-wheel
  PACKKIT_WHEEL=$(ls "$PWD"/build/ci-wheel/packkit-*.whl)
fi
export PACKKIT_WHEEL PIP_DISABLE_PIP_VERSION_CHECK=1
echo "trainer stages: packkit wheel $(basename "$PACKKIT_WHEEL") ($(( $(date +%s) - start )) s here)"
# The test phases run side by side, each started once its venv is ready: each is mostly single-threaded
# Python (tiny models, trainer start-up), so on 2 cores three of them take about half the time of one after another.
# Each one's output is printed whole when all are done.
declare -A PIDS
for trainer in $TRAINERS; do
  (
    t0=$(date +%s)
    until [ -f "$LOGS/$trainer.rc" ]; do sleep 2; done
    echo "== trainer $trainer: venv install (background) =="; grep -v "^WARNING: Location" "$LOGS/$trainer.log" || true
    rc=$(cat "$LOGS/$trainer.rc")
    [ "$rc" = 0 ] || { echo "trainer stage $trainer: the venv install failed (exit $rc)"; exit 1; }
    echo "   waited $(( $(date +%s) - t0 )) s for it here"
    bash ".ci/trainers/$trainer.sh" test
    rm -rf ".venv-$trainer"  # 1.7-3.0 GB each; the disk holds the compat stage's venvs too
    echo "== trainer stage $trainer: $(( $(date +%s) - t0 )) s (tests beside the other trainers') =="
  ) >"$LOGS/$trainer-test.log" 2>&1 &
  PIDS[$trainer]=$!
done
failed=""
for trainer in $TRAINERS; do
  wait "${PIDS[$trainer]}" || failed="$failed $trainer"
  grep -v "^WARNING: Location" "$LOGS/$trainer-test.log" || true
done
echo "trainer stages: $(( $(date +%s) - start )) s in all"
[ -z "$failed" ] || { echo "trainer stages failed:$failed" >&2; exit 1; }
