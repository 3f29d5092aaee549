# shellcheck shell=bash
# deb_unpack PACKAGE VERSION SHA256 DIR: Debian's PACKAGE=VERSION (amd64) fetched with `apt-get
# download`, checked against SHA256, and unpacked with `dpkg -x` into DIR (replaced whole, via
# DIR.part). VERSION may carry an epoch (1:7.2...; apt writes it as %3a in the file's name).
# Nothing is installed into the system. Sourced by e2e/toolchain/libfaketime.sh, bpftool.sh and
# qemu.sh, which call it on a cache miss.
deb_unpack() {
  local pkg="$1" version="$2" sha256="$3" dir="$4" tmp deb
  if [[ "$(uname -m)" != x86_64 ]]; then
    echo "e2e/toolchain: the pinned $pkg package is for amd64 only, this machine is $(uname -m)" >&2
    return 1
  fi
  tmp=$(mktemp -d)
  # apt's _apt user downloads into the directory: let it write there (else a warning, as root)
  chmod 777 "$tmp"
  if ! (cd "$tmp" && apt-get download -q "$pkg=$version" >/dev/null); then
    apt-get update -q >/dev/null || true
    (cd "$tmp" && apt-get download -q "$pkg=$version" >/dev/null) || {
      echo "e2e/toolchain: apt-get download $pkg=$version failed; offered: $(apt-cache policy "$pkg" | sed -n 's/ *Candidate: //p')" >&2
      rm -rf "$tmp"
      return 1
    }
  fi
  deb="$tmp/${pkg}_${version/:/%3a}_amd64.deb"
  if ! echo "$sha256  $deb" | sha256sum --check --quiet; then
    rm -rf "$tmp"
    return 1
  fi
  mkdir -p "$dir.part"
  dpkg -x "$deb" "$dir.part"
  rm -rf "$dir" "$tmp"
  mv "$dir.part" "$dir"
}
