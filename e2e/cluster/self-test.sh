#!/usr/bin/env bash
# The cluster harness's own checks, run by e2e/run-e2e.sh (root, from the repository root):
#   e2e/cluster/self-test.sh killed-cluster-up   # no cluster may run: a cluster-up killed once the
#                                                # real nodes' kubelets start, then cluster-down:
#                                                # leftovers.sh finds nothing
#   e2e/cluster/self-test.sh second-cluster      # with a cluster up ($ST_E2E_DIR/env sourced): a
#                                                # second cluster-up refuses to start, and its
#                                                # cluster-down leaves the running one's netns alone
set -euo pipefail
cd "$(dirname "$0")/../.."
export ST_E2E_DIR="${ST_E2E_DIR:-/tmp/safe-termination-e2e}"

case "${1:-}" in
  killed-cluster-up)
    # nothing is left behind by a cluster-up that dies half-way (here: killed once the real nodes'
    # containerds run), once cluster-down has run
    e2e/cluster/cluster-up.sh > "${TMPDIR:-/tmp}/st-cluster-up-killed.log" 2>&1 &
    up_pid=$!
    for _ in $(seq 1 600); do
      compgen -G "$ST_E2E_DIR/pids/*-kubelet-*.pid" >/dev/null && break
      kill -0 "$up_pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
    e2e/cluster/cluster-down.sh
    e2e/cluster/leftovers.sh || { echo "cluster-down left the above behind after a killed cluster-up" >&2; exit 1; }
    ;;
  second-cluster)
    # a second cluster with its own state directory refuses to start, and its cluster-down leaves
    # this cluster's network namespaces alone (they are machine-wide names; the env file's
    # ST_REAL_NODES lists node names, cluster-up's own setting of that name is 0 or 1)
    other_dir="$(mktemp -d)/other"
    if env -u ST_REAL_NODES ST_E2E_DIR="$other_dir" e2e/cluster/cluster-up.sh > "${TMPDIR:-/tmp}/st-cluster-up-second.log" 2>&1; then
      echo "a second cluster-up with ST_E2E_DIR=$other_dir started beside the running cluster" >&2; exit 1
    fi
    grep 'another e2e cluster runs on this machine' "${TMPDIR:-/tmp}/st-cluster-up-second.log" >/dev/null \
      || { echo "the second cluster-up failed for another reason:" >&2; cat "${TMPDIR:-/tmp}/st-cluster-up-second.log" >&2; exit 1; }
    env -u ST_REAL_NODES ST_E2E_DIR="$other_dir" e2e/cluster/cluster-down.sh >/dev/null
    rm -rf "$(dirname "$other_dir")"
    for kp_node in $ST_KP_NODES; do
      # shellcheck disable=SC1091
      [[ -e "/run/netns/$(source e2e/cluster/lib.sh; node_netns "$kp_node")" ]] || { echo "the second cluster-down deleted $kp_node's network namespace" >&2; exit 1; }
    done
    ;;
  *)
    echo "usage: e2e/cluster/self-test.sh killed-cluster-up|second-cluster" >&2
    exit 2
    ;;
esac
