#!/usr/bin/env bash
# The scrape cycle in both of kube-proxy's expositions side by side (docs/benchmarks/scrape.md "Scrape
# fan-out", "Text and protobuf"): examples/scrape_fanout.rs over COUNT fake kube-proxies, the
# bodies alternating run by run so the shared machine's noise hits each alike:
#
#   protobuf     the real v1.37.2 protobuf capture (67 KB, native histograms), kube-proxy's
#                Content-Type, to the operator's protobuf-first Accept
#   text-v1.37   its text twin (105 KB): the same scrape
#   text-v1.29   the padded v1.29 text body of the earlier rows (SIZE_KB), for continuity
#
# ROUNDS rounds (each one run of every body in BODIES order, the order reversed every other
# round), CYCLES cycles per run (cycle 1 cold). Every run's UTC start and load average are
# printed with its figures; the raw output goes to OUT/run-N-BODY.txt.
#
# Env: COUNT (5000), ROUNDS (3), CYCLES (4), BODIES ("text-v1.37 protobuf text-v1.29"),
# SIZE_KB (78), CPU_TARGET (2.5, the per-cycle CPU-s target at 5,000 nodes), MODE (direct; both:
# also through the node agents), OUT (target/scrape-formats), CARGO_TARGET_DIR (honoured).
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT=${COUNT:-5000}
ROUNDS=${ROUNDS:-3}
CYCLES=${CYCLES:-4}
BODIES=${BODIES:-text-v1.37 protobuf text-v1.29}
SIZE_KB=${SIZE_KB:-78}
CPU_TARGET=${CPU_TARGET:-2.5}
MODE=${MODE:-direct}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/scrape-formats}
mkdir -p "$OUT"

cargo build --release --example fake_kube_proxies --example scrape_fanout --example fake_agents
FANOUT="$TARGET_DIR/release/examples/scrape_fanout"

read -r -a bodies <<<"$BODIES"
n=0
for ((r = 1; r <= ROUNDS; r++)); do
  order=("${bodies[@]}")
  if (( r % 2 == 0 )); then
    order=()
    for ((i = ${#bodies[@]} - 1; i >= 0; i--)); do order+=("${bodies[$i]}"); done
  fi
  for body in "${order[@]}"; do
    n=$((n + 1))
    case "$body" in
      protobuf) flags=(--format protobuf --capture v1.37) ;;
      text-v1.37) flags=(--format text --capture v1.37) ;;
      text-v1.29) flags=(--format text --capture v1.29 --size-kb "$SIZE_KB") ;;
      *) echo "unknown body $body" >&2; exit 2 ;;
    esac
    start=$(date -u +%H:%M:%S)
    load=$(awk '{ print $1 }' /proc/loadavg)
    f="$OUT/run-$n-$body.txt"
    "$FANOUT" --count "$COUNT" --cycles "$CYCLES" --mode "$MODE" --cpu-target "$CPU_TARGET" "${flags[@]}" >"$f" 2>&1 || true
    end_load=$(awk '{ print $1 }' /proc/loadavg)
    if [[ "$MODE" == direct ]]; then
      # cycle lines: wall, client CPU, kube-proxies CPU
      awk -v run="$n" -v body="$body" -v start="$start" -v load="$load" -v end_load="$end_load" '
        /^cycle / { for (i = 1; i <= NF; i++) { if ($i == "wall") w[++c] = $(i + 1); if ($i == "client") u[c] = $(i + 2); if ($i == "kube-proxies") k[c] = $(i + 2); if ($i == "failed") f += $(i + 1) } }
        /^nodes whose newest/ { native = $(NF - 2) }
        END {
          # warm: median of cycles 2..c
          m = 0; for (i = 2; i <= c; i++) { ws[++m] = w[i]; us[m] = u[i] }
          for (i = 2; i <= m; i++) for (j = i; j > 1 && ws[j - 1] > ws[j]; j--) { t = ws[j]; ws[j] = ws[j - 1]; ws[j - 1] = t }
          for (i = 2; i <= m; i++) for (j = i; j > 1 && us[j - 1] > us[j]; j--) { t = us[j]; us[j] = us[j - 1]; us[j - 1] = t }
          mid = int((m + 1) / 2)
          printf "| %d | %s | %s, %s-%s | %s s | %s s | %s s | %s s | %s s | %s | %s |\n", run, body, start, load, end_load, w[1], u[1], ws[mid], us[mid], k[2], native, f
        }' "$f"
    else
      echo "| $n | $body | $start, $load-$end_load |"
      grep '^|' "$f" | tail -n +3
    fi
    grep -E '^(PASS|FAIL)' "$f" | sed "s/^/  run $n $body: /" >&2
  done
done
