#!/usr/bin/env bash
# Build Cilium's node components from the published Go module, for a Cilium node in the local
# e2e cluster: cilium-agent (./daemon), cilium-cni (./plugins/cilium-cni) and cilium-dbg
# (./cilium-dbg), next to what the agent reads at start: the module's bpf/ (its --lib-dir
# content) and the 22 CRDs it needs applied (pkg/k8s/apis/cilium.io/client/crds/{v2,v2alpha1}).
# Plus clang 19, which the agent runs to compile its datapath (it needs clang >= 18; Debian
# 12's default clang is 14): Debian's own clang-19 packages, fetched with `apt-get download`
# and unpacked with `dpkg -x` into the cache, never installed into the system.
#
#   e2e/toolchain/build-cilium.sh     # or: make cilium-bins
#
# Output: ${ST_CACHE_DIR:-~/.cache/safe-termination}/cilium-v<CILIUM_VERSION>/
#   bin/    cilium-agent cilium-cni cilium-dbg, and clang (a wrapper: the unpacked clang 19 with
#           its libraries on LD_LIBRARY_PATH); put this folder first on the agent's PATH
#   lib/    bpf/ from the module: the agent's --lib-dir
#   crds/   v2/*.yaml and v2alpha1/*.yaml (kubectl apply --server-side -f crds/v2 -f crds/v2alpha1)
#   llvm/   the unpacked Debian packages (usr/lib/llvm-19, usr/lib/x86_64-linux-gnu)
# A rerun with everything present and up to date exits in seconds. Builds only: starts nothing.
set -euo pipefail

# ---------------------------------------------------------------- pins (the only place)
# v1.20.2 is the newest Cilium the Go module proxy serves here (later 1.20.x and the 1.21
# pre-releases are refused). Its go.mod declares go 1.26.0.
CILIUM_VERSION=1.20.2
# Cilium 1.20.2's go.mod requires this gobgp pseudo-version, which the module proxy refuses.
# v4.7.0 is that commit plus five BFD-only commits of the same day, with the same go.mod. The
# replace names the exact version, so it applies to nothing once a new pin requires another one.
GOBGP_PINNED=v4.6.1-0.20260630022313-d6dee8360046
GOBGP_REPLACEMENT=v4.7.0
# Debian 12's clang 19 (bookworm main). What clang needs at run time: its libraries (LLVM,
# clang-cpp) and its resource headers (libclang-common); llvm-19 (llc, objdump, ...) is not
# needed: 1.20's loader runs clang only. The rest of clang-19's dependencies are Debian 12
# base libraries (libstdc++6, libz3-4, libxml2, libedit2, libffi8, libzstd1, zlib1g).
LLVM_MAJOR=19
LLVM_DEB_VERSION=1:19.1.7-3~deb12u1
LLVM_DEBS="clang-$LLVM_MAJOR libclang-cpp$LLVM_MAJOR libllvm$LLVM_MAJOR libclang-common-$LLVM_MAJOR-dev"

CACHE_ROOT="${ST_CACHE_DIR:-$HOME/.cache/safe-termination}"
DEST="$CACHE_ROOT/cilium-v$CILIUM_VERSION"
BIN="$DEST/bin"

log() { printf '[build-cilium %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { log "ERROR: $*"; exit 1; }

tmp=""
cleanup() { if [[ -n "$tmp" ]]; then rm -rf "$tmp"; fi; }
trap cleanup EXIT
scratch() { [[ -n "$tmp" ]] || tmp="$(mktemp -d /tmp/st-build-cilium.XXXXXX)"; }

mkdir -p "$BIN"
start_all=$SECONDS
did=() check_bpf=0

# ---------------------------------------------------------------- clang 19
# Stamp: the packages and their version. The wrapper finds the unpacked tree next to itself,
# so the cache folder can move (ST_CACHE_DIR).
llvm_stamp="$(echo "$LLVM_DEBS $LLVM_DEB_VERSION" | sha256sum | cut -c1-16)"
if [[ -x "$BIN/clang" && -d "$DEST/llvm" && "$(cat "$DEST/.llvm.stamp" 2>/dev/null)" == "$llvm_stamp" ]]; then
  :
else
  if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
    die "clang $LLVM_MAJOR comes from Debian packages: need apt-get and dpkg"
  fi
  log "fetching Debian packages $LLVM_DEBS ($LLVM_DEB_VERSION)"
  scratch
  mkdir -p "$tmp/debs"
  # apt drops to the _apt user for downloads: let it write here (else it warns and runs as root)
  chmod 755 "$tmp"
  chown _apt "$tmp/debs" 2>/dev/null || true
  want=()
  for p in $LLVM_DEBS; do want+=("$p=$LLVM_DEB_VERSION"); done
  if ! (cd "$tmp/debs" && apt-get download -q "${want[@]}"); then
    log "apt-get download failed; updating the package lists once and retrying"
    apt-get update -qq
    (cd "$tmp/debs" && apt-get download -q "${want[@]}") \
      || die "cannot download ${want[*]} (apt-cache policy clang-$LLVM_MAJOR: $(apt-cache policy "clang-$LLVM_MAJOR" | awk '/Candidate/{print $2}')); update LLVM_DEB_VERSION in $0"
  fi
  rm -rf "${DEST:?}/.llvm.tmp"
  mkdir -p "$DEST/.llvm.tmp"
  for deb in "$tmp"/debs/*.deb; do dpkg -x "$deb" "$DEST/.llvm.tmp"; done
  rm -rf "${DEST:?}/llvm"
  mv "$DEST/.llvm.tmp" "$DEST/llvm"
  cat > "$BIN/.clang.tmp" <<EOF
#!/bin/sh
# clang $LLVM_MAJOR from Debian's packages ($LLVM_DEB_VERSION), unpacked by e2e/toolchain/build-cilium.sh into ../llvm
root="\$(dirname "\$(readlink -f "\$0")")/../llvm"
LD_LIBRARY_PATH="\$root/usr/lib/x86_64-linux-gnu:\$root/usr/lib/llvm-$LLVM_MAJOR/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "\$root/usr/lib/llvm-$LLVM_MAJOR/bin/clang" "\$@"
EOF
  chmod 755 "$BIN/.clang.tmp"
  mv -f "$BIN/.clang.tmp" "$BIN/clang"
  # it must run (its libraries resolve) and compile BPF, as the agent will
  "$BIN/clang" --version >/dev/null || die "the unpacked clang does not run: $(ldd "$DEST/llvm/usr/lib/llvm-$LLVM_MAJOR/bin/clang" | grep 'not found' || true)"
  scratch
  printf '%s\n' 'int prog(void *ctx) { return ctx != 0; }' \
    'char _license[] __attribute__((section("license"), used)) = "GPL";' > "$tmp/probe.c"
  "$BIN/clang" --target=bpf -O2 -g -nostdinc -mcpu=v3 -c "$tmp/probe.c" -o "$tmp/probe.o" \
    || die "the unpacked clang cannot compile a BPF object"
  echo "$llvm_stamp" > "$DEST/.llvm.stamp"
  did+=("clang $LLVM_MAJOR") check_bpf=1
fi

# ---------------------------------------------------------------- the module
command -v go >/dev/null || die "go not found in PATH (need Go >= 1.26.0, the go directive of Cilium $CILIUM_VERSION)"
export GOTOOLCHAIN=local            # never download a toolchain
export CGO_ENABLED=0
# -mod=mod: the copy's go.sum gains the entries of the gobgp replacement (checked against the
# checksum database like any download)
export GOFLAGS="-mod=mod -buildvcs=false"
GOV="$(go env GOVERSION)"

# The module's commit time, from the module proxy's .info; the proxy does not tell the tag's
# commit, so the revision stays empty. pkg/version parses "VERSION REVISION DATE go version
# ...": with the version alone its fields would be empty (cilium_version metric, cilium-dbg
# version -o json), so the three fields are kept, as upstream's Makefile.defs writes them.
moddir="" moddate=""
module() {
  if [[ -z "$moddir" ]]; then
    local info
    info="$(cd / && go mod download -json "github.com/cilium/cilium@v$CILIUM_VERSION")"
    moddir="$(jq -r '.Dir // empty' <<<"$info")"
    [[ -d "$moddir" ]] || die "go mod download github.com/cilium/cilium@v$CILIUM_VERSION: $(jq -r '.Error // empty' <<<"$info")"
    moddate="$(jq -r '.Time // empty' "$(jq -r '.Info' <<<"$info")")"
  fi
}
# -s -w as upstream's Makefile.defs (without NOSTRIP)
LDFLAGS="-s -w -X 'github.com/cilium/cilium/pkg/version.ciliumVersion=$CILIUM_VERSION  @DATE@'"

# name | package dir in the module
targets=("cilium-agent|./daemon" "cilium-cni|./plugins/cilium-cni" "cilium-dbg|./cilium-dbg")
src=""
for t in "${targets[@]}"; do
  IFS='|' read -r name pkg <<<"$t"
  # Stamp = what changes the binary: the pins, the toolchain, the flags.
  stamp="$(echo "$CILIUM_VERSION gobgp $GOBGP_PINNED=>$GOBGP_REPLACEMENT $GOV $pkg $LDFLAGS trimpath cgo=$CGO_ENABLED" | sha256sum | cut -c1-16)"
  if [[ -x "$BIN/$name" && "$(cat "$BIN/.$name.stamp" 2>/dev/null)" == "$stamp" ]]; then
    continue
  fi
  if [[ -z "$src" ]]; then
    # go.mod has a replace (controller-tools), so `go install pkg@version` refuses it: build in a
    # writable copy of the module's folder, with the gobgp replace added.
    module
    scratch
    src="$tmp/cilium"
    log "copying github.com/cilium/cilium@v$CILIUM_VERSION to $src"
    cp -r "$moddir" "$src"
    chmod -R u+w "$src"
    grep -Eq "^[[:space:]]*github\.com/osrg/gobgp/v4 ${GOBGP_PINNED//./\\.}\$" "$src/go.mod" \
      || log "note: go.mod no longer requires gobgp $GOBGP_PINNED: the replace does not apply"
    (cd "$src" && go mod edit -replace="github.com/osrg/gobgp/v4@$GOBGP_PINNED=github.com/osrg/gobgp/v4@$GOBGP_REPLACEMENT")
  fi
  log "building $name ($pkg)"
  t0=$SECONDS
  (cd "$src" && nice -n 10 go build -trimpath -ldflags "${LDFLAGS/@DATE@/${moddate:-1970-01-01T00:00:00Z}}" -o "$BIN/.$name.tmp" "$pkg")
  mv -f "$BIN/.$name.tmp" "$BIN/$name"
  echo "$stamp" > "$BIN/.$name.stamp"
  log "built $name in $((SECONDS - t0))s"
  did+=("$name")
done

# ---------------------------------------------------------------- bpf/ and the CRDs
files_stamp="$(echo "$CILIUM_VERSION bpf crds/v2 crds/v2alpha1" | sha256sum | cut -c1-16)"
if [[ -d "$DEST/lib/bpf" && -d "$DEST/crds" && "$(cat "$DEST/.files.stamp" 2>/dev/null)" == "$files_stamp" ]]; then
  :
else
  module
  log "installing bpf/ and the CRDs of v$CILIUM_VERSION"
  rm -rf "${DEST:?}/.lib.tmp" "$DEST/.crds.tmp"
  mkdir -p "$DEST/.lib.tmp" "$DEST/.crds.tmp"
  cp -r "$moddir/bpf" "$DEST/.lib.tmp/bpf"
  chmod -R u+w,go+rX "$DEST/.lib.tmp"
  for v in v2 v2alpha1; do
    mkdir -p "$DEST/.crds.tmp/$v"
    install -m 644 "$moddir/pkg/k8s/apis/cilium.io/client/crds/$v"/*.yaml "$DEST/.crds.tmp/$v/"
  done
  n="$(find "$DEST/.crds.tmp" -name '*.yaml' | wc -l)"
  ((n == 22)) || log "note: $n CRDs in v$CILIUM_VERSION (1.20.2 has 22)"
  rm -rf "${DEST:?}/lib" "$DEST/crds"
  mv "$DEST/.lib.tmp" "$DEST/lib"
  mv "$DEST/.crds.tmp" "$DEST/crds"
  echo "$files_stamp" > "$DEST/.files.stamp"
  did+=("bpf/ and CRDs") check_bpf=1
fi

# What the agent will compile at start, compiled once here with clang as the agent runs it
# (StandardCFlags of pkg/datapath/loader/compile.go, -mcpu=v3 as on this kernel; the default
# node_config.h and ep_config.h of bpf/ stand in for the ones the agent writes), whenever clang
# or bpf/ is new.
if ((check_bpf)); then
  scratch
  for prog in bpf_host bpf_lxc bpf_sock; do
    "$BIN/clang" -I"$DEST/lib/bpf" -I"$DEST/lib/bpf/include" -g -O2 --target=bpf -std=gnu99 -nostdinc \
      -ftrap-function=__undefined_trap -Wall -Wextra -Werror -Wshadow -Wno-address-of-packed-member \
      -Wno-unknown-warning-option -Wno-gnu-variable-sized-type-not-at-end -Wimplicit-int-conversion \
      -Wenum-conversion -Wimplicit-fallthrough -mcpu=v3 -c "$DEST/lib/bpf/$prog.c" -o "$tmp/$prog.o" \
      || die "clang $LLVM_MAJOR cannot compile $prog.c of Cilium $CILIUM_VERSION"
  done
  log "checked: clang $LLVM_MAJOR compiles bpf_host.c, bpf_lxc.c and bpf_sock.c of bpf/"
fi

if ((${#did[@]})); then log "built ${did[*]} in $((SECONDS - start_all))s into $DEST"; fi
agent="$("$BIN/cilium-agent" --version)"
log "ready: $DEST (${agent%% go version*}, $("$BIN/clang" --version | head -n1), $(find "$DEST/crds" -name '*.yaml' | wc -l) CRDs)"
