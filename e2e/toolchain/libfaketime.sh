#!/usr/bin/env bash
# Unpacks libfaketime (Debian 12's package, pinned and checked against its sha256) into
# ~/.cache/safe-termination/tools/libfaketime-<version>/ for the end-to-end test of a node whose
# clock is off (tests/e2e_observer_faults.rs: a node agent started with LD_PRELOAD and FAKETIME).
# Nothing is installed into the system: `apt-get download` fetches the .deb, `dpkg -x` unpacks
# it. A cache hit returns at once. Prints the multi-threaded library's path.
set -euo pipefail

VERSION=0.9.10-2.1
SHA256=b09481e7690680966005330c3f907bba4b5eefc35e1faaea4783cc55655d1150
DIR=${XDG_CACHE_HOME:-$HOME/.cache}/safe-termination/tools/libfaketime-${VERSION%%-*}
LIB=$DIR/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1

# shellcheck source=e2e/toolchain/deb-unpack.sh
source "$(dirname "${BASH_SOURCE[0]}")/deb-unpack.sh"
if [[ ! -f "$LIB" ]]; then
  deb_unpack libfaketime "$VERSION" "$SHA256" "$DIR"
fi
echo "$LIB"
