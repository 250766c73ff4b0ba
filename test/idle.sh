#!/usr/bin/env bash
# Idle cost of a 3-node cluster: starts three `sluice serve` processes with
# the default flags on 127.0.0.x loopback, waits until every node sees three
# alive members, lets them settle, then samples each process's CPU time
# (/proc/PID/stat utime + stime) and resident memory (/proc/PID/status
# VmRSS) over SECONDS with no traffic, and stops them by PID.
#
# Usage: test/idle.sh [SECONDS]   (default 60, at most 600)
# Environment:
#   SLUICE_BIN  a prebuilt binary to measure (default: built from this tree)
#   IDLE_NET    the first three octets and the first last octet of the node
#               addresses (default 127.0.0.61: nodes on .61, .62, .63)
#   IDLE_PPROF  a file: also write a 30 s CPU profile of node 1 there
#               (node 1 then runs with --pprof and an HTTP port)
#   IDLE_ARGS   extra flags for every node (e.g. "--gc-min-heap 0")
#   IDLE_SETTLE seconds to wait after the cluster formed before the window
#               (default 30: the pause heartbeat stops after
#               --heartbeat-idle, 30 s, without a check)
# Prints one line per node and the total: CPU ms per second and % of one
# core, thread runs per second (the scheduler's count of times the
# process's threads got a CPU, /proc/PID/task/*/schedstat: a count of
# wake-ups that, unlike CPU time, hardly depends on how busy the machine
# is), RSS at the start and end of the window (MB).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ] || [ "$secs" -gt 600 ]; then
  echo "usage: $0 [SECONDS 1..600]" >&2; exit 2
fi
. test/threenodes.sh # the working directory is the repository
threenodes_setup "${IDLE_NET:-127.0.0.61}"
node_flags() {
  if [ "$1" = 1 ] && [ -n "${IDLE_PPROF:-}" ]; then FLAGS=(--http-addr "$(ip 1):18080" --pprof); fi
}
# shellcheck disable=SC2086 # IDLE_ARGS is a list of flags
threenodes_start idle ${IDLE_ARGS:-}
threenodes_wait
settle=${IDLE_SETTLE:-30}
if ! [[ "$settle" =~ ^[0-9]+$ ]] || [ "$settle" -gt 600 ]; then
  echo "IDLE_SETTLE: want 0..600 seconds" >&2; exit 2
fi
sleep "$settle"
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; } # kB
runs() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{n += $3} END {print n + 0}'; }
declare -a t0 r0 w0
for i in 0 1 2; do t0[i]=$(ticks "${pids[i]}"); r0[i]=$(rss "${pids[i]}"); w0[i]=$(runs "${pids[i]}"); done
start=$(date +%s.%N)
if [ -n "${IDLE_PPROF:-}" ]; then
  curl -fsS -o "$IDLE_PPROF" "http://$(ip 1):18080/debug/pprof/profile?seconds=30" &
  prof=$!
fi
sleep "$secs"
[ -n "${prof:-}" ] && { wait "$prof" || echo "profile failed" >&2; }
end=$(date +%s.%N)
tot=0
for i in 0 1 2; do
  t=$(( $(ticks "${pids[i]}") - t0[i] ))
  tot=$((tot + t))
  w=$(( $(runs "${pids[i]}") - w0[i] ))
  awk -v n="idle-$((i + 1))" -v t="$t" -v w="$w" -v hz="$hz" -v s0="$start" -v s1="$end" -v r0="${r0[i]}" -v r1="$(rss "${pids[i]}")" \
    'BEGIN { ms = t * 1000 / hz / (s1 - s0); printf "%s: %.1f ms/s CPU (%.2f %% of a core), %.0f thread runs/s, RSS %.1f -> %.1f MB\n", n, ms, ms / 10, w / (s1 - s0), r0 / 1024, r1 / 1024 }'
done
awk -v t="$tot" -v hz="$hz" -v s0="$start" -v s1="$end" \
  'BEGIN { ms = t * 1000 / hz / (s1 - s0); printf "total: %.1f ms/s CPU over %.0f s (%.2f %% of a core per node)\n", ms, s1 - s0, ms / 30 }'
