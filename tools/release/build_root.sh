#!/usr/bin/env bash
# The release build root: Debian 11 "bullseye" (glibc 2.31, gcc 10.2, libstdc++ GLIBCXX_3.4.28), made with
# debootstrap from Debian's package registry. tools/build_wheel.sh compiles and links every binary inside it
# (tools/release/in_root.sh), so no binary can ask for a glibc or libstdc++ symbol newer than bullseye's:
# that is what makes the wheels manylinux_2_31 (auditwheel decides the final tag from the symbols). Why not
# glibc 2.28 (torch's own floor): docs/install.md, "Why manylinux_2_31".
#
#   bash tools/release/build_root.sh [DIR]      # default $PACKKIT_RELEASE_ROOT or ~/.cache/packkit/bullseye-root
#
# Needs root (debootstrap, chroot). About 2-3 minutes and 500 MB the first time; reused when DIR/.ready exists.
set -euo pipefail
ROOT_DIR=${1:-${PACKKIT_RELEASE_ROOT:-$HOME/.cache/packkit/bullseye-root}}
SUITE=bullseye
MIRROR=${PACKKIT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ -f "$ROOT_DIR/.ready" ]; then
  touch "$ROOT_DIR/.packkit-release-root"  # tools/release/in_root.sh: "already inside"
  echo "$ROOT_DIR"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "build_root.sh: debootstrap and chroot need root" >&2; exit 1; }
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "installing debootstrap (apt-get)" >&2
  apt-get install -y -q debootstrap >/dev/null
fi
if grep -q " $ROOT_DIR/" /proc/mounts; then  # never rm -rf through a bind mount of the clone
  echo "build_root.sh: $ROOT_DIR has mounts in use (a build running?): not touching it" >&2; exit 1
fi
rm -rf "$ROOT_DIR"
mkdir -p "$ROOT_DIR"
start=$SECONDS
debootstrap --variant=minbase --include=g++,make "$SUITE" "$ROOT_DIR" "$MIRROR" >"$ROOT_DIR.log" 2>&1 \
  || { tail -20 "$ROOT_DIR.log" >&2; echo "build_root.sh: debootstrap $SUITE failed (log: $ROOT_DIR.log)" >&2; exit 1; }
chroot "$ROOT_DIR" g++ --version | sed -n 1p >&2  # sed, not head: no SIGPIPE under pipefail
chroot "$ROOT_DIR" ldd --version | sed -n 1p >&2
echo "build root ready in $((SECONDS - start)) s" >&2
touch "$ROOT_DIR/.packkit-release-root" "$ROOT_DIR/.ready"
echo "$ROOT_DIR"
