# shellcheck shell=bash
# Shared settings for e2e/cluster/cluster-up.sh and e2e/cluster/cluster-down.sh. Sourced, not run.

E2E_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ST_K8S_VERSION="${ST_K8S_VERSION:-$(tr -d '[:space:]' < "$E2E_HERE/../toolchain/k8s-version")}"
ST_K8S_VERSION="${ST_K8S_VERSION#v}"
ST_CACHE_DIR="${ST_CACHE_DIR:-$HOME/.cache/safe-termination}"
ST_K8S_BIN="${ST_K8S_BIN:-$ST_CACHE_DIR/k8s-v$ST_K8S_VERSION/bin}"
ST_E2E_DIR="${ST_E2E_DIR:-/tmp/safe-termination-e2e}"

# Ports, all on 127.0.0.1 in the host network namespace.
ST_ETCD_PORT="${ST_ETCD_PORT:-23790}"          # etcd client (peer = +10)
ST_APISERVER_PORT="${ST_APISERVER_PORT:-6443}"
ST_KCM_PORT="${ST_KCM_PORT:-10257}"
ST_SCHED_PORT="${ST_SCHED_PORT:-10259}"
ST_KWOK_PORT="${ST_KWOK_PORT:-10247}"          # kwok's own /healthz + /metrics

# The nodes, and which of them get a real kube-proxy in its own network namespace (or, with
# real nodes, Cilium in its place): KP_MODES[i] is the data plane of node i. Modes:
# iptables-legacy, iptables-nft (alias: iptables), nftables, cilium (a real node whose Services
# are Cilium's, e2e/cluster/cilium.sh; without real nodes it has none), none. The nodes past
# KP_MODES are kwok's (node-d: the scale tests' fake pods).
ST_NODES="${ST_NODES:-node-a node-b node-c node-d}"
KP_MODES="${KP_MODES:-iptables-nft nftables cilium}"
# Node i with a kube-proxy gets netns st-kp-<suffix>, veth st-<suffix>-h (host,
# ${ST_NET_PREFIX}.i.1/30) <-> st-<suffix>-n (netns, ${ST_NET_PREFIX}.i.2/30).
ST_NET_PREFIX="${ST_NET_PREFIX:-10.213}"
ST_SERVICE_CIDR="${ST_SERVICE_CIDR:-10.96.0.0/16}"
ST_CLUSTER_CIDR="${ST_CLUSTER_CIDR:-10.244.0.0/16}"   # node i: 10.244.(i+1).0/24 (a CNI bridge on real nodes)
ST_KWOK_POD_CIDR="${ST_KWOK_POD_CIDR:-10.244.128.0/17}"  # kwok's fake pod IPs: never a real node's CIDR

e2e_log() { printf '[%s %(%H:%M:%S)T] %s\n' "${E2E_SELF:-e2e}" -1 "$*" >&2; }

node_suffix() { local n="$1"; n="${n#node-}"; printf '%s' "${n:0:8}"; }
node_netns() { printf 'st-kp-%s' "$(node_suffix "$1")"; }
node_veth_host() { printf 'st-%s-h' "$(node_suffix "$1")"; }
node_veth_ns() { printf 'st-%s-n' "$(node_suffix "$1")"; }
# index of node $1 in ST_NODES (0-based)
node_index() { local i=0 n; for n in $ST_NODES; do [[ "$n" == "$1" ]] && { echo "$i"; return; }; i=$((i + 1)); done; return 1; }
node_host_ip() { printf '%s.%s.1' "$ST_NET_PREFIX" "$(node_index "$1")"; }
node_ns_ip() { printf '%s.%s.2' "$ST_NET_PREFIX" "$(node_index "$1")"; }

# alive PID STARTTIME: the process PID runs (not a zombie) and is the one recorded, by its start
# time (field 22 of /proc/PID/stat), not a later process that reused the PID. Used by
# cluster-down.sh and restart.sh on the pid files (pids/NN-name.pid: "PID STARTTIME").
# The network namespaces (st-kp-*, the fabric), veths and /run/containerd are machine-wide names:
# one e2e cluster at a time owns them, whatever its ST_E2E_DIR. cluster-up records its state
# directory here; cluster-down deletes those names only when it owns them (or nobody does).
ST_E2E_OWNER_FILE="${ST_E2E_OWNER_FILE:-/run/safe-termination-e2e.owner}"

# The state directory of another cluster that owns the machine-wide names and still runs (one
# of its recorded processes alive), or nothing.
other_running_owner() {
  local owner f pid start
  [[ -f "$ST_E2E_OWNER_FILE" ]] || return 0
  owner="$(cat "$ST_E2E_OWNER_FILE" 2>/dev/null)"
  [[ -n "$owner" && "$owner" != "$ST_E2E_DIR" ]] || return 0
  for f in "$owner"/pids/*.pid; do
    [[ -f "$f" ]] || continue
    read -r pid start < "$f" || continue
    if [[ -n "$pid" ]] && alive "$pid" "$start"; then printf '%s' "$owner"; return 0; fi
  done
}

alive() {
  local st
  st="$(awk '{print $3 " " $22}' "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ -n "$st" && "${st%% *}" != Z && "${st#* }" == "$2" ]]
}
