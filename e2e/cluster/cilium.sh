# shellcheck shell=bash
# A Cilium node of the e2e cluster (KP_MODES entry `cilium`): a real node (e2e/cluster/nodes.sh)
# whose Services are load-balanced by cilium-agent 1.20.2 as kube-proxy's replacement (socket LB
# and TC programs, native routing over the fabric) instead of a kube-proxy, with cilium-cni as
# its CNI plugin. Sourced by cluster-up.sh after nodes.sh. Facts this follows:
# ../shared/docs/cilium.md (build, flags, containment, where a removal shows in the maps).
#
# Layout of Cilium node NAME, besides a real node's:
#   $STATE/nodes/NAME/cilium/bpffs      the node's own bpffs (mounted in the host's mount
#                                       namespace: the node agent's pod and the tests read the
#                                       pins there); the agent sees it at /sys/fs/bpf and as --bpf-root
#   $STATE/nodes/NAME/cilium/cgroupv2   where the agent's mount namespace binds the node's cgroup2
#                                       sub-tree (its --cgroup-root): socket LB covers that sub-tree only
#   $STATE/nodes/NAME/cilium/run        the agent's API socket (CILIUM_SOCK for cilium-cni)
#   $STATE/nodes/NAME/cilium/state      its state (compiled datapath, endpoints)
# The agent runs as e2e/cluster/cilium-agent.sh describes; nothing touches the host's network
# namespace, iptables or nftables, its cgroup2 root or its kernel sysctls. cluster-down stops it by
# its recorded pid, and real_nodes_down unmounts the bpffs (which releases the pinned cgroup and
# TC links) and removes the cgroups; leftovers.sh lists any BPF program, map or link left.

ST_CILIUM_VERSION="${ST_CILIUM_VERSION:-1.20.2}"
CILIUM_HOME="$ST_CACHE_DIR/cilium-v$ST_CILIUM_VERSION"
CILIUM_BIN="$CILIUM_HOME/bin"

node_cilium_dir() { printf '%s/cilium' "$(node_dir "$1")"; }
node_bpffs() { printf '%s/cilium/bpffs' "$(node_dir "$1")"; }
node_cilium_sock() { printf '%s/cilium/run/cilium.sock' "$(node_dir "$1")"; }
# the node's cgroup2 sub-tree: the kubelet's cgroupRoot in the (controller-less) unified
# hierarchy, where runc creates every pod's cgroup too (real-nodes.md)
node_cgroup2() { printf '/sys/fs/cgroup/unified%s' "$(node_cgroup_root "$1")"; }

# cilium_check_bins: build Cilium when the cache lacks it (e2e/toolchain/build-cilium.sh)
cilium_check_bins() {
  local b
  for b in cilium-agent cilium-cni cilium-dbg clang; do
    if [[ ! -x "$CILIUM_BIN/$b" ]]; then
      e2e_log "missing $CILIUM_BIN/$b: running e2e/toolchain/build-cilium.sh (about 6 min cold)"
      ST_CACHE_DIR="$ST_CACHE_DIR" "$E2E_HERE/../toolchain/build-cilium.sh"
      break
    fi
  done
  [[ -d /sys/fs/cgroup/unified ]] || { e2e_log "a Cilium node needs the cgroup2 hierarchy at /sys/fs/cgroup/unified (socket LB)"; exit 1; }
}

# cilium_crds: Cilium's CRDs (v2, v2alpha1) before any agent starts (no cilium-operator here:
# the agents register them neither)
cilium_crds() {
  K apply --server-side --force-conflicts --field-manager=st-cluster-up -f "$CILIUM_HOME/crds/v2" -f "$CILIUM_HOME/crds/v2alpha1" >/dev/null
  K wait --for=condition=Established --timeout=60s crd/ciliumendpoints.cilium.io crd/ciliumnodes.cilium.io crd/ciliumidentities.cilium.io >/dev/null
}

# cilium_node_cni NAME: cilium-cni as the node's only CNI plugin (with loopback), its log in the
# node's directory; the network's name starts with st-pods, as the bridge nodes' (containerd's
# CNI result cache, /var/lib/cni/results/st-pods-*, is cleaned by that prefix)
cilium_node_cni() {
  local n="$1" dir
  dir="$(node_dir "$n")"
  mkdir -p "$dir/cni/net.d" "$dir/cni/bin"
  ln -sfn "$CILIUM_BIN/cilium-cni" "$dir/cni/bin/cilium-cni"
  ln -sfn /usr/lib/cni/loopback "$dir/cni/bin/loopback"
  cat > "$dir/cni/net.d/05-st-cilium.conflist" <<EOC
{
  "cniVersion": "1.0.0",
  "name": "st-pods-cilium",
  "plugins": [
    {"type": "cilium-cni", "enable-debug": false, "log-file": "$(node_cilium_dir "$n")/cni.log"}
  ]
}
EOC
}

# cilium_node_agent NAME: the node's bpffs, then cilium-agent in the node (cilium-agent.sh), and
# the wait for its datapath: the load-balancer maps pinned and socket LB attached
cilium_node_agent() {
  local n="$1" ns c
  ns="$(node_netns "$n")"; c="$(node_cilium_dir "$n")"
  mkdir -p "$c/bpffs" "$c/cgroupv2" "$c/run" "$c/state"
  mount -t bpf bpf "$c/bpffs"
  local args=(
    --kube-proxy-replacement=true
    --routing-mode=native --ipv4-native-routing-cidr="$ST_CLUSTER_CIDR" --auto-direct-node-routes=false
    --enable-ipv4=true --enable-ipv6=false --enable-ipv4-masquerade=false --enable-bpf-masquerade=false
    --ipam=kubernetes --k8s-require-ipv4-pod-cidr=true
    --devices="$(node_veth_ns "$n"),st-$(node_suffix "$n")-f"
    --k8s-kubeconfig-path="$STATE/kubeconfig"
    --state-dir="$c/state" --socket-path="$(node_cilium_sock "$n")"
    --lib-dir="$CILIUM_HOME/lib" --bpf-root="$c/bpffs" --cgroup-root="$c/cgroupv2"
    --enable-health-checking=false --enable-endpoint-health-checking=false --enable-hubble=false
    --enable-l7-proxy=false --enable-envoy-config=false
    --prometheus-serve-addr="$(node_ns_ip "$n"):9962"
  )
  start "cilium-agent-$n" env PATH="$CILIUM_BIN:/usr/sbin:/usr/bin:/sbin:/bin" CILIUM_BIN="$CILIUM_BIN" \
    K8S_NODE_NAME="$n" CILIUM_K8S_NAMESPACE=kube-system \
    unshare -m --propagation slave "$E2E_HERE/cilium-agent.sh" outer "$ns" "$(node_dir "$n")" "$(node_cgroup2 "$n")" "${args[@]}"
}

cilium_datapath_ready() {  # NAME: the services map pinned and socket LB's connect4 program attached
  local c
  c="$(node_cilium_dir "$1")"
  [[ -e "$c/bpffs/tc/globals/cilium_lb4_services_v2" ]] && grep -q "cgroup sockets attached\|Socket LB\|socketlb" "$LOGS/cilium-agent-$1.log" 2>/dev/null \
    && compgen -G "$c/bpffs/cilium/socketlb/links/cgroup/*" >/dev/null
}

cilium_wait_agent() {
  wait_for "cilium-agent on $1: load-balancer maps pinned, socket LB attached" 180 "cilium-agent-$1" cilium_datapath_ready "$1"
}
