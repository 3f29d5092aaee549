#!/usr/bin/env bash
# The deploy-error experiment (tests/e2e_deploy.rs) on the local cluster's real nodes: rolling
# restarts of a Deployment behind a ClusterIP Service under new-connection-per-request load, with
# and without safe-termination, at small scale and with thousands of extra Services. Writes
# results.json, results.md and results.svg (e2e/experiment/report.py) into $ST_EXP_OUT, prints the
# table, and prints the path of results.json on its last line.
#
#   e2e/experiment/experiment.sh                      # the full experiment: runs a to h (make experiment)
#   ST_EXP_RUNS=a,b,w ST_EXP_ROLLOUTS=1 ST_EXP_STRATEGIES=25%/0 e2e/experiment/experiment.sh    # make demo
#   ST_EXP_RUNS=i,j ST_EXP_ROLLOUTS=1 e2e/experiment/experiment.sh    # the slow-sync regime (make experiment-slow-sync)
#
# Uses the running cluster when $ST_E2E_DIR/env answers; otherwise starts one (e2e/cluster/cluster-up.sh)
# and stops it afterwards. Settings: see tests/e2e_deploy.rs (ST_EXP_*).
set -euo pipefail
cd "$(dirname "$0")/../.."
export ST_E2E_DIR="${ST_E2E_DIR:-/tmp/safe-termination-e2e}"
export ST_EXP_OUT="${ST_EXP_OUT:-$PWD/target/experiment}"
say() { printf '[experiment %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

cluster_answers() {
  [[ -f "$ST_E2E_DIR/env" ]] || return 1
  # shellcheck disable=SC1091
  (source "$ST_E2E_DIR/env" && [[ -n "${ST_REAL_NODES:-}" ]] && kubectl get --raw /readyz >/dev/null 2>&1)
}
own_cluster=0
if ! cluster_answers; then
  say "no running cluster with real nodes: starting one"
  e2e/cluster/cluster-up.sh
  own_cluster=1
fi
# shellcheck disable=SC2329 # invoked by the EXIT trap below
cleanup() {
  if ((own_cluster)) && [[ "${ST_EXP_KEEP:-0}" != 1 ]]; then
    e2e/cluster/cluster-down.sh >/dev/null 2>&1 || true
    say "stopped the cluster it had started (to keep it: DEMO_KEEP=1 make demo, or ST_EXP_KEEP=1)"
  fi
}
trap cleanup EXIT
# shellcheck disable=SC1091
source "$ST_E2E_DIR/env"
mkdir -p "$ST_EXP_OUT"
t0=$SECONDS
say "runs ${ST_EXP_RUNS:-a,b,c,d,e,f,g,h,w,x} -> $ST_EXP_OUT"
rm -f "$ST_EXP_OUT/verdict.txt"
# the checks' verdict is printed in words below: no backtrace under the table
rc=0
RUST_BACKTRACE=0 cargo test --quiet --features cluster-tests --test e2e_deploy -- --nocapture --test-threads=1 deploy_experiment || rc=$?
say "experiment took $((SECONDS - t0)) s"
if [[ -f "$ST_EXP_OUT/results.md" ]]; then
  echo
  cat "$ST_EXP_OUT/results.md"
  echo
  echo "picture: $ST_EXP_OUT/results.svg"
fi
echo
if [[ -f "$ST_EXP_OUT/verdict.txt" ]]; then
  echo "Verdict (what tests/e2e_deploy.rs checks):"
  cat "$ST_EXP_OUT/verdict.txt"
  if ((rc == 0)); then echo "All checks held."; else echo "Some checks did not hold (BROKEN above)."; fi
else
  echo "No verdict: the experiment stopped before its checks (exit $rc; its output above says where)."
fi
# the cluster stopped before the last line, so that the path of results.json stays last
cleanup
trap - EXIT
[[ -f "$ST_EXP_OUT/results.json" ]] && echo "$ST_EXP_OUT/results.json"
exit "$rc"
