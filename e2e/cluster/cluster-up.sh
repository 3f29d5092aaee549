#!/usr/bin/env bash
# Start a local Kubernetes control plane for the e2e tests:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler (127.0.0.1),
#   kwok managing fake nodes $ST_NODES (pods there become Running+Ready with IPs),
#   and a REAL kube-proxy for the first ${#KP_MODES} nodes, each in its own
#   network namespace joined to the host by a veth pair. With ST_REAL_NODES=1 (the
#   default) each of those nodes is a real node: containerd + runc + kubelet in the
#   same netns, pods on a CNI bridge (e2e/cluster/nodes.sh). Real nodes carry the taint
#   safe-termination.e2e/real-node=true:NoSchedule, so only pods that tolerate it
#   run containers; everything else lands on the kwok nodes as before.
# Binaries come from e2e/toolchain/build-k8s.sh (built first if missing).
# On any failure it prints the log tails and calls cluster-down.sh.
#
#   e2e/cluster/cluster-up.sh
#   KP_MODES="iptables-legacy iptables-nft nftables" e2e/cluster/cluster-up.sh
#   KP_MODES="iptables-nft nftables" e2e/cluster/cluster-up.sh   # without the Cilium node
#   ST_K8S_VERSION=1.29.15 ST_APISERVER_FEATURE_GATES=PodLifecycleSleepAction=true e2e/cluster/cluster-up.sh
#
# Afterwards: source $ST_E2E_DIR/env  (KUBECONFIG etc.), or read $ST_E2E_DIR/cluster.json.
#
# The work is in stages, one function each, run in order by main at the end (as nodes.sh's
# real_node_* steps): check_binaries, clean_start, make_pki, write_kubeconfigs, start_etcd,
# start_apiserver, start_controllers, start_kwok, register_nodes, start_kube_proxies,
# start_real_nodes, wait_kube_proxies, write_outputs.
set -euo pipefail
E2E_SELF=cluster-up
# shellcheck source=e2e/cluster/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
# shellcheck source=e2e/cluster/nodes.sh
source "$E2E_HERE/nodes.sh"
# shellcheck source=e2e/cluster/cilium.sh
source "$E2E_HERE/cilium.sh"

[[ $EUID -eq 0 ]] || { e2e_log "must run as root (network namespaces, iptables inside them)"; exit 1; }
T_START=$SECONDS
STATE="$ST_E2E_DIR"
BIN="$ST_K8S_BIN"
PKI="$STATE/pki"
LOGS="$STATE/logs"
KC="$STATE/kubeconfigs"
API="https://127.0.0.1:$ST_APISERVER_PORT"
read -r -a MODES <<<"$KP_MODES"
read -r -a NODES <<<"$ST_NODES"
ST_REAL_NODES="${ST_REAL_NODES:-1}"
[[ "$ST_REAL_NODES" == 0 || "$ST_REAL_NODES" == 1 ]] || { e2e_log "ST_REAL_NODES must be 0 or 1"; exit 1; }
# a Cilium node is a real node: without real nodes its entry means no data plane at all
if [[ "$ST_REAL_NODES" == 0 ]]; then
  for idx in "${!MODES[@]}"; do
    if [[ "${MODES[$idx]}" == cilium ]]; then MODES[idx]=none; e2e_log "ST_REAL_NODES=0: ${NODES[$idx]} gets no Cilium (a real node's) and no kube-proxy"; fi
  done
fi
# is_real NAME: the node runs a kubelet (it has a kube-proxy, and real nodes are on)
declare -A REAL=()
if [[ "$ST_REAL_NODES" == 1 ]]; then
  for idx in "${!MODES[@]}"; do [[ "${MODES[$idx]}" != none ]] && REAL[${NODES[$idx]}]=1; done
fi
is_real() { [[ -n "${REAL[$1]:-}" ]]; }
REAL_NODES=()
for n in "${NODES[@]}"; do is_real "$n" && REAL_NODES+=("$n"); done
# is_cilium NAME: the node's Services are Cilium's (KP_MODES entry `cilium`, e2e/cluster/cilium.sh)
declare -A CILIUM=()
for idx in "${!MODES[@]}"; do [[ "${MODES[$idx]}" == cilium ]] && CILIUM[${NODES[$idx]}]=1; done
is_cilium() { [[ -n "${CILIUM[$1]:-}" ]]; }
# Pods reach the API server the way they do in a cluster: KUBERNETES_SERVICE_HOST (the
# `kubernetes` Service's ClusterIP), DNATed by the node's kube-proxy to this address, which every
# real node holds on its loopback with a relay to the API server (see the netns loop below).
ST_APISERVER_VIP="$ST_NET_PREFIX.254.1"
# ST_REGISTRY=1: the reference OCI registry (e2e/toolchain/build-registry.sh) on the host's
# 127.0.0.1:$ST_REGISTRY_PORT, and on the same address inside every real node through a relay
# (netns 127.0.0.1:PORT -(socat)-> $STATE/registry/relay.sock -(socat)-> host 127.0.0.1:PORT,
# as the API server is reached), so an image pushed from the host is pulled by the nodes'
# containerd under the same reference (plain HTTP: containerd's hosts.toml for that address)
ST_REGISTRY="${ST_REGISTRY:-0}"
ST_REGISTRY_PORT="${ST_REGISTRY_PORT:-5000}"
(( ${#MODES[@]} <= ${#NODES[@]} )) || { e2e_log "KP_MODES has more entries than ST_NODES"; exit 1; }
for m in "${MODES[@]}"; do
  case "$m" in iptables|iptables-nft|iptables-legacy|nftables|cilium|none) ;;
    ipvs) e2e_log "ipvs: this kernel has no IP_VS support; see e2e/README.md"; exit 1 ;;
    *) e2e_log "unknown kube-proxy mode '$m' (iptables-legacy, iptables-nft, nftables, cilium, none)"; exit 1 ;;
  esac
done

# ------------------------------------------------------------------ stages (run in order by main)

# binaries: build what is missing; the host tools; for real nodes the cgroup layout, the CNI plugin and the images
check_binaries() {
  need_bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl kwok)
  ((${#REAL_NODES[@]})) && need_bins+=(kubelet containerd containerd-shim-runc-v2 ctr)
  for b in "${need_bins[@]}"; do
    if [[ ! -x "$BIN/$b" ]]; then
      e2e_log "missing $BIN/$b: running build-k8s.sh $ST_K8S_VERSION"
      ST_CACHE_DIR="$ST_CACHE_DIR" "$E2E_HERE/../toolchain/build-k8s.sh" "$ST_K8S_VERSION"
      break
    fi
  done
  for c in ip socat openssl curl jq setsid nft xtables-nft-multi xtables-legacy-multi; do
    command -v "$c" >/dev/null || { e2e_log "missing $c: run e2e/toolchain/build-k8s.sh (installs it)"; exit 1; }
  done
  if ((${#REAL_NODES[@]})); then
    if ! awk -F: '$2 == "memory" {found = 1} END {exit !found}' /proc/self/cgroup; then
      e2e_log "real nodes need the cgroup v1 (hybrid) layout of this machine kind (no v1 memory hierarchy here); use ST_REAL_NODES=0 for kwok nodes only"; exit 1
    fi
    for c in runc nsenter python3; do
      command -v "$c" >/dev/null || { e2e_log "missing $c: run e2e/toolchain/build-k8s.sh (installs it)"; exit 1; }
    done
    ((${#CILIUM[@]})) && cilium_check_bins
    [[ -x /usr/lib/cni/bridge ]] || { e2e_log "missing /usr/lib/cni/bridge: run e2e/toolchain/build-k8s.sh (installs containernetworking-plugins)"; exit 1; }
    # the real nodes' kubelets evict and taint at nodefs.available < 1% (nodes.sh): below a few
    # GiB the nodes come up Ready but tainted disk-pressure, and every pod stays Pending
    mkdir -p "$STATE"
    avail_kib="$(df -Pk "$STATE" | awk 'NR == 2 {print $4}')"
    size_kib="$(df -Pk "$STATE" | awk 'NR == 2 {print $2}')"
    need_kib=$((size_kib / 100 + 4 * 1024 * 1024))
    if ((avail_kib < need_kib)); then
      e2e_log "only $((avail_kib / 1024)) MiB free on the file system of $STATE: real nodes need $((need_kib / 1024)) MiB (the kubelets' 1% eviction threshold plus 4 GiB for images and pods), else they come up tainted node.kubernetes.io/disk-pressure and no pod schedules; free some space (old cargo target directories are the usual culprits)"
      exit 1
    fi
    # the pause (sandbox) and test-app images: OCI tarballs built from the project's static binary
    # (through a file: a failed build must stop cluster-up, which a process substitution hides)
    images_list="$(mktemp)"
    "$E2E_HERE/build-images.sh" > "$images_list" || { rm -f "$images_list"; e2e_log "e2e/cluster/build-images.sh failed"; exit 1; }
    mapfile -t ST_IMAGE_TARS < "$images_list"
    rm -f "$images_list"
    # more OCI archives to import, e.g. the operator's (make image; run-e2e.sh passes it)
    # shellcheck disable=SC2206
    ST_IMAGE_TARS+=(${ST_EXTRA_IMAGE_TARS:-})
    for t in "${ST_IMAGE_TARS[@]}"; do [[ -f "$t" ]] || { e2e_log "image archive $t does not exist"; exit 1; }; done
    ((${#ST_IMAGE_TARS[@]})) || { e2e_log "e2e/cluster/build-images.sh wrote no image"; exit 1; }
    ST_PAUSE_IMAGE="${ST_PAUSE_IMAGE:-st.local/pause:1}"
  fi
}

# clean start: this state directory's cluster down; refuse when another cluster, a port or the address range is taken
clean_start() {
  # (the clean start removes this state directory's cluster; another one, with its own
  # ST_E2E_DIR, owns the machine-wide network names and is left alone)
  other="$(other_running_owner)"
  if [[ -n "$other" ]]; then
    e2e_log "another e2e cluster runs on this machine (state in $other) and owns the network namespaces and veths: stop it first (ST_E2E_DIR=$other e2e/cluster/cluster-down.sh)"; exit 1
  fi
  "$E2E_HERE/cluster-down.sh" >/dev/null 2>&1 || true
  reg_port=""; [[ "$ST_REGISTRY" == 1 ]] && reg_port="$ST_REGISTRY_PORT"
  for p in "$ST_ETCD_PORT" "$((ST_ETCD_PORT + 10))" "$ST_APISERVER_PORT" "$ST_KCM_PORT" "$ST_SCHED_PORT" "$ST_KWOK_PORT" $reg_port; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      e2e_log "127.0.0.1:$p is already in use (another cluster? run e2e/cluster/cluster-down.sh, or set ST_*_PORT)"; exit 1
    fi
  done
  if ip -4 addr show | grep "inet $ST_NET_PREFIX\." >/dev/null; then
    e2e_log "addresses in $ST_NET_PREFIX.0.0/16 already exist on the host; set ST_NET_PREFIX"; exit 1
  fi
  mkdir -p "$STATE" "$PKI" "$LOGS" "$KC" "$STATE/pids"
  mkdir -p "$STATE/etcd"
  chmod 700 "$STATE/etcd"
  : > "$STATE/netns.list"
  printf '%s\n' "$ST_E2E_DIR" > "$ST_E2E_OWNER_FILE"
  : > "$STATE/cgroups.list"
  [[ -e /run/containerd ]] || : > "$STATE/run-containerd-absent"
  # cilium-cni queues deletions under /var/run/cilium when its agent is down
  [[ -e /run/cilium ]] || : > "$STATE/run-cilium-absent"
}

on_exit() {
  local rc=$?
  if (( rc != 0 )); then
    e2e_log "cluster-up FAILED (rc=$rc); last log lines:"
    for f in "$LOGS"/*.log; do
      [[ -f "$f" ]] || continue
      echo "----- $f" >&2; tail -n 15 "$f" >&2
    done
    ST_E2E_KEEP_LOGS=1 "$E2E_HERE/cluster-down.sh" || true
    e2e_log "logs kept in $LOGS"
  fi
}

seq_n=0
# start NAME CMD... : run in its own session/process group, log to logs/NAME.log,
# record "PID STARTTIME" for cluster-down.
start() {
  local name="$1"; shift
  seq_n=$((seq_n + 1))
  setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  local pid=$!
  local st=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do st="$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)" && [[ -n "$st" ]] && break; sleep 0.05; done
  printf '%s %s\n' "$pid" "$st" > "$STATE/pids/$(printf '%02d' "$seq_n")-$name.pid"
  # the command, for e2e/cluster/restart.sh (fault tests restart the API server or a kube-proxy)
  printf '%q ' "$@" > "$STATE/pids/$name.cmd"
  PIDOF[$name]=$pid
}
declare -A PIDOF=()

# wait_for DESC SECONDS PROC CMD... : poll until CMD succeeds; fail at once if
# the started process PROC (name given to start, or -) has exited.
wait_for() {
  local desc="$1" secs="$2" proc="$3"; shift 3
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [[ "$proc" != - ]] && ! kill -0 "${PIDOF[$proc]}" 2>/dev/null; then
      e2e_log "$proc exited while waiting for $desc (see $LOGS/$proc.log)"; return 1
    fi
    if (( SECONDS >= deadline )); then e2e_log "timed out after ${secs}s waiting for $desc"; return 1; fi
    sleep 0.3
  done
  e2e_log "ready: $desc"
}

# PKI (openssl): the CA, the service-account key pair, serving and client certificates
make_pki() {
  e2e_log "generating certificates in $PKI"
  (
    cd "$PKI"
    umask 077
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=safe-termination-e2e-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -out ca.crt 2>/dev/null
    # service-account token signing key pair
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
    # cert NAME SUBJECT EXT
    cert() {
      openssl ecparam -name prime256v1 -genkey -noout -out "$1.key" 2>/dev/null
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
      printf '%b\n' "$3" > "$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -sha256 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    first_svc_ip="$(awk -F'[./]' '{print $1"."$2"."$3"."$4+1}' <<<"$ST_SERVICE_CIDR")"
    server_ext="basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth"
    client_ext="basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"
    cert apiserver "/CN=kube-apiserver" \
      "$server_ext\nsubjectAltName=IP:127.0.0.1,IP:$first_svc_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    # For webhook servers the tests run on loopback (clientConfig.url https://127.0.0.1:PORT/...).
    cert webhook "/CN=safe-termination-webhook" "$server_ext\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
    cert admin "/O=system:masters/CN=kubernetes-admin" "$client_ext"
    cert kube-controller-manager "/CN=system:kube-controller-manager" "$client_ext"
    cert kube-scheduler "/CN=system:kube-scheduler" "$client_ext"
    cert kube-proxy "/CN=system:kube-proxy" "$client_ext"
    cert kwok "/O=system:masters/CN=kwok" "$client_ext"
    # real nodes: the Node authorizer and NodeRestriction know a kubelet by this identity
    for n in "${REAL_NODES[@]}"; do cert "node-$n" "/O=system:nodes/CN=system:node:$n" "$client_ext"; done
    chmod 644 ./*.crt sa.pub
  )
}

# kubeconfig FILE CERTNAME [SERVER]
kubeconfig() {
  local file="$1" who="$2" server="${3:-$API}"
  cat > "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: safe-termination-e2e
  cluster:
    server: $server
    certificate-authority: $PKI/ca.crt
users:
- name: $who
  user:
    client-certificate: $PKI/$who.crt
    client-key: $PKI/$who.key
contexts:
- name: safe-termination-e2e
  context: {cluster: safe-termination-e2e, user: $who}
current-context: safe-termination-e2e
EOF
}

K() { "$BIN/kubectl" --kubeconfig "$STATE/kubeconfig" "$@"; }

# kubeconfigs: the admin's and each component's
write_kubeconfigs() {
  kubeconfig "$STATE/kubeconfig" admin
  for who in kube-controller-manager kube-scheduler kube-proxy kwok; do kubeconfig "$KC/$who.kubeconfig" "$who"; done
  export KUBECONFIG="$STATE/kubeconfig"
}

# etcd
start_etcd() {
  start etcd "$BIN/etcd" --name st-e2e --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ST_ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ST_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ST_ETCD_PORT + 10))" --initial-advertise-peer-urls "http://127.0.0.1:$((ST_ETCD_PORT + 10))" \
    --initial-cluster "st-e2e=http://127.0.0.1:$((ST_ETCD_PORT + 10))" \
    --listen-metrics-urls "" --unsafe-no-fsync --quota-backend-bytes 4294967296 --log-level warn
  wait_for "etcd" 30 etcd curl -fsS "http://127.0.0.1:$ST_ETCD_PORT/health"
}

# kube-apiserver
start_apiserver() {
  # Extra flags for version-specific tests: ST_APISERVER_FEATURE_GATES (e.g.
  # PodLifecycleSleepAction=true on 1.29), ST_APISERVER_EXTRA_ARGS (split on spaces).
  # shellcheck disable=SC2054  # commas inside flag values
  apiserver_args=(
    --bind-address=127.0.0.1 --secure-port="$ST_APISERVER_PORT" --advertise-address=127.0.0.1
    --endpoint-reconciler-type=none
    --etcd-servers="http://127.0.0.1:$ST_ETCD_PORT"
    --service-cluster-ip-range="$ST_SERVICE_CIDR"
    --authorization-mode=Node,RBAC
    --enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook
    --client-ca-file="$PKI/ca.crt"
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key"
    --service-account-issuer=https://kubernetes.default.svc.cluster.local
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key"
    --allow-privileged=true
    --kubelet-client-certificate="$PKI/admin.crt" --kubelet-client-key="$PKI/admin.key"
    --kubelet-preferred-address-types=InternalIP
    # webhooks and aggregated APIs are called at an endpoint of their Service (a pod IP, routed
    # from the host to the node's veth) instead of the ClusterIP: the host has no kube-proxy, and
    # no rule may be added to the host's iptables/nftables
    --enable-aggregator-routing=true
    --profiling=false
  )
  [[ -n "${ST_APISERVER_FEATURE_GATES:-}" ]] && apiserver_args+=(--feature-gates="$ST_APISERVER_FEATURE_GATES")
  # shellcheck disable=SC2206
  [[ -n "${ST_APISERVER_EXTRA_ARGS:-}" ]] && apiserver_args+=($ST_APISERVER_EXTRA_ARGS)
  start kube-apiserver "$BIN/kube-apiserver" "${apiserver_args[@]}"
  wait_for "kube-apiserver /readyz" 120 kube-apiserver curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$API/readyz"
}

# kube-controller-manager and kube-scheduler
start_controllers() {
  kcm_args=(
    --kubeconfig="$KC/kube-controller-manager.kubeconfig"
    --authentication-kubeconfig="$KC/kube-controller-manager.kubeconfig"
    --authorization-kubeconfig="$KC/kube-controller-manager.kubeconfig"
    --bind-address=127.0.0.1 --secure-port="$ST_KCM_PORT"
    --leader-elect=false --use-service-account-credentials=true
    --root-ca-file="$PKI/ca.crt" --service-account-private-key-file="$PKI/sa.key"
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key"
    --service-cluster-ip-range="$ST_SERVICE_CIDR" --allocate-node-cidrs=false
    --controllers='*'
  )
  [[ -n "${ST_KCM_FEATURE_GATES:-}" ]] && kcm_args+=(--feature-gates="$ST_KCM_FEATURE_GATES")
  start kube-controller-manager "$BIN/kube-controller-manager" "${kcm_args[@]}"
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$KC/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$KC/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$KC/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$ST_SCHED_PORT" --leader-elect=false
}

# kwok, with its stages
start_kwok() {
  # Stages: the pinned kwok release's own defaults (copied by build-k8s.sh), with
  # pod-delete = graceful (e2e/cluster/kwok/pod-delete-graceful.yaml) unless ST_KWOK_POD_DELETE=fast.
  STAGES="$(dirname "$BIN")/kwok-stages"
  stage_files=("$STAGES/node-initialize.yaml" "$STAGES/node-heartbeat-with-lease.yaml" "$STAGES/pod-ready.yaml" "$STAGES/pod-complete.yaml")
  case "${ST_KWOK_POD_DELETE:-graceful}" in
    graceful) stage_files+=("$E2E_HERE/kwok/pod-delete-graceful.yaml") ;;
    fast) stage_files+=("$STAGES/pod-delete.yaml") ;;
    *) e2e_log "ST_KWOK_POD_DELETE must be graceful or fast"; exit 1 ;;
  esac
  for f in "${stage_files[@]}"; do
    [[ -f "$f" ]] || { e2e_log "missing kwok stage $f: run e2e/toolchain/build-k8s.sh $ST_K8S_VERSION"; exit 1; }
    cat "$f"; printf '\n---\n'
  done > "$STATE/kwok.yaml"
  start kwok "$BIN/kwok" --kubeconfig="$KC/kwok.kubeconfig" --config="$STATE/kwok.yaml" \
    --node-lease-duration-seconds=40 \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --cidr="$ST_KWOK_POD_CIDR" \
    --server-address="127.0.0.1:$ST_KWOK_PORT"
}

# kp_label I: node I's kube-proxy mode as its label says it (none: no kube-proxy, a Cilium node
# included)
kp_label() {
  local m=none
  (( $1 < ${#MODES[@]} )) && m="${MODES[$1]}"
  [[ "$m" == cilium ]] && m=none
  printf '%s' "$m"
}

# the Node objects (real and kwok), created before anything is scheduled
register_nodes() {
  wait_for "kube-controller-manager /healthz" 60 kube-controller-manager curl -fsSk "https://127.0.0.1:$ST_KCM_PORT/healthz"
  wait_for "kube-scheduler /healthz" 60 kube-scheduler curl -fsSk "https://127.0.0.1:$ST_SCHED_PORT/healthz"

  i=0
  for n in "${NODES[@]}"; do
    # Nodes with a kube-proxy get their netns address as InternalIP (kube-proxy's
    # node IP); the others get an address in the same never-routed range.
    if (( i < ${#MODES[@]} )); then ip_addr="$(node_ns_ip "$n")"; else ip_addr="$ST_NET_PREFIX.$i.2"; fi
    pod_cidr="$(node_pod_cidr "$n")"
    # A real node's object is created here too (its kubelet adopts it on registration), so its
    # podCIDR, labels and taint are set before anything can be scheduled there.
    if is_real "$n"; then
      node_kind=real; node_ann=""
      node_taints="  taints: [{key: $ST_REAL_NODE_TAINT, value: \"true\", effect: NoSchedule}]"
    else
      node_kind=kwok; node_ann="    kwok.x-k8s.io/node: fake"; node_taints=""
    fi
    K apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $n
  annotations:
$node_ann
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: $n
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: $node_kind
    safe-termination.e2e/node-type: $node_kind
    safe-termination.e2e/kube-proxy: "$(kp_label "$i")"
    safe-termination.e2e/data-plane: "$( (( i < ${#MODES[@]} )) && echo "${MODES[$i]}" || echo none)"
    safe-termination.e2e/has-kube-proxy: "$([[ "$(kp_label "$i")" == none ]] && echo false || echo true)"
spec:
  podCIDR: $pod_cidr
  podCIDRs: [$pod_cidr]
$node_taints
status:
  addresses:
  - {type: InternalIP, address: $ip_addr}
  - {type: Hostname, address: $n}
EOF
    i=$((i + 1))
  done
  KWOK_NODES=()
  for n in "${NODES[@]}"; do is_real "$n" || KWOK_NODES+=("$n"); done
  if ((${#KWOK_NODES[@]})); then
    wait_for "kwok nodes Ready (${KWOK_NODES[*]})" 60 kwok K wait --for=condition=Ready --timeout=1s "${KWOK_NODES[@]/#/node/}"
  fi
  wait_for "default ServiceAccount" 60 kube-controller-manager K -n default get serviceaccount default
}

# the registry and its host-side relay (ST_REGISTRY=1)
start_registry() {
  [[ "$ST_REGISTRY" == 1 ]] || return 0
  local bin
  bin="$("$E2E_HERE/../toolchain/build-registry.sh" registry)"
  mkdir -p "$STATE/registry/storage"
  cat > "$STATE/registry/config.yml" <<EOF
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: $STATE/registry/storage}
  delete: {enabled: true}
  maintenance: {uploadpurging: {enabled: false}}
http: {addr: "127.0.0.1:$ST_REGISTRY_PORT", secret: st-e2e}
EOF
  start registry "$bin" serve "$STATE/registry/config.yml"
  start registry-relay socat "UNIX-LISTEN:$STATE/registry/relay.sock,fork,unlink-early,mode=600" "TCP:127.0.0.1:$ST_REGISTRY_PORT"
  wait_for "registry on 127.0.0.1:$ST_REGISTRY_PORT" 30 registry curl -fsS -o /dev/null "http://127.0.0.1:$ST_REGISTRY_PORT/v2/"
}

# kube-proxy per node, in a netns (and, on a real node, its network, cgroups and containerd)
start_kube_proxies() {
  # The API server is reached from inside the netns over loopback only:
  #   netns 127.0.0.1:$ST_APISERVER_PORT -(socat)-> $STATE/apiserver.sock -(socat)-> host 127.0.0.1:$ST_APISERVER_PORT
  if (( ${#MODES[@]} > 0 )); then
    start apiserver-sock-relay socat "UNIX-LISTEN:$STATE/apiserver.sock,fork,unlink-early,mode=600" "TCP:127.0.0.1:$ST_APISERVER_PORT"
    wait_for "apiserver unix socket" 10 apiserver-sock-relay test -S "$STATE/apiserver.sock"
  fi

  nodes_json="[]"
  i=0
  for n in "${NODES[@]}"; do
    if (( i >= ${#MODES[@]} )) || [[ "${MODES[$i]}" == none ]]; then
      nodes_json="$(jq -c --arg n "$n" '. + [{name: $n, kube_proxy: null}]' <<<"$nodes_json")"
      i=$((i + 1)); continue
    fi
    mode="${MODES[$i]}"
    ns="$(node_netns "$n")"; vh="$(node_veth_host "$n")"; vn="$(node_veth_ns "$n")"
    hip="$(node_host_ip "$n")"; nip="$(node_ns_ip "$n")"
    echo "$ns $vh" >> "$STATE/netns.list"
    e2e_log "netns $ns: $vh $hip/30 <-> $vn $nip/30, kube-proxy mode $mode"
    ip netns add "$ns"
    ip link add "$vh" type veth peer name "$vn"
    ip link set "$vn" netns "$ns"
    ip addr add "$hip/30" dev "$vh"
    ip link set "$vh" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$nip/30" dev "$vn"
    ip -n "$ns" link set "$vn" up
    # No default route inside the netns: nothing there can reach beyond the /30.

    start "socat-$ns" ip netns exec "$ns" socat "TCP-LISTEN:$ST_APISERVER_PORT,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$STATE/apiserver.sock"

    if is_real "$n"; then
      e2e_log "real node $n: pods on cni0 $(node_pod_cidr "$n"), fabric $(node_fabric_ip "$n"), cgroup $(node_cgroup_root "$n")"
      # the `kubernetes` Service's endpoint, local on every node (see ST_APISERVER_VIP)
      ip -n "$ns" addr add "$ST_APISERVER_VIP/32" dev lo
      start "socat-vip-$ns" ip netns exec "$ns" socat "TCP-LISTEN:$ST_APISERVER_PORT,bind=$ST_APISERVER_VIP,fork,reuseaddr" "UNIX-CONNECT:$STATE/apiserver.sock"
      if [[ "$ST_REGISTRY" == 1 ]]; then
        start "registry-relay-$ns" ip netns exec "$ns" socat "TCP-LISTEN:$ST_REGISTRY_PORT,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$STATE/registry/relay.sock"
      fi
      cni=bridge; is_cilium "$n" && cni=cilium
      real_node_network "$n" "$cni"
      real_node_cgroups "$n"
      real_node_containerd "$n" "$cni"
    fi

    if is_cilium "$n"; then
      (( ${CILIUM_CRDS_APPLIED:-0} )) || { cilium_crds; CILIUM_CRDS_APPLIED=1; }
      cilium_node_agent "$n"
      nodes_json="$(jq -c --arg n "$n" --arg ns "$ns" --arg ip "$nip" --arg hip "$hip" --arg podcidr "$(node_pod_cidr "$n")" \
        --arg bpffs "$(node_bpffs "$n")" --arg sock "$(node_cilium_sock "$n")" --arg cg2 "$(node_cgroup2 "$n")" \
        '. + [{name: $n, real: true, pod_cidr: $podcidr, kube_proxy: null,
               cilium: {netns: $ns, ip: $ip, host_ip: $hip, bpf_root: $bpffs, socket: $sock, cgroup2: $cg2,
                        metrics_url: ("http://" + $ip + ":9962/metrics")}}]' <<<"$nodes_json")"
      i=$((i + 1)); continue
    fi

    case "$mode" in
      iptables|iptables-nft) kp_mode=iptables; kp_path="$ST_CACHE_DIR/k8s-v$ST_K8S_VERSION/xtables-nft" ;;
      iptables-legacy)       kp_mode=iptables; kp_path="$ST_CACHE_DIR/k8s-v$ST_K8S_VERSION/xtables-legacy" ;;
      nftables)              kp_mode=nftables; kp_path="$ST_CACHE_DIR/k8s-v$ST_K8S_VERSION/xtables-nft" ;;
    esac
    if [[ ! -x "$kp_path/iptables" ]]; then   # build-k8s.sh makes these; recreate if the cache was copied
      mkdir -p "$kp_path"; multi="$(command -v "xtables-${kp_path##*xtables-}-multi")"
      for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do ln -sfn "$multi" "$kp_path/$t"; done
    fi
    kp_gates=""
    k8s_minor="${ST_K8S_VERSION#*.}"; k8s_minor="${k8s_minor%%.*}"
    if [[ "$kp_mode" == nftables ]] && (( k8s_minor < 31 )); then
      kp_gates="featureGates: {NFTablesProxyMode: true}"   # alpha in 1.29/1.30
    fi
    cfg="$STATE/kube-proxy-$n.yaml"
    cat > "$cfg" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $KC/kube-proxy.kubeconfig
hostnameOverride: $n
bindAddress: $nip
metricsBindAddress: $nip:10249
healthzBindAddress: $nip:10256
mode: $kp_mode
clusterCIDR: $ST_CLUSTER_CIDR
nodePortAddresses: ["$nip/32"]
$kp_gates
iptables:
  minSyncPeriod: 1s
  syncPeriod: 30s
nftables:
  minSyncPeriod: 1s
  syncPeriod: 30s
conntrack:
  # 0 = leave the kernel's values alone (nf_conntrack_max is not per-netns)
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
EOF
    start "kube-proxy-$n" ip netns exec "$ns" env PATH="$kp_path:/usr/sbin:/usr/bin:/sbin:/bin" \
      "$BIN/kube-proxy" --config="$cfg" --v="${ST_KP_VERBOSITY:-2}"
    nodes_json="$(jq -c --arg n "$n" --arg mode "$mode" --arg ns "$ns" --arg ip "$nip" --arg hip "$hip" \
      --argjson real "$(is_real "$n" && echo true || echo false)" --arg podcidr "$(node_pod_cidr "$n")" \
      '. + [{name: $n, real: $real, pod_cidr: (if $real then $podcidr else null end),
             kube_proxy: {mode: $mode, netns: $ns, ip: $ip, host_ip: $hip,
             metrics_url: ("http://" + $ip + ":10249/metrics"), healthz_url: ("http://" + $ip + ":10256/healthz")}}]' <<<"$nodes_json")"
    i=$((i + 1))
  done
}

# real nodes: routes between them, images into each containerd, then the kubelets
start_real_nodes() {
  # real nodes: routes between them, images into each containerd, then the kubelets
  if ((${#REAL_NODES[@]})); then
    real_nodes_host_record
    real_nodes_mesh "${REAL_NODES[@]}"
    for n in "${REAL_NODES[@]}"; do
      is_cilium "$n" && cilium_wait_agent "$n"
      wait_for "containerd on $n" 60 "containerd-$n" node_ctr "$n" version
      real_node_images "$n" "${ST_IMAGE_TARS[@]}"
      real_node_kubelet "$n"
    done
    for n in "${REAL_NODES[@]}"; do
      wait_for "kubelet $n Ready" 120 "kubelet-$n" K wait --for=condition=Ready --timeout=1s "node/$n"
    done
    # --endpoint-reconciler-type=none: the `kubernetes` Service's endpoint is written here, as
    # the node-local relay address (in-cluster clients: KUBERNETES_SERVICE_HOST -> kube-proxy ->
    # $ST_APISERVER_VIP:$ST_APISERVER_PORT -> relay -> API server)
    K apply --server-side --field-manager=st-cluster-up -f - >/dev/null <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes-st-relay
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: st-cluster-up}
addressType: IPv4
endpoints: [{addresses: ["$ST_APISERVER_VIP"], conditions: {ready: true}}]
ports: [{name: https, port: $ST_APISERVER_PORT, protocol: TCP}]
EOF
  fi
}

kp_ready() {  # metrics served and at least one successful sync recorded
  # (grep without -q reads to the end: under pipefail, a grep -q that exits at the first match
  # can make curl fail with "Failure writing output" on a large /metrics)
  curl -fsS "http://$1:10249/metrics" | grep '^kubeproxy_sync_proxy_rules_last_timestamp_seconds.* [1-9]' >/dev/null \
    && curl -fsS -o /dev/null "http://$1:10256/healthz"
}

# every kube-proxy synced once and healthy
wait_kube_proxies() {
  for idx in "${!MODES[@]}"; do
    [[ "${MODES[$idx]}" == none || "${MODES[$idx]}" == cilium ]] && continue
    n="${NODES[$idx]}"
    wait_for "kube-proxy on $n (${MODES[$idx]}): first sync, /healthz" 90 "kube-proxy-$n" kp_ready "$(node_ns_ip "$n")"
    got="$(curl -fsS "http://$(node_ns_ip "$n"):10249/proxyMode")"
    e2e_log "kube-proxy on $n reports proxyMode=$got"
  done
}

# outputs for tests: cluster.json and env
write_outputs() {
  server_version="$(K version -o json | jq -r .serverVersion.gitVersion)"
  jq -n --arg state "$STATE" --arg kubeconfig "$STATE/kubeconfig" --arg api "$API" --arg bin "$BIN" \
    --arg version "$server_version" --arg ca "$PKI/ca.crt" --arg whc "$PKI/webhook.crt" --arg whk "$PKI/webhook.key" \
    --argjson nodes "$nodes_json" \
    '{state_dir: $state, kubeconfig: $kubeconfig, apiserver_url: $api, k8s_bin: $bin, server_version: $version,
      ca_cert: $ca, webhook_cert: $whc, webhook_key: $whk, nodes: $nodes}' > "$STATE/cluster.json"
  kp_urls="$(jq -r '[.nodes[] | select(.kube_proxy) | .kube_proxy.metrics_url] | join(" ")' "$STATE/cluster.json")"
  kp_nodes="$(jq -r '[.nodes[] | select(.kube_proxy) | .name] | join(" ")' "$STATE/cluster.json")"
  cat > "$STATE/env" <<EOF
# source this file: settings of the running e2e cluster (written by e2e/cluster/cluster-up.sh)
export ST_E2E_DIR='$STATE'
export KUBECONFIG='$STATE/kubeconfig'
export ST_K8S_VERSION='$ST_K8S_VERSION'
export ST_K8S_BIN='$BIN'
export PATH='$BIN':"\$PATH"
export ST_APISERVER_URL='$API'
export ST_CA_CERT='$PKI/ca.crt'
export ST_WEBHOOK_CERT='$PKI/webhook.crt'
export ST_WEBHOOK_KEY='$PKI/webhook.key'
export ST_NODES='${NODES[*]}'
export ST_KP_NODES='$kp_nodes'
export ST_KP_METRICS_URLS='$kp_urls'
export ST_CLUSTER_JSON='$STATE/cluster.json'
export ST_REAL_NODES='${REAL_NODES[*]}'
export ST_CILIUM_NODES='${!CILIUM[*]}'
export ST_REAL_NODE_TAINT='$ST_REAL_NODE_TAINT'
export ST_APISERVER_VIP='$ST_APISERVER_VIP'
export ST_IMAGE_TARS='${ST_IMAGE_TARS[*]:-}'
export ST_REGISTRY_ADDR='$([[ "$ST_REGISTRY" == 1 ]] && echo "127.0.0.1:$ST_REGISTRY_PORT")'
EOF
}

main() {
  check_binaries
  clean_start
  # from here a failure prints the logs and takes the cluster down
  trap on_exit EXIT
  trap 'exit 130' INT TERM
  make_pki
  write_kubeconfigs
  start_etcd
  start_apiserver
  start_controllers
  start_kwok
  start_registry
  register_nodes
  start_kube_proxies
  start_real_nodes
  wait_kube_proxies
  write_outputs
  trap - EXIT
  e2e_log "cluster up in $((SECONDS - T_START))s: $server_version; kubeconfig $STATE/kubeconfig; kube-proxy metrics: $kp_urls"
  e2e_log "use: source $STATE/env"
}

main
