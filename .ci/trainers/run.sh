#!/usr/bin/env bash
# The trainer stages of issue 40 (axolotl, ms-swift, LLaMA-Factory), each in a venv of its own pinned to that
# trainer's versions (their transformers pins exclude each other and the main venv's). Called by .ci/run after
# the main venv is installed: packkit goes into each venv as one wheel of the main venv's build (seconds: the
# build dir is up to date), so no trainer stage compiles C++.
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
rm -rf build/ci-wheel
.venv/bin/pip wheel -q --no-build-isolation --no-deps . -w build/ci-wheel
PACKKIT_WHEEL=$(ls "$PWD"/build/ci-wheel/packkit-*.whl)
export PACKKIT_WHEEL PIP_DISABLE_PIP_VERSION_CHECK=1
echo "trainer stages: packkit wheel $(basename "$PACKKIT_WHEEL") in $(( $(date +%s) - start )) s"
for trainer in ${PACKKIT_TRAINERS:-axolotl swift llamafactory}; do
  t0=$(date +%s)
  bash ".ci/trainers/$trainer.sh"
  rm -rf ".venv-$trainer"  # 1.7-2.2 GB each; the disk holds the compat stage's venvs too
  echo "== trainer stage $trainer: $(( $(date +%s) - t0 )) s =="
done
echo "trainer stages: $(( $(date +%s) - start )) s in all"
