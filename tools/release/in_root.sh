#!/bin/sh
# Runs a compiler inside the release build root, in the current directory (the same path there: build_wheel.sh
# bind-mounts the clone, the Python headers and the CUDA toolkit at their own paths), so CMake and pip run on
# the host while every compile and link uses bullseye's gcc 10, glibc 2.31 and libstdc++.
#   in_root.sh TOOL ARGS...      (tools/release/bin/{gcc,g++,nvcc} call this with their own name)
# A clean environment: nothing of the host's (compiler flags, library paths) leaks into the release build.
tool=$1
shift
# Already inside the root (nvcc calling its host compiler, which is this wrapper too): run the tool itself.
[ -f /.packkit-release-root ] && exec "$tool" "$@"
: "${PACKKIT_RELEASE_ROOT:?in_root.sh: PACKKIT_RELEASE_ROOT is not set (tools/build_wheel.sh sets it)}"
exec chroot "$PACKKIT_RELEASE_ROOT" /usr/bin/env -i LANG=C HOME=/root TMPDIR=/tmp \
  PATH="${PACKKIT_RELEASE_CUDA_BIN:+$PACKKIT_RELEASE_CUDA_BIN:}/usr/local/bin:/usr/bin:/bin" \
  /bin/sh -c 'cd "$0" || exit 1; exec "$@"' "$PWD" "$tool" "$@"
