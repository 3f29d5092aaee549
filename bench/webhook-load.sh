#!/usr/bin/env bash
# Load test of the admission webhook over TLS keep-alive on loopback (docs/benchmarks/webhook.md, "Webhook").
#
# Servers: the real webhook (`safe-termination webhook`, static plan, default logging at info to
# a file), the ceiling (`examples/constant_webhook.rs`: same axum + rustls stack, constant
# answer), the ceiling that also checks the body is JSON (`validate`: max throughput only), and a
# Go peer (bench/go-webhook: a controller-runtime webhook doing the same mutation, built from its
# module into ${ST_CACHE_DIR:-~/.cache/safe-termination}/bench/go-webhook; max throughput only).
# Body: tests/data/admission/admissionreview-pod-create.json (a real Pod CREATE review, 3.4 KB),
# which the webhook mutates (4 patch operations). At the end: the webhook's server CPU per review
# over the ceiling's, HTTP/2 and HTTP/1.1 (targets: at most 2.5 and 2), and the Go peer's.
#
# Per server: max throughput over HTTP/2 (h2load, 4 connections x 16 streams) and over HTTP/1.1
# (wrk, 32 keep-alive connections), with the server's CPU time per request (from /proc, which
# other load on the machine does not inflate much); then fixed rates (h2load --rps, 100 requests/s
# per connection) over HTTP/2 and HTTP/1.1 with p50/p99 from h2load's per-request log. Only 127.0.0.1 is contacted; every run is
# bounded by DURATION.
#
# Needs: apt-get install -y nghttp2-client wrk openssl; a Rust toolchain; Go (GO=skip: no Go peer).
# Env: DURATION (s, default 10), RATES (default "1000 2000 5000"), SERVER_CPUS / LOADGEN_CPUS
# (taskset lists, default 0 and 1: the server gets one core, the load generator the other;
# set both empty to not pin), OUT (default target/webhook-load), CARGO_TARGET_DIR (honoured).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
RATES=${RATES:-"1000 2000 5000"}
SERVER_CPUS=${SERVER_CPUS-0}
LOADGEN_CPUS=${LOADGEN_CPUS-1}
OUT=${OUT:-target/webhook-load}
BODY=tests/data/admission/admissionreview-pod-create.json
WEBHOOK_PORT=18443
ADMIN_PORT=18080
CEILING_PORT=18444
GO_PORT=18445
GO=${GO:-go}
CACHE_DIR=${ST_CACHE_DIR:-$HOME/.cache/safe-termination}/bench
GO_BIN=$CACHE_DIR/go-webhook

for tool in h2load wrk openssl taskset; do
    command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install -y nghttp2-client wrk openssl util-linux" >&2; exit 2; }
done
pin() { # pin CPUS CMD...
    local cpus=$1; shift
    if [ -n "$cpus" ]; then taskset -c "$cpus" "$@"; else "$@"; fi
}
SERVER_PIN=()
[ -n "$SERVER_CPUS" ] && SERVER_PIN=(taskset -c "$SERVER_CPUS")

mkdir -p "$OUT"
cargo build --release --bin safe-termination --example constant_webhook
BIN=${CARGO_TARGET_DIR:-target}/release/safe-termination
CEILING=${CARGO_TARGET_DIR:-target}/release/examples/constant_webhook
# the Go peer: rebuilt when its module is newer than the cached binary
if [ "$GO" != skip ]; then
    mkdir -p "$CACHE_DIR"
    if [ ! -x "$GO_BIN" ] || [ -n "$(find bench/go-webhook -newer "$GO_BIN" -type f)" ]; then
        (cd bench/go-webhook && GOFLAGS=-mod=mod "$GO" build -trimpath -o "$GO_BIN" .)
    fi
fi

# a throw-away serving certificate for 127.0.0.1 (P-256, as cert-manager issues by default)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=safe-termination-bench -addext subjectAltName=IP:127.0.0.1 \
    -keyout "$OUT/tls.key" -out "$OUT/tls.crt" 2>/dev/null

cat > "$OUT/post.lua" <<LUA
local f = assert(io.open("$BODY", "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
LUA

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_port() { # wait_port PORT
    for _ in $(seq 100); do
        if (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "nothing listens on $1" >&2; exit 1
}

# p50/p99 (ms) and 2xx count from an h2load --log-file (start_us, status, duration_us)
percentiles() {
    local ok
    ok=$(awk -F'\t' '$2 >= 200 && $2 < 300 { n++ } END { print n + 0 }' "$1")
    cut -f3 "$1" | sort -n | awk -v ok="$ok" '{ d[NR] = $1 } END {
        p50 = d[int(NR * 0.50 + 0.999999)]; p99 = d[int(NR * 0.99 + 0.999999)]; p999 = d[int(NR * 0.999 + 0.999999)];
        printf "requests %d (2xx %d)  p50 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  max %.3f ms\n", NR, ok, p50/1000, p99/1000, p999/1000, d[NR]/1000 }'
}

# CPU time (user + system, microseconds) the server process has used so far
server_cpu_us() { awk -v t="$(getconf CLK_TCK)" '{ printf "%d", ($14 + $15) * 1e6 / t }' "/proc/$1/stat"; }

# prints the server CPU per request (us, one decimal) and keeps it in $OUT/cpu-NAME-PROTO
cpu_per_request() { # cpu_per_request NAME PROTO CPU_US REQUESTS
    awk -v c="$3" -v n="$4" 'BEGIN { printf "%.1f\n", (n > 0 ? c / n : 0) }' > "$OUT/cpu-$1-$2"
    echo "server CPU per request: $(cat "$OUT/cpu-$1-$2") us"
}

run_suite() { # run_suite NAME PORT PID [max-only]
    local name=$1 port=$2 pid=$3 c0 c1 n rates=$RATES
    local url="https://127.0.0.1:$port/mutate"
    [ "${4:-}" = max-only ] && rates=""
    echo "== $name: max throughput, HTTP/2 (h2load -c 4 -m 16)"
    c0=$(server_cpu_us "$pid")
    pin "$LOADGEN_CPUS" h2load -c 4 -m 16 -t 1 -D "$DURATION" -d "$BODY" \
        -H 'content-type: application/json' "$url" > "$OUT/$name-h2-max.txt"
    c1=$(server_cpu_us "$pid"); n=$(awk '/^requests:/ { print $8 }' "$OUT/$name-h2-max.txt")
    grep -E "^finished in|^status codes:" "$OUT/$name-h2-max.txt"
    cpu_per_request "$name" h2 "$((c1 - c0))" "$n"
    echo "== $name: max throughput, HTTP/1.1 keep-alive (wrk -t1 -c 32)"
    c0=$(server_cpu_us "$pid")
    pin "$LOADGEN_CPUS" wrk -t1 -c 32 -d "${DURATION}s" --latency -s "$OUT/post.lua" "$url" > "$OUT/$name-h1-max.txt"
    c1=$(server_cpu_us "$pid"); n=$(awk '/requests in/ { print $1 }' "$OUT/$name-h1-max.txt")
    grep -E "Requests/sec|Non-2xx|^\s+(50|99)%" "$OUT/$name-h1-max.txt"
    cpu_per_request "$name" h1 "$((c1 - c0))" "$n"
    for rate in $rates; do
        # open loop per client: 100 requests/s each, one request in flight per connection
        # (h2load's --rps with several streams per connection adds ~10 ms of its own)
        local clients=$((rate / 100))
        for proto in h2 h1; do
            local flag=""; [ "$proto" = h1 ] && flag="--h1"
            echo "== $name: fixed rate $rate/s, $proto (h2load $flag -c $clients -m 1 --rps 100)"
            rm -f "$OUT/$name-$proto-$rate.log"
            pin "$LOADGEN_CPUS" h2load $flag -c "$clients" -m 1 -t 1 --rps 100 -D "$DURATION" -d "$BODY" \
                -H 'content-type: application/json' --log-file "$OUT/$name-$proto-$rate.log" "$url" > "$OUT/$name-$proto-$rate.txt"
            grep -E "^finished in" "$OUT/$name-$proto-$rate.txt"
            percentiles "$OUT/$name-$proto-$rate.log"
        done
    done
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -r); server cpus: ${SERVER_CPUS:-any}, load generator cpus: ${LOADGEN_CPUS:-any}"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

"${SERVER_PIN[@]}" "$BIN" webhook --listen "127.0.0.1:$WEBHOOK_PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
    --tls-cert-file "$OUT/tls.crt" --tls-key-file "$OUT/tls.key" --pre-stop-seconds 10 2> "$OUT/webhook.log" &
PIDS+=($!)
wait_port "$WEBHOOK_PORT"
# sanity: the webhook mutates the body
curl_out=$(h2load -n 1 -c 1 -d "$BODY" -H 'content-type: application/json' "https://127.0.0.1:$WEBHOOK_PORT/mutate" | grep "status codes")
echo "sanity: $curl_out"
run_suite webhook "$WEBHOOK_PORT" "${PIDS[0]}"
echo "== webhook: counters after the run"
(exec 3<>/dev/tcp/127.0.0.1/$ADMIN_PORT; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3) | grep -E '^safe_termination_webhook_(requests_total|request_duration_seconds_count|fail_open_total)'
kill "${PIDS[0]}"; wait "${PIDS[0]}" 2>/dev/null || true
echo "webhook exit after SIGTERM: drained"

"${SERVER_PIN[@]}" "$CEILING" "127.0.0.1:$CEILING_PORT" "$OUT/tls.crt" "$OUT/tls.key" &
PIDS+=($!)
wait_port "$CEILING_PORT"
run_suite ceiling "$CEILING_PORT" "${PIDS[1]}"
kill "${PIDS[1]}"; wait "${PIDS[1]}" 2>/dev/null || true

# the floor of any webhook that rejects undecodable bodies: the ceiling plus a JSON check of the body
"${SERVER_PIN[@]}" "$CEILING" "127.0.0.1:$CEILING_PORT" "$OUT/tls.crt" "$OUT/tls.key" validate &
PIDS+=($!)
wait_port "$CEILING_PORT"
run_suite ceiling-validate "$CEILING_PORT" "${PIDS[2]}" max-only
kill "${PIDS[2]}"; wait "${PIDS[2]}" 2>/dev/null || true

# the Go peer: controller-runtime, same mutation, same certificate (its CertDir holds tls.crt/tls.key)
if [ "$GO" != skip ]; then
    "${SERVER_PIN[@]}" "$GO_BIN" -listen "127.0.0.1:$GO_PORT" -cert-dir "$OUT" -pre-stop-seconds 10 2> "$OUT/go-webhook.log" &
    PIDS+=($!)
    wait_port "$GO_PORT"
    echo "sanity (go): $(h2load -n 1 -c 1 -d "$BODY" -H 'content-type: application/json' "https://127.0.0.1:$GO_PORT/mutate" | grep "status codes")"
    run_suite go-webhook "$GO_PORT" "${PIDS[3]}" max-only
    kill "${PIDS[3]}"; wait "${PIDS[3]}" 2>/dev/null || true
fi

# server CPU per review over the ceiling's, from this run
ratio() { awk -v a="$(cat "$OUT/cpu-$1-$3")" -v b="$(cat "$OUT/cpu-$2-$3")" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
echo "== server CPU per review / ceiling's (same run)"
echo "webhook / ceiling, HTTP/2:   $(ratio webhook ceiling h2)  ($(cat "$OUT/cpu-webhook-h2") / $(cat "$OUT/cpu-ceiling-h2") us; target <= 2.5)"
echo "webhook / ceiling, HTTP/1.1: $(ratio webhook ceiling h1)  ($(cat "$OUT/cpu-webhook-h1") / $(cat "$OUT/cpu-ceiling-h1") us; target <= 2)"
if [ "$GO" != skip ]; then
    echo "go-webhook / ceiling, HTTP/2:   $(ratio go-webhook ceiling h2)  ($(cat "$OUT/cpu-go-webhook-h2") us)"
    echo "go-webhook / ceiling, HTTP/1.1: $(ratio go-webhook ceiling h1)  ($(cat "$OUT/cpu-go-webhook-h1") us)"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
