#!/usr/bin/env bash
# make demo: the main job at a small size. A local cluster with three real nodes (kubelet +
# containerd; kube-proxy in iptables-nft and nftables mode, Cilium in its place on the third), a
# Deployment of the project's test app behind a ClusterIP Service, new-connection-per-request
# load from each node, and two rolling
# restarts: one without safe-termination (baseline), one with it (the operator measures the real
# kube-proxies, its webhook injects the sized preStop sleep). Prints the table, writes the picture,
# and prints the path of results.json on its last line. The full experiment: make experiment.
#
# DEMO_KEEP=1 leaves the cluster running (stop it with: make cluster-down).
set -euo pipefail
cd "$(dirname "$0")/../.."
export ST_E2E_DIR="${ST_E2E_DIR:-/tmp/safe-termination-e2e}"
export ST_EXP_OUT="${ST_EXP_OUT:-$PWD/target/demo}"
export ST_EXP_RUNS="${ST_EXP_RUNS:-a,b,w}"
export ST_EXP_ROLLOUTS="${ST_EXP_ROLLOUTS:-1}"
export ST_EXP_STRATEGIES="${ST_EXP_STRATEGIES:-25%/0}"
export ST_EXP_KEEP="${DEMO_KEEP:-0}"
# build first, so the cluster is not kept waiting on the compiler
echo "[demo] building the experiment's test binary (quiet: 6 to 8 min on a clean clone, seconds once built)" >&2
cargo test --quiet --features cluster-tests --test e2e_deploy --no-run
exec e2e/experiment/experiment.sh
