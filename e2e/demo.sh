#!/usr/bin/env bash
# make demo: the main job on an embedded default. Brings up the local control plane with real
# kube-proxies, runs the operator against it (out of cluster, webhook on 127.0.0.1 over TLS),
# applies config/demo/app.yaml and prints the policies and a mutated pod's lifecycle.
# DEMO_KEEP=1 leaves everything running (stop with: kill $(cat $ST_E2E_DIR/operator.pid); make cluster-down).
set -euo pipefail
cd "$(dirname "$0")/.."
export ST_E2E_DIR="${ST_E2E_DIR:-/tmp/safe-termination-e2e}"
say() { printf '\n== %s\n' "$*"; }

# the binary's path from cargo itself: honours CARGO_TARGET_DIR and build.target-dir
bin=$(cargo build --release --quiet --message-format=json-render-diagnostics |
  sed -n 's/.*"executable":"\([^"]*\/safe-termination\)".*/\1/p' | tail -n 1)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "cargo build did not report the safe-termination binary" >&2
  exit 1
fi
e2e/cluster-up.sh
# shellcheck disable=SC1091
source "$ST_E2E_DIR/env"
cleanup() {
  if [ "${DEMO_KEEP:-0}" != 1 ]; then
    [ -f "$ST_E2E_DIR/operator.pid" ] && kill "$(cat "$ST_E2E_DIR/operator.pid")" 2>/dev/null || true
    e2e/cluster-down.sh >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

kubectl apply --server-side -f crds/terminationpolicy.yaml >/dev/null
kubectl create namespace safe-termination --dry-run=client -o yaml | kubectl apply -f - >/dev/null
targets=""
i=0
for url in $ST_KP_METRICS_URLS; do
  node=$(echo "$ST_KP_NODES" | cut -d' ' -f$((i + 1)))
  targets="${targets:+$targets,}$node=${url%/metrics}"
  i=$((i + 1))
done
"$bin" run \
  --listen 127.0.0.1:18443 --admin-listen 127.0.0.1:18080 \
  --tls-cert-file "$ST_WEBHOOK_CERT" --tls-key-file "$ST_WEBHOOK_KEY" \
  --namespace safe-termination --kube-proxy-target "$targets" \
  --scrape-interval-seconds 5 --status-refresh-seconds 10 \
  >"$ST_E2E_DIR/logs/operator.log" 2>&1 &
echo $! >"$ST_E2E_DIR/operator.pid"
for _ in $(seq 1 60); do curl -sf http://127.0.0.1:18080/readyz >/dev/null && break; sleep 0.5; done
curl -sf http://127.0.0.1:18080/readyz >/dev/null || { echo "operator not ready; see $ST_E2E_DIR/logs/operator.log"; exit 1; }

cat <<YAML | kubectl apply -f - >/dev/null
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: safe-termination
webhooks:
- name: prestop.safetermination.io
  admissionReviewVersions: ["v1"]
  sideEffects: None
  failurePolicy: Ignore
  timeoutSeconds: 5
  reinvocationPolicy: IfNeeded
  clientConfig:
    url: https://127.0.0.1:18443/mutate
    caBundle: $(base64 -w0 "$ST_CA_CERT")
  rules:
  - apiGroups: [""]
    apiVersions: ["v1"]
    operations: ["CREATE"]
    resources: ["pods"]
  namespaceSelector:
    matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: ["kube-system", "safe-termination"]
YAML
sleep 2
say "kubectl apply -f config/demo/app.yaml"
kubectl apply -f config/demo/app.yaml
say "waiting for the operator to measure the real kube-proxies"
for _ in $(seq 1 60); do
  [ "$(kubectl -n demo get tpol web -o jsonpath='{.status.measurement.nodesScraped}' 2>/dev/null)" = 2 ] && break
  sleep 1
done
# recreate the pods so they are admitted with the measured plan
kubectl -n demo rollout restart deployment/web >/dev/null
kubectl -n demo rollout status deployment/web --timeout=60s >/dev/null || true
sleep 2
say "kubectl get terminationpolicies -A -o wide"
kubectl get terminationpolicies -A -o wide
say "status of demo/web"
kubectl -n demo get tpol web -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{"\n"}{end}'
kubectl -n demo get tpol web -o jsonpath='{.status.recommendation.arithmetic}{"\n"}'
pod=$(kubectl -n demo get pods -l app=web --sort-by=.metadata.creationTimestamp -o jsonpath='{.items[-1:].metadata.name}')
say "a mutated pod: $pod"
kubectl -n demo get pod "$pod" -o jsonpath='lifecycle: {.spec.containers[0].lifecycle}{"\n"}terminationGracePeriodSeconds: {.spec.terminationGracePeriodSeconds}{"\n"}annotations: {.metadata.annotations}{"\n"}'
