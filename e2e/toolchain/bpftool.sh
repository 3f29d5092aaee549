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

if [[ ! -x "$BIN" ]]; then
  if [[ "$(uname -m)" != x86_64 ]]; then
    echo "e2e/toolchain/bpftool.sh: the pinned package is for amd64 only, this machine is $(uname -m)" >&2
    exit 1
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # apt's _apt user downloads into the directory: let it write there (else a warning, as root)
  chmod 777 "$tmp"
  if ! (cd "$tmp" && apt-get download -q "bpftool=$VERSION" >/dev/null); then
    apt-get update -q >/dev/null || true
    (cd "$tmp" && apt-get download -q "bpftool=$VERSION" >/dev/null) || {
      echo "e2e/toolchain/bpftool.sh: apt-get download bpftool=$VERSION failed; offered: $(apt-cache policy bpftool | sed -n 's/ *Candidate: //p')" >&2
      exit 1
    }
  fi
  echo "$SHA256  $tmp/bpftool_${VERSION}_amd64.deb" | sha256sum --check --quiet
  mkdir -p "$DIR.part"
  dpkg -x "$tmp/bpftool_${VERSION}_amd64.deb" "$DIR.part"
  rm -rf "$DIR"
  mv "$DIR.part" "$DIR"
fi
echo "$BIN"
