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

if [[ ! -f "$LIB" ]]; then
  if [[ "$(uname -m)" != x86_64 ]]; then
    echo "e2e/toolchain/libfaketime.sh: the pinned package is for amd64 only, this machine is $(uname -m)" >&2
    exit 1
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # apt's _apt user downloads into the directory: let it write there (else a warning, as root)
  chmod 777 "$tmp"
  if ! (cd "$tmp" && apt-get download -q "libfaketime=$VERSION" >/dev/null); then
    apt-get update -q >/dev/null || true
    (cd "$tmp" && apt-get download -q "libfaketime=$VERSION" >/dev/null) || {
      echo "e2e/toolchain/libfaketime.sh: apt-get download libfaketime=$VERSION failed; offered: $(apt-cache policy libfaketime | sed -n 's/ *Candidate: //p')" >&2
      exit 1
    }
  fi
  echo "$SHA256  $tmp/libfaketime_${VERSION}_amd64.deb" | sha256sum --check --quiet
  mkdir -p "$DIR.part"
  dpkg -x "$tmp/libfaketime_${VERSION}_amd64.deb" "$DIR.part"
  rm -rf "$DIR"
  mv "$DIR.part" "$DIR"
fi
echo "$LIB"
