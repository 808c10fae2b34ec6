# Sourced by the trainer stages (.ci/trainers/<trainer>.sh). Each trainer gets a venv of its own, pinned to its
# versions; packkit goes into it as a wheel of the main venv's build when PACKKIT_WHEEL names one (made once by
# .ci/trainers/run.sh: an incremental build of build/<tag>, seconds, same Python and torch 2.13.0), else it is
# built from source into build/<venv>-<tag> (a full C++ build, ~2-5 min on the 2-core machine).
install_packkit() {  # $1: the venv
  if [ -n "${PACKKIT_WHEEL:-}" ]; then
    "$1/bin/pip" install -q --no-deps --force-reinstall "$PACKKIT_WHEEL"
  else
    "$1/bin/pip" install -q --no-build-isolation -e . --config-settings=build-dir="build/${1#.}-{wheel_tag}"
  fi
}
# `python -P`: never ./packkit from the working directory (the source tree holds no compiled modules; with a
# wheel installed, the installed package is the one under test).
