#!/usr/bin/env bash
# Unpacks bpftool (Debian 12's package, pinned and checked against its sha256) into
# ~/.cache/safe-termination/tools/bpftool-<version>/ for the harness's checks of the Cilium node:
# e2e/cluster/leftovers.sh lists BPF programs, maps and links Cilium left behind. Nothing is
# installed into the system: `apt-get download` fetches the .deb, `dpkg -x` unpacks it. A cache
# hit returns at once. Prints the binary's path.
set -euo pipefail

VERSION=7.1.0+6.1.192-3
SHA256=1967b1650d890d19455258b46bdceef9d0bfa0caa9c3bf3842f22e3f68c4a881
DIR=${XDG_CACHE_HOME:-$HOME/.cache}/safe-termination/tools/bpftool-${VERSION%%+*}
BIN=$DIR/usr/sbin/bpftool

# shellcheck source=e2e/toolchain/deb-unpack.sh
source "$(dirname "${BASH_SOURCE[0]}")/deb-unpack.sh"
if [[ ! -x "$BIN" ]]; then
  deb_unpack bpftool "$VERSION" "$SHA256" "$DIR"
fi
echo "$BIN"
