#!/usr/bin/env bash
# LLaMA-Factory stage (issue 40 section 3): tests/test_llamafactory*.py against LLaMA-Factory 0.9.5 itself, in its own
# venv (.venv-llamafactory, git-ignored). Run from anywhere: bash .ci/trainers/llamafactory.sh
#
# Install traps on a CPU machine, handled here:
# - torch must be pinned in the SAME pip call as llamafactory (alone it upgrades torch to a CUDA build);
# - llamafactory pulls torchvision/torchaudio wheels built against CUDA torch (torchvision::nms missing, torchaudio's
#   library fails to load), which break `import transformers`' model classes: both are uninstalled;
# - llamafactory/data/mm_plugin.py imports torchaudio at module level: a stub package stands in for it (audio inputs,
#   which packkit's tests do not use, fail loudly at first use).
# packkit: see .ci/trainers/lib.sh (the main build's wheel, or an editable build of its own).
# Issue 47: tests/test_llamafactory_entry.py (`python -m packkit.integrations.llamafactory.train` and
# `llamafactory-cli train`, one YAML) measured 284 s on the 2-core VM at load average ~20 (2026-11-27), 44 s of CPU
# (user + sys: about its wall time on a quiet machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
source .ci/trainers/lib.sh
VENV=.venv-llamafactory
start=$(date +%s)
# Phase "install" (the venv, no packkit) can run ahead in the background: .ci/trainers/run.sh starts every
# trainer's install at the start of .ci/run, then runs the "test" phases one by one. No argument: both.
phase=${1:-all}
case "$phase" in install|test|all) ;; *) echo "usage: $0 [install|test|all]" >&2; exit 2 ;; esac
if [ "$phase" != test ]; then
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q llamafactory==0.9.5 torch==2.13.0 transformers==5.6.0 datasets==4.0.0 accelerate==1.11.0 \
    peft==0.18.1 trl==0.24.0 numpy pybind11 scikit-build-core cmake ninja pytest hypothesis
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio
site=$("$VENV/bin/python" -P -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/torchaudio"
cat > "$site/torchaudio/__init__.py" <<'EOF'
"""Stand-in for torchaudio in packkit's LLaMA-Factory CI venv (.ci/trainers/llamafactory.sh): no torchaudio wheel
loads with the CPU torch 2.13, and llamafactory.data.mm_plugin imports torchaudio at module level."""
__version__ = "0.0.0+packkit.stub"


def __getattr__(name):
    raise ImportError(f"torchaudio.{name}: torchaudio is a stub in this venv (no wheel for CPU torch 2.13)")
EOF
fi
if [ "$phase" = install ]; then exit 0; fi
install_packkit "$VENV"
# scikit-build-core's editable .pth also puts the clone's PARENT folder on sys.path; any folder there named like a
# package becomes an importable namespace package (a /tmp/ray session folder made llamafactory's is_ray_available()
# true, then `import ray.util` failed). packkit imports without that line; drop it.
parent=$(cd .. && pwd)
site=$("$VENV/bin/python" -P -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -f "$site/_editable_skbc_packkit.pth" ] && sed -i "\|^${parent}\$|d" "$site/_editable_skbc_packkit.pth"
"$VENV/bin/python" -P -c "import torch, transformers, llamafactory.data.collator, packkit; \
print('llamafactory venv: torch', torch.__version__, 'transformers', transformers.__version__)"
echo "llamafactory venv ready in $(( $(date +%s) - start )) s"
"$VENV/bin/python" -P -m pytest -q -p no:cacheprovider tests/test_llamafactory.py tests/test_llamafactory_rows.py
# The trainer's own command line with packkit (issue 47; PACKKIT_TRAINER_ENTRY=0 skips it), timed apart.
if [ "${PACKKIT_TRAINER_ENTRY:-1}" = 1 ]; then
  entry=$(date +%s)
  "$VENV/bin/python" -P -m pytest -q -p no:cacheprovider tests/test_llamafactory_entry.py
  echo "llamafactory entry-point test: $(( $(date +%s) - entry )) s"
fi
echo "llamafactory stage: $(( $(date +%s) - start )) s"
