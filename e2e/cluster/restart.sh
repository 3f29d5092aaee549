#!/usr/bin/env bash
# Restart one process of the running e2e cluster, the way a node's supervisor would: SIGTERM
# to its process group (SIGKILL after 10 s), then the same command again, logging to the same
# file (appended). For the fault tests: the API server restarted under a running operator, a
# kube-proxy restarted mid-measurement.
#
#   e2e/cluster/restart.sh NAME [--kill | --config-changed]      NAME as cluster-up started it: kube-apiserver, kube-proxy-node-a, ...
#
# --kill sends SIGKILL at once (a crash, not a shutdown). --config-changed is for a process whose
# configuration file was just rewritten: kube-proxy exits by itself when it sees that ("content of
# the proxy server's configuration file was updated", for its supervisor to restart it), so this
# waits up to 10 s for that exit (SIGTERM after), and a process already gone is started again.
# Prints "stopped_after_s=... started=PID".
# Only the process recorded in $ST_E2E_DIR/pids/NN-NAME.pid (PID and start time checked) is
# signalled; its pid file is rewritten with the new PID, so cluster-down stops the new one.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=e2e/cluster/lib.sh
source "$HERE/lib.sh"
STATE="$ST_E2E_DIR"
name="${1:?usage: e2e/cluster/restart.sh NAME [--kill | --config-changed]}"
sig=TERM
config_changed=0
case "${2:-}" in
  --kill) sig=KILL ;;
  --config-changed) config_changed=1 ;;
  "") ;;
  *) e2e_log "unknown option '$2' (--kill or --config-changed)"; exit 2 ;;
esac

shopt -s nullglob
files=("$STATE"/pids/[0-9][0-9]-"$name".pid)
(( ${#files[@]} == 1 )) || { e2e_log "no single pid file for '$name' in $STATE/pids (running: $(cd "$STATE/pids" && printf '%s\n' *.pid | sed 's/^[0-9]*-//; s/\.pid$//' | tr '\n' ' '))"; exit 2; }
pidfile="${files[0]}"
cmdfile="$STATE/pids/$name.cmd"
[[ -f "$cmdfile" ]] || { e2e_log "$cmdfile is missing (the cluster predates e2e/cluster/restart.sh: restart it)"; exit 2; }
read -r pid start < "$pidfile"
t0=$(date +%s.%N)
if (( config_changed )); then
  for _ in $(seq 1 100); do alive "$pid" "$start" || break; sleep 0.1; done
else
  alive "$pid" "$start" || { e2e_log "$name (pid $pid) is not running"; exit 1; }
fi

# (it may exit between the check above and the signal: then there is nothing to stop)
if alive "$pid" "$start"; then
  kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
fi
for _ in $(seq 1 100); do alive "$pid" "$start" || break; sleep 0.1; done
if alive "$pid" "$start"; then
  e2e_log "$name (pid $pid) ignored SIG$sig for 10 s: SIGKILL"
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do alive "$pid" "$start" || break; sleep 0.1; done
fi
alive "$pid" "$start" && { e2e_log "$name (pid $pid) survived SIGKILL: not starting a second one"; exit 1; }
t1=$(date +%s.%N)

# the recorded command, word for word (printf %q), in a new session like cluster-up's start
eval "set -- $(cat "$cmdfile")"
printf '\n--- restarted by e2e/cluster/restart.sh at %s ---\n' "$(date -u +%FT%TZ)" >> "$STATE/logs/$name.log"
setsid "$@" >>"$STATE/logs/$name.log" 2>&1 </dev/null &
new=$!
st=""
for _ in 1 2 3 4 5 6 7 8 9 10; do st="$(awk '{print $22}' "/proc/$new/stat" 2>/dev/null)" && [[ -n "$st" ]] && break; sleep 0.05; done
printf '%s %s\n' "$new" "$st" > "$pidfile"
# the new process must still run a second later (a bad flag or a taken port ends it at once)
sleep 1
if [[ -z "$st" ]] || ! alive "$new" "$st"; then e2e_log "$name exited right after the restart: see $STATE/logs/$name.log"; exit 1; fi
printf 'stopped_after_s=%.2f started=%s\n' "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$new"
