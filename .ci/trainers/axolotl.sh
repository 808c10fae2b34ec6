#!/usr/bin/env bash
# Issue 40 section 1: packkit inside axolotl 0.19.0 (PackkitPlugin, packkit's MultipackBatchSampler).
# A venv of its own (.venv-axolotl, git-ignored): axolotl's own pins (torch 2.13.0, transformers 5.16.1, trl 1.9.0,
# accelerate 1.13.0) beside the main venv's transformers 5.24. Not `pip install axolotl` (4.3 GB, 9 min here: vllm-free
# but with gradio, wandb, lm_eval, bitsandbytes, xformers, ...): axolotl with --no-deps plus what the trainer, the
# plugin base, the collators and the LR-schedule count import (1.7 GB). Runs tests/test_axolotl_sampler.py and
# tests/test_axolotl_plugin.py (2 gloo ranks training through axolotl's trainer, with axolotl's collator and with
# packkit's) and a smoke run of the benchmark.
# Cost on the 2-core CPU machine, pip cache warm, machine shared with other jobs (2026-11-26): 6 min 27 s in all
# (venv + packkit build 332 s, the tests 44 s, benchmark smoke ~10 s; the packkit-collator run added since: ~35 s);
# venv 1.7 GB. pydantic (the plugin's schema keys) comes with transformers' dependencies.
# Issue 47 (2026-11-27, measured on the 2-core VM while 8 jobs held it at load average ~20, pip cache warm): the
# CLI's packages (third pip line) 312 s, venv 1.7 -> 3.0 GB (triton and bitsandbytes most of it);
# tests/test_axolotl_entry.py (two `axolotl train` runs) 1037 s wall at that load, 90 s of CPU (user + sys), which is
# about its wall time on a quiet machine (single-threaded runs); the third pip line used 33 s of CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
source .ci/trainers/lib.sh
VENV=.venv-axolotl
PY="$VENV/bin/python"
start=$(date +%s)
# Phase "install" (the venv, no packkit) can run ahead in the background: .ci/trainers/run.sh starts every
# trainer's install at the start of .ci/run, then runs the "test" phases one by one. No argument: both.
phase=${1:-all}
case "$phase" in install|test|all) ;; *) echo "usage: $0 [install|test|all]" >&2; exit 2 ;; esac
if [ "$phase" != test ]; then
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0 transformers==5.16.1 trl==1.9.0 accelerate==1.13.0 peft==0.20.0 \
  datasets==4.8.4 numba==0.68.1 numpy pybind11 scikit-build-core cmake ninja pytest hypothesis
"$VENV/bin/pip" install -q --no-deps axolotl==0.19.0 pillow==11.3.0 addict==2.4.0 colorama==0.4.6 posthog==6.7.11 \
  six==1.17.0 backoff==2.2.1 distro==1.9.0
# What `axolotl train cfg.yml` (its CLI: the accelerate launcher, config loading, model and tokenizer loaders, the
# trainer builder) imports beyond that, found by running it here (issue 47): each was missing in turn.
"$VENV/bin/pip" install -q python-dotenv==1.0.1 fire==0.7.1 art==6.5 fastcore==2.2.41 evaluate==0.4.1 wandb==0.31.0 \
  bitsandbytes==0.50.2 triton==3.9.0 axolotl-contribs-lgpl==0.0.7 axolotl-contribs-mit==0.0.6
fi
if [ "$phase" = install ]; then exit 0; fi
install_packkit "$VENV"
echo "axolotl venv ready in $(( $(date +%s) - start )) s"
"$PY" -P -m pytest -q -p no:cacheprovider tests/test_axolotl_sampler.py tests/test_axolotl_plugin.py
# `axolotl train cfg.yml` itself, with the plugin and without (the control; issue 47; PACKKIT_TRAINER_ENTRY=0 skips
# it), timed apart for the CI budget.
if [ "${PACKKIT_TRAINER_ENTRY:-1}" = 1 ]; then
  entry=$(date +%s)
  "$PY" -P -m pytest -q -p no:cacheprovider tests/test_axolotl_entry.py
  echo "axolotl entry-point test: $(( $(date +%s) - entry )) s"
fi
# The benchmark's axolotl script on 5,000 lengths (the contract's JSON rows; nothing kept).
smoke=$(mktemp -d)
"$PY" -P -c "import numpy as np; np.save('$smoke/l.npy', np.clip(np.round(np.exp(np.random.default_rng(0).normal(np.log(800), 0.932, 5000))), 16, 8192).astype(np.int64))"
"$PY" benchmarks/trainers/axolotl.py --lengths "$smoke/l.npy" --capacity 8192 --dp-size 8 --hidden 4096 \
  --out "$smoke/out.json" --repeats 1
rm -rf "$smoke"
echo "axolotl stage: $(( $(date +%s) - start )) s"
