#!/usr/bin/env bash
# Prints the path of qemu-ARCH-static (ARCH: aarch64, the default), Debian 12's qemu-user-static
# (pinned, checked against its sha256), for running another architecture's static binary on this
# x86_64 machine: `make image-run` starts the arm64 image's binary under it. User-mode emulation
# only, called by its path: no binfmt_misc handler is registered, nothing in the kernel or the
# system changes. The package (63 MB) is unpacked once into
# ${ST_CACHE_DIR:-~/.cache/safe-termination}/tools/qemu-user-static-<version>/, keeping only the
# emulators of QEMU_ARCHES (aarch64) and the copyright file; a cache hit returns at once.
set -euo pipefail

VERSION=1:7.2+dfsg-7+deb12u18+b3
SHA256=c3e3ba2bd87f8c5b9a5da5ef21b5a3b82d7c63b89dd448d9ddaa4eabc5b6e402
QEMU_ARCHES=(aarch64)
arch="${1:-aarch64}"
[[ " ${QEMU_ARCHES[*]} " == *" $arch "* ]] || {
  echo "e2e/toolchain/qemu.sh: no emulator kept for '$arch' (kept: ${QEMU_ARCHES[*]})" >&2
  exit 2
}
v="${VERSION#*:}"
DIR="${ST_CACHE_DIR:-$HOME/.cache/safe-termination}/tools/qemu-user-static-${v%%+*}"
BIN="$DIR/qemu-$arch-static"

# shellcheck source=e2e/toolchain/deb-unpack.sh
source "$(dirname "${BASH_SOURCE[0]}")/deb-unpack.sh"
if [[ ! -x "$BIN" ]]; then
  mkdir -p "$(dirname "$DIR")"
  unpacked="$DIR.deb"
  deb_unpack qemu-user-static "$VERSION" "$SHA256" "$unpacked"
  mkdir -p "$DIR.part"
  for a in "${QEMU_ARCHES[@]}"; do
    cp "$unpacked/usr/bin/qemu-$a-static" "$DIR.part/"
  done
  cp "$unpacked/usr/share/doc/qemu-user-static/copyright" "$DIR.part/"
  rm -rf "$DIR" "$unpacked"
  mv "$DIR.part" "$DIR"
fi
echo "$BIN"
