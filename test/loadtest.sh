#!/usr/bin/env bash
# Starts a 3-node Sluice cluster on 127.0.0.21-23 and drives it through one
# node with `sluice bench`: single-check calls and calls of 100 checks,
# 50 concurrent callers over 10k keys. Bounded: each run lasts DURATION.
# Usage: test/loadtest.sh [DURATION]   (default 10s). Prints the summaries.
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
echo "== single-check calls, 50 callers, 10k keys, $dur"
"$bin" bench --addr 127.0.0.21:18081 --concurrency 50 --batch 1 --keys 10000 --duration "$dur" --progress 0
echo "== 100 checks per call, 50 callers, 10k keys, $dur"
"$bin" bench --addr 127.0.0.21:18081 --concurrency 50 --batch 100 --keys 10000 --duration "$dur" --progress 0
