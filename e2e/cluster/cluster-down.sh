#!/usr/bin/env bash
# Tear down everything e2e/cluster/cluster-up.sh started: its processes (by recorded
# process group, checked against the recorded start time so a stale pid file
# never hits someone else's process), the real nodes' containers, shims, mounts
# and cgroups (e2e/cluster/nodes.sh), the network namespaces and veth pairs, and the
# state directory. Idempotent: safe after a failed or partial
# cluster-up, and safe to call twice.
#
#   ST_E2E_KEEP_LOGS=1 e2e/cluster/cluster-down.sh   # keep $ST_E2E_DIR/logs for debugging
set -uo pipefail
E2E_SELF=cluster-down
# shellcheck source=e2e/cluster/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
# shellcheck source=e2e/cluster/nodes.sh
source "$E2E_HERE/nodes.sh"

STATE="$ST_E2E_DIR"
PIDS="$STATE/pids"

# (alive PID START, from lib.sh: the recorded process still exists and is the same one)

# pid files: pids/NN-name.pid holding "PID STARTTIME"; the process is the
# leader of its own process group (started via setsid). Stop them one by one in
# reverse start order (kube-proxy ... apiserver, etcd last), so the API server
# still has its etcd while it shuts down.
if [[ -d "$PIDS" ]]; then
  shopt -s nullglob
  pidfiles=("$PIDS"/*.pid)
  shopt -u nullglob
  for ((i = ${#pidfiles[@]} - 1; i >= 0; i--)); do
    f=${pidfiles[i]}
    read -r pid start < "$f" || continue
    [[ -n "$pid" ]] || continue
    name="$(basename "$f" .pid)"; name="${name#*-}"
    alive "$pid" "$start" || continue
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$pid" "$start" || break; sleep 0.1; done
    if alive "$pid" "$start"; then
      e2e_log "$name (pid $pid) ignored SIGTERM for 5s: SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do alive "$pid" "$start" || break; sleep 0.1; done
    fi
    e2e_log "stopped $name"
  done
fi

# The machine-wide names (network namespaces, veths, /run/containerd) belong to whichever
# cluster-up wrote the owner file: another running cluster's are left alone.
other="$(other_running_owner)"
if [[ -n "$other" ]]; then
  e2e_log "another e2e cluster (state in $other) owns the network namespaces: leaving them and /run/containerd alone"
fi

# Real nodes: containers and shims (not recorded: they re-parent to init), mounts, cgroups.
real_nodes_down
# containerd's shims put their sockets under /run/containerd/s whatever the configured state dir;
# remove the directory when cluster-up found none there (no other containerd on this machine)
if [[ -z "$other" && -f "$STATE/run-containerd-absent" && -d /run/containerd ]]; then
  rm -rf /run/containerd
fi
# cilium-cni's deletion queue (/var/run/cilium/deleteQueue, written when a Cilium node's agent was
# down at a pod's deletion)
if [[ -z "$other" && -f "$STATE/run-cilium-absent" && -d /run/cilium ]]; then
  rm -rf /run/cilium
fi

# Network namespaces and veths: the recorded ones plus the ones the current
# settings would create (covers a cluster-up that died before recording).
declare -A seen=()
netns_list=()
if [[ -f "$STATE/netns.list" ]]; then
  while read -r ns veth; do [[ -n "$ns" ]] && netns_list+=("$ns $veth"); done < "$STATE/netns.list"
fi
if [[ -z "$other" ]]; then
  for n in $ST_NODES; do netns_list+=("$(node_netns "$n") $(node_veth_host "$n")"); done
  netns_list+=("$ST_FABRIC_NETNS ")
else
  netns_list=()   # (recorded by this state's cluster-up, but now the other cluster's names)
fi
for entry in "${netns_list[@]}"; do
  read -r ns veth <<<"$entry"
  [[ -n "${seen[$ns]:-}" ]] && continue
  seen[$ns]=1
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -x "$ns" >/dev/null; then
    # Anything still running inside our own namespace was started by cluster-up.
    pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    if [[ -n "${pids// /}" ]]; then
      e2e_log "killing leftover processes in netns $ns: $pids"
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
      sleep 0.2
    fi
    e2e_log "deleting netns $ns"
    ip netns del "$ns" 2>/dev/null || true
  fi
  if [[ -n "$veth" ]] && ip link show "$veth" >/dev/null 2>&1; then
    e2e_log "deleting veth $veth"
    ip link del "$veth" 2>/dev/null || true
  fi
done

# ours, or a stale one of a cluster that no longer runs
if [[ -z "$other" ]]; then rm -f "$ST_E2E_OWNER_FILE"; fi

if [[ -d "$STATE" ]]; then
  if [[ "${ST_E2E_KEEP_LOGS:-0}" == 1 && -d "$STATE/logs" ]]; then
    find "$STATE" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
    e2e_log "kept logs in $STATE/logs"
  else
    rm -rf "$STATE"
  fi
fi
e2e_log "cluster is down"
