# shellcheck shell=bash
# Sourced by the benchmarks that need only an API server (bench/pod-create-latency.sh,
# bench/operator-memory.sh BARE_API=1): etcd and kube-apiserver on 127.0.0.1, no
# controller-manager, scheduler or nodes, RBAC with one system:masters token.
#
#   bare_apiserver_start BIN DIR ETCD_PORT API_PORT LOGDIR
#
# Writes DIR/{sa.key,tokens.csv,kubeconfig} (DIR/kubeconfig reaches the API server), starts etcd
# (peer port ETCD_PORT + 1) and kube-apiserver with their logs in LOGDIR, appends their PIDs to
# the caller's array BARE_APISERVER_PIDS (etcd first; the caller stops them), and waits up to
# 60 s for /readyz (returns 1 with the API server's last log lines otherwise). BIN: the directory
# of etcd, kube-apiserver and kubectl (make k8s-bins). Needs openssl.
bare_apiserver_start() {
  local bin="$1" dir="$2" etcd_port="$3" api_port="$4" logs="$5" token
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  token=$(openssl rand -hex 16)
  echo "$token,bench,bench,\"system:masters\"" > "$dir/tokens.csv"
  cat > "$dir/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: bench, cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}}]
users: [{name: bench, user: {token: "$token"}}]
contexts: [{name: bench, context: {cluster: bench, user: bench}}]
current-context: bench
KC
  "$bin/etcd" --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
    --initial-cluster "default=http://127.0.0.1:$((etcd_port + 1))" --quota-backend-bytes 8589934592 > "$logs/etcd.log" 2>&1 &
  BARE_APISERVER_PIDS+=($!)
  "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" --bind-address 127.0.0.1 --secure-port "$api_port" \
    --advertise-address 127.0.0.1 --endpoint-reconciler-type none --cert-dir "$dir/apiserver" \
    --token-auth-file "$dir/tokens.csv" --authorization-mode RBAC \
    --service-account-key-file "$dir/sa.key" --service-account-signing-key-file "$dir/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/16 \
    > "$logs/apiserver.log" 2>&1 &
  BARE_APISERVER_PIDS+=($!)
  for _ in $(seq 1 120); do
    KUBECONFIG="$dir/kubeconfig" "$bin/kubectl" get --raw /readyz >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  tail -20 "$logs/apiserver.log" >&2
  return 1
}
