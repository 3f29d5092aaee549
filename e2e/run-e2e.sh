#!/usr/bin/env bash
# make e2e: start the local control plane, run the Rust end-to-end tests against it, and stop it
# again whatever happens (no process, netns or veth is left behind).
set -euo pipefail
cd "$(dirname "$0")/.."
export ST_E2E_DIR="${ST_E2E_DIR:-/tmp/safe-termination-e2e}"
trap 'ST_E2E_KEEP_LOGS=1 e2e/cluster-down.sh >/dev/null 2>&1 || true' EXIT
e2e/cluster-up.sh
# shellcheck disable=SC1091
source "$ST_E2E_DIR/env"
cargo test --test e2e -- --ignored --test-threads=1
# the ground truth of the propagation window, then scale (thousands of Services: slow syncs)
cargo test --test e2e_window -- --ignored --test-threads=1 --nocapture
