#!/usr/bin/env bash
# Mutation testing of the Python layer that shapes batches (issue 27; docs/mutation.md): mutmut 3 over
# [tool.mutmut] only_mutate in pyproject.toml (packkit/packing, training, datasets, rl, context_parallel:
# directory globs), each mutant against the tests that cover its function (mutmut's stats pass).
#
#   tools/mutation.sh                       # every mutant (slow: see docs/mutation.md for the cost)
#   tools/mutation.sh 'packkit.packing.sequences.*' 'packkit.training.collator.*'   # some modules
#   SAMPLE=200 SEED=1 tools/mutation.sh     # a random sample of 200 mutants of the whole target set
#
# Why the -S / PYTHONPATH dance: the editable install (scikit-build-core) puts a redirecting import finder
# first on sys.meta_path, so `import packkit` would load the unmutated source tree whatever mutmut puts on
# sys.path, and every mutant would survive. `python -S` skips the .pth files (no finder); site-packages
# comes back on PYTHONPATH; the compiled extensions are staged next to the sources for the run (mutmut
# copies packkit/ into mutants/) and removed afterwards. Results: `mutmut results` (same environment).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
site_packages=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
staged=()
for so in "$site_packages"/packkit/*.so; do
  [ -e "packkit/$(basename "$so")" ] && continue
  cp "$so" packkit/ && staged+=("packkit/$(basename "$so")")
done
cleanup() { for f in "${staged[@]}"; do rm -f "$f"; done; }
trap cleanup EXIT
export PYTHONPATH="$site_packages"
mm() { "$PY" -S -m mutmut "$@"; }
"$PY" -S -c 'import mutmut' 2>/dev/null || { echo "mutmut is not installed in $PY's environment" >&2; exit 1; }
if [ -n "${SAMPLE:-}" ]; then
  # mutmut generates every mutant first; `mutmut results --all true` lists their names; run a seeded sample.
  rm -rf mutants
  mm run --max-children "${JOBS:-2}" 'none-such-mutant' >/dev/null 2>&1 || true
  mapfile -t names < <(mm results --all true 2>/dev/null | sed -n 's/^ *\([^:]*\): .*/\1/p' \
    | "$PY" -c "import random, sys; n = sys.stdin.read().split(); random.Random(${SEED:-1}).shuffle(n); print('\n'.join(sorted(n[:${SAMPLE}])))")
  echo "running a sample of ${#names[@]} mutants (seed ${SEED:-1})"
  mm run --max-children "${JOBS:-2}" "${names[@]}"
else
  mm run --max-children "${JOBS:-2}" "$@"
fi
mm results
