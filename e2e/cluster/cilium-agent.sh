#!/usr/bin/env bash
# Runs cilium-agent for a Cilium node of the e2e cluster (e2e/cluster/cilium.sh starts it), kept
# inside the node: cluster-up runs `unshare -m --propagation slave cilium-agent.sh outer ...`, so
# every mount below stays in the agent's own mount namespace, and the host's later mounts (the
# pods' network namespaces) still reach it. Facts this follows: ../shared/docs/cilium.md.
#
#   cilium-agent.sh outer NETNS NODE_DIR CGROUP2_PATH AGENT_ARGS...
#     binds the node's cgroup2 sub-tree (never the machine's cgroup2 root) onto
#     NODE_DIR/cilium/cgroupv2, the agent's --cgroup-root: socket LB rewrites connect() only for
#     processes in that sub-tree (the node's pods, its load generators); then enters the netns
#   cilium-agent.sh inner NODE_DIR AGENT_ARGS...   (inside the netns, by `ip netns exec`)
#     /proc/sys read-only but for /proc/sys/net (the netns' own): the agent's global writes
#     (kernel.unprivileged_bpf_disabled=1, irreversible until reboot; kernel.timer_migration=0)
#     fail with a warning and the machine keeps its values; a tmpfs over /run (paths the agent
#     uses whatever its flags say, /var/run/cilium/...); the node's bpffs at /sys/fs/bpf.
set -euo pipefail
phase="$1"; shift
case "$phase" in
  outer)
    ns="$1" dir="$2" cg2="$3"; shift 3
    mount --bind "$cg2" "$dir/cilium/cgroupv2"
    exec ip netns exec "$ns" "$0" inner "$dir" "$@"
    ;;
  inner)
    dir="$1"; shift
    mount --bind /proc/sys /proc/sys
    mount -o remount,ro,bind /proc/sys
    mount --bind /proc/sys/net /proc/sys/net
    mount -o remount,rw,bind /proc/sys/net
    mount -t tmpfs -o size=64m tmpfs /run
    mount --bind "$dir/cilium/bpffs" /sys/fs/bpf
    exec "$CILIUM_BIN/cilium-agent" "$@"
    ;;
  *) echo "cilium-agent.sh: unknown phase '$phase' (outer, inner)" >&2; exit 2 ;;
esac
