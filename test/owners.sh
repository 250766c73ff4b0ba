#!/usr/bin/env bash
# Owner-aware client against any-node routing, same load generator, same
# cluster, alternating rounds: starts three nodes on 127.0.0.41-43 and runs
# `sluice bench` single-check calls (50 callers, 10k keys; BATCH below) ROUNDS times in
# each mode, alternating:
#   any    --addr of all three nodes, --conns 1: calls spread over the nodes,
#          which forward the checks they do not own (two thirds of them)
#   owner  the same with --owner-aware: each check straight to its owner
# Both modes hold one connection per node. For every run it prints the
# bench summary and the servers' CPU (utime + stime of the three node
# processes from /proc/PID/stat over the run) per check, and the load
# generator's own CPU. Bounded: each run lasts DURATION and at most 5M calls.
# Usage: test/owners.sh [DURATION] [ROUNDS]   (default 10s, 3)
# BATCH=N sends N checks per call instead of 1 (the owner-aware client
# splits each call into one per owner).
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
rounds=${2:-3}
batch=${BATCH:-1}
. test/threenodes.sh
threenodes_setup 127.0.0.41
threenodes_start owners
threenodes_wait
addrs="$(ip 1):18081,$(ip 2):18081,$(ip 3):18081"
hz=$(getconf CLK_TCK)
ticks() { local s=0 p; for p in "${pids[@]}"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$s"; }
field() { local v; v=$(grep -o "\"$1\":[0-9.e+]*" "$2" | head -1 | cut -d: -f2); echo "${v:-0}"; }
printf '%-5s %-5s %10s %8s %8s %13s %15s %11s %14s\n' round mode checks/s p50_us p99_us server_cpu_ms server_us/check bench_cpu_s bench_us/check
run() {
  local round=$1 mode=$2 flags=() t0 t1 out=$tmp/bench.json tf=$tmp/time
  [ "$mode" = owner ] && flags=(--owner-aware)
  t0=$(ticks)
  /usr/bin/time -f '%U %S' -o "$tf" "$bin" bench --addr "$addrs" --conns 1 "${flags[@]}" \
    --concurrency 50 --batch "$batch" --keys 10000 --duration "$dur" --calls 5000000 --json >"$out"
  t1=$(ticks)
  local checks cpu_ms bench_s
  checks=$(field checks "$out")
  cpu_ms=$(( (t1 - t0) * 1000 / hz ))
  bench_s=$(awk '{print $1 + $2}' "$tf")
  printf '%-5s %-5s %10.0f %8.0f %8.0f %13d %15.1f %11s %14.1f\n' "$round" "$mode" \
    "$(field checks_per_sec "$out")" "$(field p50_us "$out")" "$(field p99_us "$out")" \
    "$cpu_ms" "$(echo "$cpu_ms * 1000 / $checks" | bc -l)" "$bench_s" "$(echo "$bench_s * 1000000 / $checks" | bc -l)"
  grep -q '"call_errors":0' "$out" || echo "  errors: $(cat "$out")"
  [ "$mode" = owner ] && echo "  owner routing: routed $(field owner_routed "$out"), to any node $(field owner_fallback "$out"), decided elsewhere $(field owner_moved "$out")"
  return 0
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then run "$r" any; run "$r" owner; else run "$r" owner; run "$r" any; fi
done
