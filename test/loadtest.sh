#!/usr/bin/env bash
# Starts a 3-node Sluice cluster on 127.0.0.21-23 and drives it through one
# node with `sluice bench`: single-check calls and calls of 100 checks,
# 50 concurrent callers over 10k keys. Bounded: each run lasts DURATION.
# Usage: test/loadtest.sh [DURATION]   (default 10s). Prints the summaries
# and the CPU time each process used: on a shared machine CPU per check
# moves less with other load than checks/s does.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
bin=$(mktemp -d)/sluice
go build -o "$bin" ./cmd/sluice
data=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$data"; }
trap cleanup EXIT
for i in 1 2 3; do
  ip=127.0.0.2$i
  join=(); [ "$i" -gt 1 ] && join=(--join 127.0.0.21:17946)
  "$bin" serve --node-name "load-$i" --grpc-addr $ip:18081 --http-addr "" --gossip-addr $ip:17946 \
    --data-dir "$data/$i" --log-level warn "${join[@]}" 2>"$data/log-$i" &
  pids+=($!)
done
for _ in $(seq 1 100); do
  n=$("$bin" status --addr 127.0.0.21:18081 --json 2>/dev/null | grep -o '"state":"alive"' | wc -l || true)
  [ "$n" = 3 ] && break
  sleep 0.1
done
# ticks: CPU time (user + system, in clock ticks) the nodes have used so far.
ticks() { for p in "${pids[@]}"; do awk '{printf "%d ", $14 + $15}' "/proc/$p/stat"; done; }
hz=$(getconf CLK_TCK)
TIMEFORMAT="bench process CPU: %U s user, %S s system"
run() {
  local batch=$1 t0 t1
  t0=($(ticks))
  time "$bin" bench --addr 127.0.0.21:18081 --concurrency 50 --batch "$batch" --keys 10000 --duration "$dur" --progress 0
  t1=($(ticks))
  echo "node CPU: load-1 $(( (t1[0] - t0[0]) * 1000 / hz )) ms, load-2 $(( (t1[1] - t0[1]) * 1000 / hz )) ms, load-3 $(( (t1[2] - t0[2]) * 1000 / hz )) ms"
}
echo "== single-check calls, 50 callers, 10k keys, $dur"
run 1
echo "== 100 checks per call, 50 callers, 10k keys, $dur"
run 100
