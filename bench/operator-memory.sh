#!/usr/bin/env bash
# Resident memory of `safe-termination run` in a cluster with many Services and endpoints
# (docs/benchmarks/memory.md "Operator memory"). Target: under
# 150 MiB with 5,000 nodes' rolling windows, 10,000 Services and 150,000 endpoints.
#
# 1. Starts the local control plane (e2e/cluster/cluster-up.sh) WITHOUT kube-proxies (KP_MODES=none: no
#    kube-proxy has to program 100,000 endpoints; the operator's watches and index are what is
#    measured). This replaces any running e2e cluster.
# 2. examples/populate_services.rs: SERVICES Services with a selector in NAMESPACES namespaces,
#    one EndpointSlice each with ENDPOINTS endpoints (the EndpointSlice controller adds its own
#    empty slice per Service, as in a real cluster).
# 3. One TerminationPolicy per namespace (scope ServiceBacked), so reconciles, status writes,
#    the plan and the Service index are all live.
# 4. NODES fake kube-proxies on 127.0.0.1 (examples/fake_kube_proxies.rs: a real v1.29 scrape
#    padded to SIZE_KB with the unrelated families a kube-proxy exposes), given to the operator
#    as static `--kube-proxy-target NODE=URL` targets (NODES=0: default discovery, which finds
#    none: the store and the Services alone).
# 5. `safe-termination run` (release build, leader election on) until its metrics show every
#    Service and endpoint (safe_termination_controller_cluster_services / _cluster_endpoints)
#    and every node scraped; then it waits until every node's rolling window is full
#    (WINDOW_SECONDS / SCRAPE_INTERVAL_SECONDS + 1 samples per node: 200 s / 10 s keeps 21,
#    as many as the defaults 600 s / 30 s do, in a third of the time); then VmRSS sampled
#    every second for SAMPLE_SECONDS while one namespace's Services and EndpointSlices are
#    deleted and re-created; VmHWM (peak, includes the initial lists) at the end.
#    kube-apiserver's RSS is printed for scale.
# 6. Stops the cluster (trap), whatever happens.
#
# Env: SERVICES (10000), ENDPOINTS (15 per Service), NAMESPACES (20), NODES (5000), SIZE_KB (78,
# the issue's per-node scrape), FORMAT (text; protobuf: the fakes answer the operator's
# protobuf-first Accept with the real v1.37.2 protobuf capture, 67 KB, native histograms),
# CAPTURE (v1.29, padded to SIZE_KB; v1.37: the v1.37.2 text capture, 105 KB; the default with
# FORMAT=protobuf), WINDOW_SECONDS (200), SCRAPE_INTERVAL_SECONDS (10),
# SAMPLE_SECONDS (60), OUT (target/operator-memory), CARGO_TARGET_DIR (honoured), FEATURES (cargo
# features of the binary, e.g. system-allocator), OP_WRAPPER (a command prefix for the operator,
# e.g. a heap profile with FEATURES=system-allocator and "env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
# MALLOC_CONF=prof:true,prof_gdump:true,lg_prof_sample:17,prof_prefix:OUT/jeprof" (read with jeprof;
# heaptrack aborts on 5,000 target arguments: docs/benchmarks/memory.md); the process measured is then the operator
# the wrapper started, found by its command line). Needs root
# (the cluster). Takes about 15-20 minutes warm, most of it creating the objects.
#
# BARE_API=1: instead of the e2e control plane (step 1), only an etcd and a kube-apiserver of
# the pinned version on 127.0.0.1 (no controller-manager: no EndpointSlice controller, so
# SERVICES slices rather than twice as many), on ETCD_PORT (32379, peer +1) and API_PORT
# (36443), the operator on OP_PORT (30443) and ADMIN_PORT (30090), below the ephemeral range
# the fakes take their ports from: leaves a running e2e
# cluster and its fixed ports alone, and needs no root.
set -euo pipefail
cd "$(dirname "$0")/.."

SERVICES=${SERVICES:-10000}
ENDPOINTS=${ENDPOINTS:-15}
NAMESPACES=${NAMESPACES:-20}
NODES=${NODES:-5000}
SIZE_KB=${SIZE_KB:-78}
FORMAT=${FORMAT:-text}
if [[ "$FORMAT" == protobuf ]]; then CAPTURE=${CAPTURE:-v1.37}; else CAPTURE=${CAPTURE:-v1.29}; fi
WINDOW_SECONDS=${WINDOW_SECONDS:-200}
SCRAPE_INTERVAL_SECONDS=${SCRAPE_INTERVAL_SECONDS:-10}
SAMPLE_SECONDS=${SAMPLE_SECONDS:-60}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/operator-memory}
export ST_E2E_DIR="${ST_E2E_DIR:-/tmp/safe-termination-e2e}"
BARE_API=${BARE_API:-0}
if [[ "$BARE_API" == 1 ]]; then
  ETCD_PORT=${ETCD_PORT:-32379}
  API_PORT=${API_PORT:-36443}
  OP_PORT=${OP_PORT:-30443}
  ADMIN_PORT=${ADMIN_PORT:-30090}
else
  OP_PORT=${OP_PORT:-18443}
  ADMIN_PORT=${ADMIN_PORT:-18090}
fi
mkdir -p "$OUT"
log() { printf '[operator-memory %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

cargo build --release ${FEATURES:+--features "$FEATURES"} --bin safe-termination --example populate_services --example fake_kube_proxies
BIN="$TARGET_DIR/release/safe-termination"
POPULATE="$TARGET_DIR/release/examples/populate_services"
FAKES="$TARGET_DIR/release/examples/fake_kube_proxies"

OP_PID=""
FAKES_PID=""
WRAPPER_PID=""
BARE_PIDS=()
BARE_DIR=""
cleanup() {
  [[ -n "$OP_PID" ]] && kill "$OP_PID" 2>/dev/null && wait "$OP_PID" 2>/dev/null || true
  # a wrapper (heaptrack) writes its data once the operator has exited
  [[ -n "$WRAPPER_PID" ]] && wait "$WRAPPER_PID" 2>/dev/null || true
  [[ -n "$FAKES_PID" ]] && kill "$FAKES_PID" 2>/dev/null && wait "$FAKES_PID" 2>/dev/null || true
  if [[ "$BARE_API" == 1 ]]; then
    # the API server before etcd (one whose etcd is gone first can hang in its shutdown)
    local i p
    for ((i = ${#BARE_PIDS[@]} - 1; i >= 0; i--)); do
      p=${BARE_PIDS[$i]}
      kill "$p" 2>/dev/null || continue
      for _ in $(seq 1 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    done
    [[ -n "$BARE_DIR" ]] && rm -rf "$BARE_DIR"
  else
    ST_E2E_KEEP_LOGS=1 e2e/cluster/cluster-down.sh >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

if [[ "$BARE_API" == 1 ]]; then
  K8S_BIN="${ST_CACHE_DIR:-$HOME/.cache/safe-termination}/k8s-v${ST_K8S_VERSION:-$(tr -d '[:space:]' < e2e/toolchain/k8s-version)}/bin"
  [[ -x "$K8S_BIN/kube-apiserver" ]] || { log "no $K8S_BIN/kube-apiserver: run make k8s-bins"; exit 2; }
  export PATH="$K8S_BIN:$PATH"
  BARE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/st-operator-memory.XXXXXX")
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$BARE_DIR/webhook.key" -out "$BARE_DIR/webhook.crt" 2>/dev/null
  # shellcheck source=bench/bare-apiserver.sh
  source bench/bare-apiserver.sh
  BARE_APISERVER_PIDS=()
  bare_apiserver_start "$K8S_BIN" "$BARE_DIR" "$ETCD_PORT" "$API_PORT" "$OUT" || { BARE_PIDS+=("${BARE_APISERVER_PIDS[@]}"); exit 1; }
  BARE_PIDS+=("${BARE_APISERVER_PIDS[@]}")
  export KUBECONFIG="$BARE_DIR/kubeconfig" ST_WEBHOOK_CERT="$BARE_DIR/webhook.crt" ST_WEBHOOK_KEY="$BARE_DIR/webhook.key"
  log "bare API server on 127.0.0.1:$API_PORT (etcd $ETCD_PORT)"
else
  KP_MODES=none e2e/cluster/cluster-up.sh
  # shellcheck disable=SC1091
  source "$ST_E2E_DIR/env"
fi

t0=$SECONDS
"$POPULATE" --services "$SERVICES" --endpoints-per-service "$ENDPOINTS" --namespaces "$NAMESPACES"
log "populated in $((SECONDS - t0)) s"

kubectl apply --server-side -f crds/terminationpolicy.yaml >/dev/null
kubectl wait --for condition=established crd/terminationpolicies.safetermination.io --timeout=60s >/dev/null
kubectl create namespace safe-termination-bench --dry-run=client -o yaml | kubectl apply -f - >/dev/null
for ((n = 0; n < NAMESPACES; n++)); do
  cat <<EOF
---
apiVersion: safetermination.io/v1alpha1
kind: TerminationPolicy
metadata: {name: web, namespace: bench-$n}
spec: {scope: ServiceBacked}
EOF
done | kubectl apply -f - >/dev/null

TARGETS=()
if (( NODES > 0 )); then
  # the fakes serve until their standard input closes: a FIFO this shell holds open, so they
  # also go when it dies without running cleanup
  : >"$OUT/targets.txt"
  rm -f "$OUT/fakes.stdin" && mkfifo "$OUT/fakes.stdin"
  exec 7<>"$OUT/fakes.stdin"
  "$FAKES" --count "$NODES" --size-kb "$SIZE_KB" --format "$FORMAT" --capture "$CAPTURE" <"$OUT/fakes.stdin" >"$OUT/targets.txt" &
  FAKES_PID=$!
  t0=$SECONDS
  until grep -qx READY "$OUT/targets.txt"; do
    (( SECONDS - t0 < 120 )) || { log "the fake kube-proxies never became ready"; exit 1; }
    sleep 0.5
  done
  while IFS= read -r line; do
    [[ "$line" == node-*=http://* ]] && TARGETS+=(--kube-proxy-target "$line")
  done <"$OUT/targets.txt"
  log "$NODES fake kube-proxies ready ($(grep -E '^BODY_(BYTES|FORMAT)' "$OUT/targets.txt" | tr '\n' ' '))"
fi

# (a bash array of 10,000 words goes to exec as separate arguments: no single argument or
# environment string comes near the kernel's 128 KiB per-string limit)
# shellcheck disable=SC2086  # OP_WRAPPER is a command prefix, split on purpose
${OP_WRAPPER:-} "$BIN" run --listen "127.0.0.1:$OP_PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
  --tls-cert-file "$ST_WEBHOOK_CERT" --tls-key-file "$ST_WEBHOOK_KEY" \
  --namespace safe-termination-bench --identity bench \
  --scrape-interval-seconds "$SCRAPE_INTERVAL_SECONDS" --window-seconds "$WINDOW_SECONDS" \
  "${TARGETS[@]}" >"$OUT/operator.log" 2>&1 &
OP_PID=$!
if [[ -n "${OP_WRAPPER:-}" ]]; then
  for _ in $(seq 1 100); do
    child=$(pgrep -n -f "^$BIN run --listen 127.0.0.1:$OP_PORT" || true)
    [[ -n "$child" ]] && break
    sleep 0.2
  done
  [[ -n "$child" ]] || { log "the operator did not start under $OP_WRAPPER"; exit 1; }
  WRAPPER_PID=$OP_PID
  OP_PID=$child
fi
# a series' value from the operator's /metrics (0 while absent or unreachable); $1 is the
# series as exposed, labels included
gauge() { curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v m="$1" 'BEGIN { v = 0 } $1 == m { v = $2 } END { print v }'; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
hwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }

t0=$SECONDS
want_endpoints=$((SERVICES * ENDPOINTS))
# (the cluster's own `kubernetes` Service and its endpoint come on top)
until (( $(gauge safe_termination_controller_cluster_services) >= SERVICES &&
         $(gauge safe_termination_controller_cluster_endpoints) >= want_endpoints )); do
  kill -0 "$OP_PID" 2>/dev/null || { log "the operator exited; see $OUT/operator.log"; exit 1; }
  (( SECONDS - t0 < 300 )) || { log "counts never reached $SERVICES / $want_endpoints: $(gauge safe_termination_controller_cluster_services) / $(gauge safe_termination_controller_cluster_endpoints)"; exit 1; }
  sleep 1
done
synced_s=$((SECONDS - t0))
log "operator sees $(gauge safe_termination_controller_cluster_services) Services and $(gauge safe_termination_controller_cluster_endpoints) endpoints after $synced_s s; RSS $(( $(rss_kib "$OP_PID") / 1024 )) MiB"

# every node scraped, then the windows filled
scraped='safe_termination_kube_proxy_nodes{state="scraped"}'
until (( $(gauge "$scraped") >= NODES )); do
  kill -0 "$OP_PID" 2>/dev/null || { log "the operator exited; see $OUT/operator.log"; exit 1; }
  (( SECONDS - t0 < 600 )) || { log "only $(gauge "$scraped") of $NODES nodes scraped"; exit 1; }
  sleep 1
done
first_full=$SECONDS
log "all $NODES nodes scraped after $((SECONDS - t0)) s; RSS $(( $(rss_kib "$OP_PID") / 1024 )) MiB; waiting $((WINDOW_SECONDS + 2 * SCRAPE_INTERVAL_SECONDS)) s for full windows"
if (( NODES > 0 )); then
  while (( SECONDS - first_full < WINDOW_SECONDS + 2 * SCRAPE_INTERVAL_SECONDS )); do
    kill -0 "$OP_PID" 2>/dev/null || { log "the operator exited; see $OUT/operator.log"; exit 1; }
    sleep 5
  done
fi
nodes_scraped=$(gauge "$scraped")
nodes_failed=$(gauge 'safe_termination_kube_proxy_nodes{state="failed"}')

# churn while sampling: delete every Service and EndpointSlice of namespace bench-0
# (SERVICES / NAMESPACES of each) and create them again
(
  kubectl -n bench-0 delete services,endpointslices --all --wait=false >/dev/null
  sleep 5
  "$POPULATE" --services "$SERVICES" --endpoints-per-service "$ENDPOINTS" --namespaces "$NAMESPACES" --only-namespace 0 >/dev/null
) &
CHURN_PID=$!

max=0
: >"$OUT/rss.tsv"
for ((s = 0; s < SAMPLE_SECONDS; s++)); do
  r=$(rss_kib "$OP_PID")
  (( r > max )) && max=$r
  printf '%s\t%s\n' "$s" "$r" >>"$OUT/rss.tsv"
  sleep 1
done
# the churn is load, not a task to finish: at 150,000 endpoints kubectl's delete of one
# namespace's objects can outlast the sampling by minutes; stop it (and its child) here
pkill -TERM -P "$CHURN_PID" 2>/dev/null || true
kill "$CHURN_PID" 2>/dev/null || true
wait "$CHURN_PID" 2>/dev/null || true
hwm=$(hwm_kib "$OP_PID")
final=$(rss_kib "$OP_PID")
api_rss=$(rss_kib "${BARE_PIDS[1]:-$(pgrep -o -x kube-apiserver)}")
services_now=$(gauge safe_termination_controller_cluster_services)
cpu_ticks=$(awk '{ print $14 + $15 }' "/proc/$OP_PID/stat")
clk=$(getconf CLK_TCK)
summary=$(printf 'format=%s capture=%s nodes=%s nodes_scraped=%s nodes_failed=%s window_seconds=%s scrape_interval_seconds=%s services=%s endpoints=%s namespaces=%s policies=%s synced_after_s=%s rss_max_sampled_mib=%.1f rss_final_mib=%.1f vmhwm_mib=%.1f cpu_seconds=%.1f apiserver_rss_mib=%.0f services_after_churn=%s' \
  "$FORMAT" "$CAPTURE" "$NODES" "$nodes_scraped" "$nodes_failed" "$WINDOW_SECONDS" "$SCRAPE_INTERVAL_SECONDS" \
  "$SERVICES" "$want_endpoints" "$NAMESPACES" "$NAMESPACES" "$synced_s" "$(bc -l <<<"$max/1024")" "$(bc -l <<<"$final/1024")" \
  "$(bc -l <<<"$hwm/1024")" "$(bc -l <<<"$cpu_ticks/$clk")" "$(bc -l <<<"$api_rss/1024")" "$services_now")
echo "$summary" | tee "$OUT/summary.txt"
(( hwm < 150 * 1024 )) || { log "VmHWM $((hwm / 1024)) MiB is above the 150 MiB target"; exit 2; }
