# shellcheck shell=bash
# Real nodes for the e2e cluster: containerd + runc + a real kubelet in a node's network namespace,
# pods on a CNI bridge with one pod CIDR per node, routes between nodes over a veth "fabric".
# Sourced by e2e/cluster/cluster-up.sh (which defines start, wait_for, K, $STATE, $BIN, $PKI, $LOGS) and by
# e2e/cluster/cluster-down.sh (real_nodes_down). Facts this follows: ../shared/docs/real-nodes.md.
#
# Layout of node NAME (index i) with netns NS:
#   $STATE/nodes/NAME/{containerd,kubelet,cni,pod-logs}   all state, sockets and mounts
#   cni0   in NS: bridge, gateway of the node's pod CIDR 10.244.(i+1).0/24 (node_pod_cidr)
#   st-<sfx>-f in NS <-> st-<sfx>-b in netns st-fabric (bridge br0): $ST_NET_PREFIX.255.(i+1)/24
#   host: route pod CIDR via the node's veth; NS: routes to other nodes' pod CIDRs over the fabric
#   cgroups: <own memory cgroup path>/st-e2e/NAME in every v1 hierarchy (kubelet cgroupRoot)
# Nothing is written to the host's iptables/nftables; no cgroup hierarchy is (re)mounted.

ST_FABRIC_NETNS="${ST_FABRIC_NETNS:-st-fabric}"
ST_REAL_NODE_TAINT="safe-termination.e2e/real-node"

node_pod_cidr() { printf '%s.%s.0/24' "$(cut -d. -f1-2 <<<"$ST_CLUSTER_CIDR")" "$(( $(node_index "$1") + 1 ))"; }
node_pod_gw() { printf '%s.%s.1' "$(cut -d. -f1-2 <<<"$ST_CLUSTER_CIDR")" "$(( $(node_index "$1") + 1 ))"; }
node_fabric_ip() { printf '%s.255.%s' "$ST_NET_PREFIX" "$(( $(node_index "$1") + 1 ))"; }
node_dir() { printf '%s/nodes/%s' "$ST_E2E_DIR" "$1"; }
node_ctrd_sock() { printf '%s/containerd/containerd.sock' "$(node_dir "$1")"; }
# the cgroup (relative path, same in every v1 hierarchy) under which node $1's pods live
node_cgroup_root() {
  local own
  own="$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)"
  own="${own%/}"
  printf '%s/st-e2e/%s' "$own" "$1"
}
# every mounted hierarchy: the v1 ones and the (controller-less) v2 "unified" one, where runc
# creates the same path in hybrid mode; pre-creating it there too records it for cluster-down
cgroup_hierarchies() {
  local d
  for d in /sys/fs/cgroup/*; do
    [[ -d "$d" && ! -L "$d" ]] || continue
    [[ -f "$d/cgroup.procs" ]] && printf '%s\n' "$d"
  done
}

# ctr against node $1's containerd
node_ctr() { local n="$1"; shift; "$BIN/ctr" --address "$(node_ctrd_sock "$n")" -n k8s.io "$@"; }

# --------------------------------------------------------------------------- set-up
# real_node_cgroups NAME: create the kubelet's cgroupRoot in every v1 hierarchy (recorded in
# $STATE/cgroups.list, deepest last, for cluster-down).
real_node_cgroups() {
  local n="$1" rel h path parts p
  rel="$(node_cgroup_root "$n")"
  while read -r h; do
    path="$h"
    IFS=/ read -r -a parts <<<"${rel#/}"
    for p in "${parts[@]}"; do
      path="$path/$p"
      if [[ ! -d "$path" ]]; then
        mkdir "$path"
        # shellcheck disable=SC2153 # STATE is cluster-up.sh's, which sources this file
        echo "$path" >> "$STATE/cgroups.list"
        if [[ -f "$path/cpuset.cpus" ]]; then   # v1 cpuset: a child starts empty
          cat "$(dirname "$path")/cpuset.cpus" > "$path/cpuset.cpus"
          cat "$(dirname "$path")/cpuset.mems" > "$path/cpuset.mems"
        fi
      fi
    done
  done < <(cgroup_hierarchies)
}

# real_node_network NAME [CNI]: the fabric link, the routes and the CNI config: the bridge
# (default), or CNI=cilium for a Cilium node (e2e/cluster/cilium.sh writes its config).
real_node_network() {
  local n="$1" cni="${2:-bridge}" ns dir fab_ns_if fab_br_if
  ns="$(node_netns "$n")"; dir="$(node_dir "$n")"
  if ! ip netns list | awk '{print $1}' | grep -x "$ST_FABRIC_NETNS" >/dev/null; then
    echo "$ST_FABRIC_NETNS" >> "$STATE/netns.list"
    ip netns add "$ST_FABRIC_NETNS"
    ip -n "$ST_FABRIC_NETNS" link set lo up
    ip -n "$ST_FABRIC_NETNS" link add br0 type bridge
    ip -n "$ST_FABRIC_NETNS" link set br0 up
  fi
  fab_ns_if="st-$(node_suffix "$n")-f"; fab_br_if="st-$(node_suffix "$n")-b"
  ip link add "$fab_ns_if" netns "$ns" type veth peer name "$fab_br_if" netns "$ST_FABRIC_NETNS"
  ip -n "$ST_FABRIC_NETNS" link set "$fab_br_if" master br0 up
  ip -n "$ns" addr add "$(node_fabric_ip "$n")/24" dev "$fab_ns_if"
  ip -n "$ns" link set "$fab_ns_if" up
  # the node forwards between its pods' bridge, the fabric and the host veth (its own netns only)
  nsenter --net="/run/netns/$ns" sysctl -qw net.ipv4.ip_forward=1
  # ClusterIPs: the route only has to exist for connect(); kube-proxy DNATs before it is used
  ip -n "$ns" route add "$ST_SERVICE_CIDR" via "$(node_host_ip "$n")"
  # host -> this node's pods over its veth
  ip route add "$(node_pod_cidr "$n")" via "$(node_ns_ip "$n")" dev "$(node_veth_host "$n")"
  if [[ "$cni" == cilium ]]; then
    cilium_node_cni "$n"
    return 0
  fi
  mkdir -p "$dir/cni/net.d" "$dir/cni/ipam"
  cat > "$dir/cni/net.d/10-st-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "st-pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam",
              "ranges": [[{"subnet": "$(node_pod_cidr "$n")", "gateway": "$(node_pod_gw "$n")"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
EOF
}

# real_nodes_mesh NODE...: each node routes the other nodes' pod CIDRs and kube-proxy addresses
# over the fabric.
real_nodes_mesh() {
  local a b
  for a in "$@"; do
    for b in "$@"; do
      [[ "$a" == "$b" ]] && continue
      ip -n "$(node_netns "$a")" route add "$(node_pod_cidr "$b")" via "$(node_fabric_ip "$b")"
      # and the other node's kube-proxy (metrics and healthz bind the node's host-veth address),
      # so an operator pod on any node scrapes every kube-proxy
      ip -n "$(node_netns "$a")" route add "$(node_ns_ip "$b")/32" via "$(node_fabric_ip "$b")"
    done
  done
}

# real_node_containerd NAME [CNI]: write the config and start containerd in the node's netns
# (CNI=cilium: the plugins in the node's cni/bin, and cilium-cni told the agent's socket).
real_node_containerd() {
  local n="$1" cni="${2:-bridge}" ns dir c bin_dirs='"/usr/lib/cni"' env=()
  ns="$(node_netns "$n")"; dir="$(node_dir "$n")"; c="$dir/containerd"
  if [[ "$cni" == cilium ]]; then
    bin_dirs="\"$dir/cni/bin\""
    env=(CILIUM_SOCK="$(node_cilium_sock "$n")")
  fi
  mkdir -p "$c/root" "$c/state" "$c/opt" "$c/runc" "$dir/pod-logs"
  cat > "$c/config.toml" <<EOF
version = 3
root = "$c/root"
state = "$c/state"
disabled_plugins = ["io.containerd.nri.v1.nri"]
[grpc]
  address = "$c/containerd.sock"
[ttrpc]
  address = "$c/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "$c/certs.d"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$ST_PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  # no CAP_SYS_RESOURCE here: a negative oom_score_adj would fail every sandbox (real-nodes.md)
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$c/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [$bin_dirs]
    conf_dir = "$dir/cni/net.d"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
EOF
  # the e2e registry (cluster-up.sh ST_REGISTRY=1), reached at the node's 127.0.0.1 over plain HTTP
  mkdir -p "$c/certs.d/127.0.0.1:${ST_REGISTRY_PORT:-5000}"
  cat > "$c/certs.d/127.0.0.1:${ST_REGISTRY_PORT:-5000}/hosts.toml" <<EOF
server = "http://127.0.0.1:${ST_REGISTRY_PORT:-5000}"
[host."http://127.0.0.1:${ST_REGISTRY_PORT:-5000}"]
  capabilities = ["pull", "resolve"]
EOF
  start "containerd-$n" nsenter --net="/run/netns/$ns" env PATH="$BIN:/usr/sbin:/usr/bin:/sbin:/bin" "${env[@]}" \
    "$BIN/containerd" --config "$c/config.toml" --log-level warn
}

# real_node_images NAME TARBALL...: import OCI image tarballs into the node's CRI namespace.
real_node_images() {
  local n="$1" t; shift
  for t in "$@"; do
    node_ctr "$n" images import "$t" >/dev/null
  done
}

# real_node_kubelet NAME: kubeconfig (client cert system:node:NAME), config, start in the netns.
real_node_kubelet() {
  local n="$1" ns dir k
  ns="$(node_netns "$n")"; dir="$(node_dir "$n")"; k="$dir/kubelet"
  mkdir -p "$k/root"
  printf 'nameserver 127.0.0.1\n' > "$dir/resolv.conf"
  cat > "$k/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: safe-termination-e2e
  cluster: {server: "$API", certificate-authority: "$PKI/ca.crt"}
users:
- name: system:node:$n
  user: {client-certificate: "$PKI/node-$n.crt", client-key: "$PKI/node-$n.key"}
contexts:
- name: safe-termination-e2e
  context: {cluster: safe-termination-e2e, user: "system:node:$n"}
current-context: safe-termination-e2e
EOF
  cat > "$k/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 (hybrid) machine: 1.35+ refuse v1 unless told; pods under our own cgroup path
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $(node_cgroup_root "$n")
address: $(node_ns_ip "$n")
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$(node_ctrd_sock "$n")
podLogsDir: $dir/pod-logs
resolvConf: $dir/resolv.conf
clusterDomain: cluster.local
failSwapOn: false
serializeImagePulls: false
registerNode: true
registerWithTaints:
- {key: $ST_REAL_NODE_TAINT, value: "true", effect: NoSchedule}
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
maxPods: 60
nodeStatusReportFrequency: 10s
syncFrequency: 10s
fileCheckFrequency: 10s
EOF
  start "kubelet-$n" nsenter --net="/run/netns/$ns" env PATH="$BIN:/usr/sbin:/usr/bin:/sbin:/bin" \
    "$BIN/kubelet" --config "$k/config.yaml" --kubeconfig "$k/kubeconfig" --root-dir "$k/root" \
    --cert-dir "$k/pki" --hostname-override "$n" --node-ip "$(node_ns_ip "$n")" \
    --node-labels "safe-termination.e2e/node-type=real" --v="${ST_KUBELET_VERBOSITY:-1}"
}

# --------------------------------------------------------------------------- host state
# What a kubelet changes outside its --root-dir, whatever its flags: kernel tunables (with
# protectKernelDefaults false it sets these globally: pkg/kubelet/cm setupKernelTunables; true
# makes it refuse to start when they differ), /var/lib/kubelet/device-plugins (a fixed path,
# DevicePluginPath), and containerd's CNI result cache /var/lib/cni. cluster-up records them,
# cluster-down puts them back.
KUBELET_SYSCTLS="kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom kernel.keys.root_maxkeys kernel.keys.root_maxbytes"

# real_nodes_host_record: before the first kubelet starts
real_nodes_host_record() {
  local k
  for k in $KUBELET_SYSCTLS; do printf '%s=%s\n' "$k" "$(sysctl -n "$k")"; done > "$STATE/host-sysctls"
  [[ -e /var/lib/kubelet ]] || : > "$STATE/var-lib-kubelet-absent"
  [[ -e /var/lib/cni ]] || : > "$STATE/var-lib-cni-absent"
  if [[ -e /var/lib/kubelet/device-plugins ]] && [[ ! -e "$STATE/var-lib-kubelet-absent" ]]; then
    e2e_log "warning: /var/lib/kubelet/device-plugins exists (another kubelet on this host, or an earlier run): the real nodes' kubelets use that fixed path too"
  fi
}

# real_nodes_host_restore: after every kubelet and container is gone
real_nodes_host_restore() {
  local state="$ST_E2E_DIR" line
  # another running cluster (its own ST_E2E_DIR, lib.sh other_running_owner) has kubelets that
  # use these host paths and tunables now: it restores them when it goes down
  if [[ -n "$(other_running_owner)" ]]; then
    e2e_log "another e2e cluster runs: host sysctls, /var/lib/kubelet and /var/lib/cni left to it"
    return 0
  fi
  if [[ -f "$state/host-sysctls" ]]; then
    while IFS= read -r line; do
      [[ "$line" == *=* ]] && sysctl -qw "$line" 2>/dev/null || true
    done < "$state/host-sysctls"
  fi
  if [[ -f "$state/var-lib-kubelet-absent" ]]; then
    rm -rf /var/lib/kubelet
  else
    rm -f /var/lib/kubelet/device-plugins/kubelet.sock 2>/dev/null || true
  fi
  if [[ -f "$state/var-lib-cni-absent" ]]; then
    rm -rf /var/lib/cni
  else
    # our network's results (its name, st-pods, starts each file's name)
    rm -f /var/lib/cni/results/st-pods-* 2>/dev/null || true
  fi
}

# --------------------------------------------------------------------------- tear-down
# real_nodes_down: pods' processes, shims, mounts and cgroups of every real node. Run after the
# recorded processes (kubelets, containerds) are stopped, before the network namespaces go.
real_nodes_down() {
  local state="$ST_E2E_DIR" pids p m
  [[ -d "$state/nodes" ]] || [[ -f "$state/cgroups.list" ]] || return 0
  # containers and shims: every process in our nodes' cgroups, and every shim or ctr whose
  # address is one of our containerd sockets (they re-parent to init: no recorded pid)
  for _ in 1 2 3; do
    pids=""
    if [[ -f "$state/cgroups.list" ]]; then
      while read -r p; do
        [[ -d "$p" ]] || continue
        pids+=" $(find "$p" -name cgroup.procs -exec cat {} + 2>/dev/null | tr '\n' ' ')"
      done < "$state/cgroups.list"
    fi
    if [[ -d "$state/nodes" ]]; then
      while read -r p; do
        p="${p#/proc/}"; p="${p%/cmdline}"
        # shims (containerd-shim-runc-v2 ... -address <our socket>) and the image imports of a
        # cluster-up killed half-way (ctr --address <our socket> ... images import: a child of
        # cluster-up, not recorded, and it outlives its parent)
        # (stderr first: a process that exits meanwhile makes the input redirection fail)
        tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" \
          | grep -E -- "(containerd-shim.* -address|/ctr --address) $state/nodes/" >/dev/null && pids+=" $p"
      done < <(grep -lsaF -- "$state/nodes/" /proc/[0-9]*/cmdline 2>/dev/null)
    fi
    pids="$(tr ' ' '\n' <<<"$pids" | grep -E '^[0-9]+$' | sort -u | grep -vx "$$" | tr '\n' ' ')"
    [[ -n "${pids// /}" ]] || break
    e2e_log "killing real-node processes (containers, shims): $pids"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.3
  done
  # mounts under the state dir (rootfs overlays, pod netns, shm, kubelet volumes), deepest first
  for _ in 1 2 3; do
    m="$(awk -v s="$state/" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)"
    [[ -n "$m" ]] || break
    while read -r p; do umount -l "$p" 2>/dev/null || true; done <<<"$m"
  done
  # cgroups we created, deepest first (a cgroup goes once its tasks are gone)
  if [[ -f "$state/cgroups.list" ]]; then
    local dirs cg_roots
    mapfile -t cg_roots < "$state/cgroups.list"
    # (no root recorded: find must not fall back to searching the working directory)
    dirs="$( { ((${#cg_roots[@]} == 0)) || find "${cg_roots[@]}" -mindepth 1 -type d 2>/dev/null; cat "$state/cgroups.list"; } \
      | awk '{print length, $0}' | sort -rn | cut -d' ' -f2- | uniq)"
    for _ in 1 2 3 4 5; do
      local left=0
      while read -r p; do
        [[ -n "$p" && -d "$p" ]] || continue
        rmdir "$p" 2>/dev/null || left=$((left + 1))
      done <<<"$dirs"
      ((left == 0)) && break
      sleep 0.5
    done
  fi
  real_nodes_host_restore
}
