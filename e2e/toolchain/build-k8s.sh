#!/usr/bin/env bash
# Build the local e2e control plane from published Go modules (no prebuilt
# downloads): etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kube-proxy, kubectl (from k8s.io/kubernetes + go.etcd.io/etcd/server/v3),
# kwok, helm, promtool and the Prometheus server; for the real nodes (e2e/cluster/nodes.sh) kubelet (same
# module as the control plane) and containerd 2.x (containerd, its runc shim, ctr).
#
#   e2e/toolchain/build-k8s.sh            # version from e2e/toolchain/k8s-version (or $ST_K8S_VERSION)
#   e2e/toolchain/build-k8s.sh 1.29.15    # needs a module under e2e/toolchain/ pinning that version
#   ST_CLUSTER_ONLY=1 e2e/toolchain/build-k8s.sh   # only what a cluster runs (make demo): no helm,
#                                         # promtool or Prometheus server (the tests' tools)
#   ST_BUILD_ONLY="helm promtool" e2e/toolchain/build-k8s.sh   # only these (make test-tools: what
#                                         # make test needs, tests/chart_render.rs)
#
# Output: ${ST_CACHE_DIR:-~/.cache/safe-termination}/k8s-v<VERSION>/bin
# A rerun with every binary present and up to date exits in seconds.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSION="${1:-${ST_K8S_VERSION:-$(tr -d '[:space:]' < "$HERE/k8s-version")}}"
VERSION="${VERSION#v}"
CACHE_ROOT="${ST_CACHE_DIR:-$HOME/.cache/safe-termination}"
BIN="$CACHE_ROOT/k8s-v$VERSION/bin"

log() { printf '[build-k8s %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- packages
# Runtime tools that cluster-up.sh and the tests use. Installed only when missing.
ensure_debian_packages() {
  local want=() cmd pkg
  while read -r cmd pkg; do
    if [[ "$cmd" == /* ]]; then [[ -x "$cmd" ]] || want+=("$pkg"); continue; fi
    command -v "$cmd" >/dev/null 2>&1 || want+=("$pkg")
  done <<'EOF'
ip iproute2
xtables-legacy-multi iptables
xtables-nft-multi iptables
nft nftables
conntrack conntrack
socat socat
openssl openssl
curl curl
jq jq
setsid util-linux
runc runc
nsenter util-linux
python3 python3
/usr/lib/cni/bridge containernetworking-plugins
EOF
  if ((${#want[@]})); then
    command -v apt-get >/dev/null || die "missing ${want[*]} and no apt-get"
    log "installing Debian packages: ${want[*]}"
    local sudo=()   # not root (a CI runner's user, e.g. the release workflow's make chart-push): sudo
    [[ "$(id -u)" -eq 0 ]] || sudo=(sudo DEBIAN_FRONTEND=noninteractive)
    if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then   # never updated
      "${sudo[@]}" apt-get update -qq
    fi
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${want[@]}" \
      || { "${sudo[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${want[@]}"; }
  fi
}
ensure_debian_packages

command -v go >/dev/null || die "go not found in PATH (need Go >= the go directive of the pinned modules)"
export GOTOOLCHAIN=local            # never download a toolchain
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"

# ---------------------------------------------------------------- module for this version
K8S_MOD=""
for d in "$HERE"/k8s "$HERE"/k8s-*; do
  [[ -f "$d/go.mod" ]] || continue
  if grep -Eq "^[[:space:]]*(require[[:space:]]+)?k8s\.io/kubernetes v${VERSION//./\\.}\$" "$d/go.mod"; then
    K8S_MOD="$d"; break
  fi
done
[[ -n "$K8S_MOD" ]] || die "no module under $HERE pins k8s.io/kubernetes v$VERSION.
  Create one:  e2e/toolchain/gen-k8s-mod.sh $VERSION e2e/toolchain/k8s-${VERSION%.*}"

MAJOR="${VERSION%%.*}"; MINOR="${VERSION#*.}"; MINOR="${MINOR%%.*}"
# Release time of the tag, from the module proxy's .info (stable across rebuilds).
BUILD_DATE="$(cd "$K8S_MOD" && go list -m -json k8s.io/kubernetes | jq -r '.Time // empty')"
BUILD_DATE="${BUILD_DATE:-1970-01-01T00:00:00Z}"

K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X $pkg.gitVersion=v$VERSION -X $pkg.gitMajor=$MAJOR -X $pkg.gitMinor=$MINOR"
  # gitCommit: the module proxy does not tell the tag's commit; leave it empty
  # rather than the "$Format:%H$" placeholder of the source archive.
  K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE -X $pkg.gitCommit="
done
# Go >= 1.23 rejects //go:linkname pulls into the runtime that old releases'
# dependencies (e.g. github.com/modern-go/reflect2 < 1.0.2 era) still do.
if (( MINOR < 31 )); then K8S_LDFLAGS+=" -checklinkname=0"; fi

modver() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }

# name | module dir | package | ldflags
targets=()
add() { targets+=("$1|$2|$3|$4"); }
add etcd                    "$K8S_MOD" go.etcd.io/etcd/server/v3 "-s -w"
add kube-apiserver          "$K8S_MOD" k8s.io/kubernetes/cmd/kube-apiserver "$K8S_LDFLAGS"
add kube-controller-manager "$K8S_MOD" k8s.io/kubernetes/cmd/kube-controller-manager "$K8S_LDFLAGS"
add kube-scheduler          "$K8S_MOD" k8s.io/kubernetes/cmd/kube-scheduler "$K8S_LDFLAGS"
add kube-proxy              "$K8S_MOD" k8s.io/kubernetes/cmd/kube-proxy "$K8S_LDFLAGS"
add kubectl                 "$K8S_MOD" k8s.io/kubernetes/cmd/kubectl "$K8S_LDFLAGS"
# real nodes (e2e/cluster/nodes.sh): only for a version whose module records the kubelet (tools.go)
CTRD_VER="$(modver "$HERE/containerd" github.com/containerd/containerd/v2)"
if grep -q '"k8s.io/kubernetes/cmd/kubelet"' "$K8S_MOD/tools.go"; then
  add kubelet               "$K8S_MOD" k8s.io/kubernetes/cmd/kubelet "$K8S_LDFLAGS"
  CTRD_LDFLAGS="-s -w -X github.com/containerd/containerd/v2/version.Version=$CTRD_VER -X github.com/containerd/containerd/v2/version.Revision="
  for c in containerd containerd-shim-runc-v2 ctr; do
    add "$c"                "$HERE/containerd" "github.com/containerd/containerd/v2/cmd/$c" "$CTRD_LDFLAGS"
  done
fi
add kwok                    "$HERE/kwok" sigs.k8s.io/kwok/cmd/kwok "-s -w"
# the tests' tools: the chart (helm), the alert rules and native-histogram maths (promtool), the
# Prometheus source (the server); a cluster runs without them
tools=1
[[ "${ST_CLUSTER_ONLY:-0}" == 1 ]] && tools=0
HELM_VER="$(modver "$HERE/helm" helm.sh/helm/v4)"
((tools)) && add helm       "$HERE/helm" helm.sh/helm/v4/cmd/helm "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VER"
PROM_MODVER="$(modver "$HERE/promtool" github.com/prometheus/prometheus)"   # v0.3XX.Y == Prometheus 3.XX.Y
PROM_VER="$(sed -E 's/^v0\.3([0-9]{2})\.([0-9]+)$/3.\1.\2/; s/^3\.0([0-9])/3.\1/' <<<"$PROM_MODVER")"
PROM_LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=$PROM_VER -X github.com/prometheus/common/version.Branch=$PROM_MODVER"
((tools)) && add promtool   "$HERE/promtool" github.com/prometheus/prometheus/cmd/promtool "$PROM_LDFLAGS"
# The Prometheus server (tests/e2e_prometheus.rs), its own module (the server imports far more than
# promtool: OTLP, the web API) pinned to the same release. Built without the `builtinassets` tag
# (upstream's default for `go build`): the React UI is not in the module zip and is not needed;
# the HTTP API (/api/v1/query, /api/v1/rules, /api/v1/alerts) is all the tests use.
SERVER_MODVER="$(modver "$HERE/prometheus" github.com/prometheus/prometheus)"
[[ "$SERVER_MODVER" == "$PROM_MODVER" ]] \
  || die "e2e/toolchain/prometheus pins prometheus $SERVER_MODVER but e2e/toolchain/promtool $PROM_MODVER: keep them equal"
((tools)) && add prometheus "$HERE/prometheus" github.com/prometheus/prometheus/cmd/prometheus "$PROM_LDFLAGS"

mkdir -p "$BIN"
GOV="$(go env GOVERSION)"
built=0 start_all=$SECONDS
only="${ST_BUILD_ONLY:-}"
for t in "${targets[@]}"; do
  IFS='|' read -r name mod pkg ldflags <<<"$t"
  [[ -z "$only" || " $only " == *" $name "* ]] || continue
  # Stamp = inputs that change the binary: go.mod/go.sum, toolchain, flags.
  stamp="$( { cat "$mod/go.mod" "$mod/go.sum"; echo "$GOV $pkg $ldflags trimpath cgo=$CGO_ENABLED"; } | sha256sum | cut -c1-16)"
  if [[ -x "$BIN/$name" && "$(cat "$BIN/.$name.stamp" 2>/dev/null)" == "$stamp" ]]; then
    continue
  fi
  log "building $name ($pkg) in ${mod#"$HERE"/}"
  t0=$SECONDS
  (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$BIN/.$name.tmp" "$pkg")
  mv -f "$BIN/.$name.tmp" "$BIN/$name"
  echo "$stamp" > "$BIN/.$name.stamp"
  log "built $name in $((SECONDS - t0))s"
  built=$((built + 1))
done
if [[ -n "$only" ]]; then
  for n in $only; do [[ -x "$BIN/$n" ]] || die "ST_BUILD_ONLY names $n, which is not a target here"; done
  log "ready: $only in $BIN"
  exit 0
fi

# kwok ships its default Stages only inside kwokctl; the kwok controller
# needs them as config. Copy the pinned release's own files next to the binaries.
KWOK_DIR="$(cd "$HERE/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
STAGES="$CACHE_ROOT/k8s-v$VERSION/kwok-stages"
mkdir -p "$STAGES"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
         pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  install -m 644 "$KWOK_DIR/kustomize/stage/$f" "$STAGES/$(basename "$f")"
done

# Backend selector dirs for kube-proxy's iptables modes: a PATH entry whose
# iptables*/ip6tables* point at one xtables multi-binary.
for backend in legacy nft; do
  d="$CACHE_ROOT/k8s-v$VERSION/xtables-$backend"
  mkdir -p "$d"
  multi="$(command -v "xtables-$backend-multi")"
  for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    # only when not already right: a running cluster's kube-proxies exec these
    [[ "$(readlink "$d/$n" 2>/dev/null)" == "$multi" ]] || ln -sfn "$multi" "$d/$n"
  done
done

if ((built)); then log "built $built binaries in $((SECONDS - start_all))s into $BIN"; fi
"$BIN/kube-apiserver" --version >/dev/null
log "ready: $BIN ($("$BIN/kubectl" version --client -o json | jq -r .clientVersion.gitVersion), etcd $(modver "$K8S_MOD" go.etcd.io/etcd/server/v3), kwok $(modver "$HERE/kwok" sigs.k8s.io/kwok), ${CTRD_LDFLAGS:+containerd $CTRD_VER}$( ((tools)) && echo ", helm $HELM_VER, promtool and prometheus $PROM_VER"))"
