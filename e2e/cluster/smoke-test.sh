#!/usr/bin/env bash
# Checks a running e2e cluster (after e2e/cluster/cluster-up.sh) end to end:
#   nodes Ready; a 3-replica Deployment + Service gets Running pods with IPs on
#   kwok nodes and an EndpointSlice; every kube-proxy programs the Service into
#   its netns (iptables-save / nft list ruleset) and its sync counter grows;
#   the API server calls a mutating webhook at https://127.0.0.1:<port>/mutate.
# Prints "N passed, N failed" and exits non-zero on any failure.
set -uo pipefail
E2E_SELF=smoke
# shellcheck source=e2e/cluster/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
[[ -f "$ST_E2E_DIR/env" ]] || { e2e_log "no cluster: run e2e/cluster/cluster-up.sh first"; exit 1; }
# shellcheck disable=SC1091
source "$ST_E2E_DIR/env"
NS="st-smoke"
WEBHOOK_PORT="${ST_SMOKE_WEBHOOK_PORT:-18443}"
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   - $*"; }
bad() { fail=$((fail + 1)); echo "FAIL - $*"; }
check() { local d="$1"; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
retry() { local secs="$1"; shift; local end=$((SECONDS + secs)); until "$@"; do ((SECONDS >= end)) && return 1; sleep 0.5; done; }

webhook_pid=""
cleanup() {
  kubectl delete mutatingwebhookconfiguration st-smoke --ignore-not-found >/dev/null 2>&1
  kubectl delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
  [[ -n "$webhook_pid" ]] && kill "$webhook_pid" 2>/dev/null
}
trap cleanup EXIT

# kube-proxy sync counter (sum over ip families) for node IP $1
sync_count() {
  curl -fsS "http://$1:10249/metrics" | awk '/^kubeproxy_sync_proxy_rules_duration_seconds_count/ {s += $NF} END {print s + 0}'
}
rules_of() {  # NODE -> dump of the proxy rules inside its netns
  local mode ns
  mode="$(jq -r --arg n "$1" '.nodes[] | select(.name == $n) | .kube_proxy.mode' "$ST_CLUSTER_JSON")"
  ns="$(jq -r --arg n "$1" '.nodes[] | select(.name == $n) | .kube_proxy.netns' "$ST_CLUSTER_JSON")"
  case "$mode" in
    iptables-legacy) ip netns exec "$ns" iptables-legacy-save ;;
    iptables|iptables-nft) ip netns exec "$ns" iptables-nft-save ;;
    nftables) ip netns exec "$ns" nft list table ip kube-proxy ;;
  esac
}

check "server version is v$ST_K8S_VERSION" test "$(kubectl version -o json | jq -r .serverVersion.gitVersion)" == "v$ST_K8S_VERSION"
read -r -a node_names <<<"$ST_NODES"
check "all nodes Ready ($ST_NODES)" kubectl wait --for=condition=Ready --timeout=20s "${node_names[@]/#/node/}"

declare -A before=()
for n in $ST_KP_NODES; do before[$n]="$(sync_count "$(jq -r --arg n "$n" '.nodes[] | select(.name == $n) | .kube_proxy.ip' "$ST_CLUSTER_JSON")")"; done

kubectl create namespace "$NS" >/dev/null
kubectl apply -n "$NS" -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: registry.k8s.io/pause:3.10   # never pulled: kwok runs no containers
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
EOF
check "Deployment web available (3 replicas)" kubectl -n "$NS" wait --for=condition=Available --timeout=60s deployment/web
check "3 pods Running with pod IPs" retry 30 bash -c \
  "[[ \$(kubectl -n $NS get pods -l app=web -o json | jq '[.items[] | select(.status.phase == \"Running\" and (.status.podIP // \"\") != \"\")] | length') == 3 ]]"
kubectl -n "$NS" get pods -o wide
check "EndpointSlice has 3 ready endpoints" retry 30 bash -c \
  "[[ \$(kubectl -n $NS get endpointslices -l kubernetes.io/service-name=web -o json | jq '[.items[].endpoints[]? | select(.conditions.ready)] | length') == 3 ]]"
svc_ip="$(kubectl -n "$NS" get service web -o jsonpath='{.spec.clusterIP}')"
for n in $ST_KP_NODES; do
  check "kube-proxy on $n programmed $svc_ip" retry 30 bash -c "$(declare -f rules_of); ST_CLUSTER_JSON=$ST_CLUSTER_JSON; rules_of $n | grep -- '$svc_ip' >/dev/null"
  ip="$(jq -r --arg n "$n" '.nodes[] | select(.name == $n) | .kube_proxy.ip' "$ST_CLUSTER_JSON")"
  check "kube-proxy on $n sync count grew (was ${before[$n]})" retry 20 bash -c "(( \$(curl -fsS http://$ip:10249/metrics | awk '/^kubeproxy_sync_proxy_rules_duration_seconds_count/ {s += \$NF} END {print s + 0}') > ${before[$n]} ))"
done

# Scale down: the endpoint must disappear from the rules.
kubectl -n "$NS" scale deployment web --replicas=2 >/dev/null
check "EndpointSlice shrinks to 2 ready endpoints" retry 30 bash -c \
  "[[ \$(kubectl -n $NS get endpointslices -l kubernetes.io/service-name=web -o json | jq '[.items[].endpoints[]? | select(.conditions.ready)] | length') == 2 ]]"
for n in $ST_KP_NODES; do
  ip="$(jq -r --arg n "$n" '.nodes[] | select(.name == $n) | .kube_proxy.ip' "$ST_CLUSTER_JSON")"
  check "kube-proxy on $n exports network_programming_duration" retry 20 bash -c \
    "curl -fsS http://$ip:10249/metrics | grep '^kubeproxy_network_programming_duration_seconds_count' >/dev/null"
done

# Mutating webhook on loopback: adds a label to ConfigMaps in $NS.
python3 - "$WEBHOOK_PORT" "$ST_WEBHOOK_CERT" "$ST_WEBHOOK_KEY" > "$ST_E2E_DIR/logs/smoke-webhook.log" 2>&1 <<'PY' &
import base64, json, ssl, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        patch = [{"op": "add", "path": "/metadata/labels", "value": {"st-smoke/mutated": "yes"}}]
        out = {"apiVersion": review["apiVersion"], "kind": "AdmissionReview",
               "response": {"uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
                            "patch": base64.b64encode(json.dumps(patch).encode()).decode()}}
        body = json.dumps(out).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
srv = HTTPServer(("127.0.0.1", port), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
PY
webhook_pid=$!
retry 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$WEBHOOK_PORT" 2>/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: st-smoke}
webhooks:
- name: smoke.st-e2e.test
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 5
  clientConfig:
    url: https://127.0.0.1:$WEBHOOK_PORT/mutate
    caBundle: $(base64 -w0 < "$ST_CA_CERT")
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $NS}}
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
EOF
check "API server calls webhook at https://127.0.0.1:$WEBHOOK_PORT/mutate" retry 15 bash -c \
  "kubectl -n $NS delete configmap probe --ignore-not-found >/dev/null 2>&1; kubectl -n $NS create configmap probe >/dev/null 2>&1 && [[ \$(kubectl -n $NS get configmap probe -o jsonpath='{.metadata.labels.st-smoke/mutated}') == yes ]]"

echo "$pass passed, $fail failed"
(( fail == 0 ))
