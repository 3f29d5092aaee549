#!/usr/bin/env bash
# Pod CREATE latency through a real kube-apiserver: no mutation, the webhook, the
# MutatingAdmissionPolicy (docs/benchmarks/pod-create-latency.md "Pod CREATE latency").
#
# Starts its own etcd and kube-apiserver (the pinned current minor from `make k8s-bins`; no
# controller-manager, scheduler or nodes: only the API server's own work and admission are in the
# path) on 127.0.0.1, and `safe-termination webhook` (release build, static plan, logs at info to
# a file) with a throw-away CA and serving certificate for 127.0.0.1. Then
# examples/pod_create_load.rs runs 1, 10 and 50 concurrent creators for DURATION seconds each
# against each configuration in turn (none, webhook, policy), and writes OUT/results.{json,md,svg}.
# Everything is stopped on exit (trap), by PID.
#
# Env: DURATION (s per run, default 30), CREATORS (default 1,10,50), CONFIGS (default
# none,webhook,policy,policy-floor), OUT (default
# target/pod-create-latency), CARGO_TARGET_DIR (honoured), ST_K8S_VERSION / ST_CACHE_DIR (the
# binaries' location, as e2e/toolchain/build-k8s.sh). Ports 22379-22380 (etcd), 26443 (API server),
# 28443/28080 (webhook). Takes about 6 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-30}
CREATORS=${CREATORS:-1,10,50}
CONFIGS=${CONFIGS:-none,webhook,policy,policy-floor}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/pod-create-latency}
VERSION=${ST_K8S_VERSION:-$(tr -d '[:space:]' < e2e/toolchain/k8s-version)}
BIN="${ST_CACHE_DIR:-$HOME/.cache/safe-termination}/k8s-v$VERSION/bin"
[ -x "$BIN/kube-apiserver" ] || { echo "no $BIN/kube-apiserver: run make k8s-bins" >&2; exit 2; }
command -v openssl >/dev/null || { echo "missing openssl: apt-get install -y openssl" >&2; exit 2; }
log() { printf '[pod-create-latency %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

cargo build --release --bin safe-termination --example pod_create_load
WORK=$(mktemp -d "${TMPDIR:-/tmp}/st-pod-create.XXXXXX")
mkdir -p "$OUT"
PIDS=()
cleanup() {
    # newest first (the webhook, the API server, then etcd: an API server whose etcd is gone
    # first can hang in its graceful shutdown); SIGKILL after 15 s
    local i p
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        p=${PIDS[$i]}
        kill "$p" 2>/dev/null || continue
        for _ in $(seq 1 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# a CA, the webhook's certificate for 127.0.0.1, the API server's service-account key and a token
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=pod-create-ca \
    -keyout "$WORK/ca.key" -out "$WORK/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 \
    -keyout "$WORK/webhook.key" -out "$WORK/webhook.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' > "$WORK/san.ext"
openssl x509 -req -in "$WORK/webhook.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" -CAcreateserial -days 1 \
    -extfile "$WORK/san.ext" -out "$WORK/webhook.crt" 2>/dev/null
cat > "$WORK/policy.yaml" <<'P'
apiVersion: safetermination.io/v1alpha1
kind: TerminationPolicy
metadata: {name: load}
spec: {scope: AllLongRunning}
P

# shellcheck source=bench/bare-apiserver.sh
source bench/bare-apiserver.sh
BARE_APISERVER_PIDS=()
bare_apiserver_start "$BIN" "$WORK" 22379 26443 "$WORK" || { PIDS+=("${BARE_APISERVER_PIDS[@]}"); exit 1; }
PIDS+=("${BARE_APISERVER_PIDS[@]}")
RUST_LOG=info "$TARGET_DIR/release/safe-termination" webhook --listen 127.0.0.1:28443 --admin-listen 127.0.0.1:28080 \
    --tls-cert-file "$WORK/webhook.crt" --tls-key-file "$WORK/webhook.key" --policy "$WORK/policy.yaml" \
    --pre-stop-seconds 10 --native-sleep true > "$OUT/webhook.log" 2>&1 &
PIDS+=($!)
KUBECONFIG="$WORK/kubeconfig" "$BIN/kubectl" apply --server-side -f crds/terminationparameters.yaml >/dev/null
KUBECONFIG="$WORK/kubeconfig" "$BIN/kubectl" wait --for=condition=Established --timeout=60s crd/terminationparameters.safetermination.io >/dev/null
log "API server $("$BIN/kube-apiserver" --version), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"

KUBECONFIG="$WORK/kubeconfig" "$TARGET_DIR/release/examples/pod_create_load" \
    --webhook-url https://127.0.0.1:28443/mutate --webhook-ca-file "$WORK/ca.crt" --policy-file "$WORK/policy.yaml" \
    --pre-stop-seconds 10 --creators "$CREATORS" --configs "$CONFIGS" --duration-seconds "$DURATION" --out "$OUT"
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg); results in $OUT/results.{json,md,svg}"
