#!/usr/bin/env bash
# The observer's cost on the real nodes, side by side with it off (docs/benchmarks/observed-removals.md "Observed
# removals"): tests/e2e_observer_cost.rs, a REPLICAS-replica rolling update with the node agents
# in both nodes' namespaces and the operator observing removals in every other run, PAIRS pairs,
# SERVICES extra Services (selector-less, two endpoints each) loaded first.
#
# Uses the running e2e cluster, or starts one (ST_REAL_NODES=1 e2e/cluster/cluster-up.sh) and
# stops it at the end. Needs root (the cluster). Output: target/observer-cost.txt (the table is
# at its end). About 3 minutes a run, plus the Services (about 2 minutes for 4,000).
#
# Env: SERVICES (4000), REPLICAS (40), PAIRS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
SERVICES=${SERVICES:-4000}
REPLICAS=${REPLICAS:-40}
PAIRS=${PAIRS:-2}
state=${ST_E2E_DIR:-/tmp/safe-termination-e2e}
started=0
if [ ! -f "$state/env" ]; then
  ST_REAL_NODES=1 e2e/cluster/cluster-up.sh
  started=1
fi
cleanup() {
  if [ "$started" = 1 ]; then e2e/cluster/cluster-down.sh; fi
}
trap cleanup EXIT
# shellcheck disable=SC1091
source "$state/env"
mkdir -p target
ST_COST_SERVICES=$SERVICES ST_COST_REPLICAS=$REPLICAS ST_COST_PAIRS=$PAIRS \
  cargo test --features cluster-tests --test e2e_observer_cost -- --ignored --nocapture 2>&1 | tee target/observer-cost.txt
if [ "$started" = 0 ]; then
  kubectl delete namespace e2e-cost-services --wait=false >/dev/null 2>&1 || true
fi
