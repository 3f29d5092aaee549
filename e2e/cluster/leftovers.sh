#!/usr/bin/env bash
# Lists what a local cluster left behind on this machine after e2e/cluster/cluster-down.sh: processes
# naming its state directory (cluster-up's, our containerds' shims), network namespaces and veths
# named st-*, mounts under $ST_E2E_DIR, the real nodes' cgroups (…/st-e2e), host routes to the
# pod CIDRs, the kubelets' device-plugin socket and CNI results, kernel tunables a kubelet set,
# a Cilium node's BPF programs, maps and links (bpftool) and cilium-cni's deletion queue,
# the owner file of the machine-wide names (lib.sh), and the state directory. Prints one line per leftover; exits 1 if there is any.
# (make e2e runs it after cluster-down, also after a cluster-up killed half-way.)
set -uo pipefail
# shellcheck source=e2e/cluster/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
found=0
left() { printf 'leftover: %s\n' "$*"; found=1; }

# every process cluster-up starts names its state directory in its command line (a binary of
# $ST_K8S_BIN alone is not enough: on a shared machine another person's API server runs it)
for p in /proc/[0-9]*; do
  cmd="$({ tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null)" || continue
  case "$cmd" in *"$ST_E2E_DIR/"*) left "process ${p#/proc/}: $cmd" ;; esac
done
while read -r ns _; do
  [[ "$ns" == st-* ]] && left "netns $ns"
done < <(ip netns list 2>/dev/null)
while read -r dev; do
  left "link $dev"
done < <(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^st-')
while read -r m; do
  left "mount $m"
done < <(awk -v s="$ST_E2E_DIR" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo)
for h in /sys/fs/cgroup/*; do
  [[ -d "$h" ]] || continue
  while read -r d; do left "cgroup $d"; done < <(find "$h" -maxdepth 6 -type d -name st-e2e 2>/dev/null)
done
while read -r r; do
  left "route $r"
done < <(ip route show 2>/dev/null | grep -E "^$(cut -d. -f1-2 <<<"$ST_CLUSTER_CIDR" | sed 's/\./\\./g')\.")
# outside the state dir, what a kubelet writes whatever its flags (e2e/cluster/nodes.sh "host state")
[[ -S /var/lib/kubelet/device-plugins/kubelet.sock ]] && left "socket /var/lib/kubelet/device-plugins/kubelet.sock"
compgen -G '/var/lib/cni/results/st-pods-*' >/dev/null && left "CNI results /var/lib/cni/results/st-pods-*"
# the kernel tunables a kubelet sets (kernel.panic 10, panic_on_oops 1, overcommit_memory 1) all
# at once: the original values were not put back
if [[ "$(sysctl -n kernel.panic) $(sysctl -n kernel.panic_on_oops) $(sysctl -n vm.overcommit_memory)" == "10 1 1" ]]; then
  left "sysctls kernel.panic=10 kernel.panic_on_oops=1 vm.overcommit_memory=1 (a kubelet's values)"
fi
# a Cilium node's datapath (e2e/cluster/cilium.sh): its programs are named cil_*, its maps
# cilium_*, and a link left attached (a cgroup's socket LB, a device's TC) holds a cil_* program
bpftool="$("$E2E_HERE/../toolchain/bpftool.sh" 2>/dev/null)" || bpftool=""
if [[ -n "$bpftool" ]]; then
  while read -r line; do left "BPF $line"; done < <(
    { "$bpftool" -j prog show 2>/dev/null | jq -r '.[]? | select((.name // "") | startswith("cil_")) | "program \(.id) \(.name) (\(.type))"'
      "$bpftool" -j map show 2>/dev/null | jq -r '.[]? | select((.name // "") | startswith("cilium_") or startswith("cil_")) | "map \(.id) \(.name)"'
      cil="$("$bpftool" -j prog show 2>/dev/null | jq -c '[.[]? | select((.name // "") | startswith("cil_")) | .id]')"
      "$bpftool" -j link show 2>/dev/null | jq -r --argjson cil "${cil:-[]}" '.[]? | select(.prog_id as $p | $cil | index($p)) | "link \(.id) \(.type) of program \(.prog_id)"'
    } | sort -u)
else
  left "bpftool unavailable (e2e/toolchain/bpftool.sh failed): BPF programs, maps and links not checked"
fi
[[ -e /run/cilium/deleteQueue ]] && left "directory /run/cilium/deleteQueue (cilium-cni's deletion queue)"
[[ -e "$ST_E2E_OWNER_FILE" ]] && left "owner file $ST_E2E_OWNER_FILE ($(cat "$ST_E2E_OWNER_FILE" 2>/dev/null))"
[[ -e "$ST_E2E_DIR" ]] && left "directory $ST_E2E_DIR"
exit "$found"
