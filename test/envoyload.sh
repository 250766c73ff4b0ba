#!/usr/bin/env bash
# Envoy's ShouldRateLimit beside Sluice's Check on a 3-node cluster on
# 127.0.0.31-33, driven through one node by `sluice bench`: calls of 1 and of
# 5 descriptors against calls of 1 and 5 native items, in alternating rounds
# (each round runs the four shapes, every other round in reverse order).
# Both admit everything: a fixed window of one hour, the envoy-format rule
# with requests_per_unit 2^32-1 and the native items with limit 2^40.
# Bounded: ROUNDS x 4 runs of DURATION each.
# Usage: test/envoyload.sh [DURATION] [ROUNDS]   (default 10s 3)
# Per run: calls/s, p50/p99 per call, and the CPU (user + system) the three
# nodes used during the run divided by the descriptors or items decided.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
rounds=${2:-3}
tmp=$(mktemp -d)
bin=$tmp/sluice
go build -o "$bin" ./cmd/sluice
mkdir "$tmp/rules"
cat >"$tmp/rules/envoy.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 4294967295}
YAML
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
for i in 1 2 3; do
  ip=127.0.0.3$i
  join=(); [ "$i" -gt 1 ] && join=(--join 127.0.0.31:17946)
  "$bin" serve --node-name "envoyload-$i" --cluster-name envoyload --grpc-addr $ip:18081 --http-addr "" \
    --gossip-addr $ip:17946 --data-dir "$tmp/data-$i" --rules "$tmp/rules" --log-level warn "${join[@]}" 2>"$tmp/log-$i" &
  pids+=($!)
done
for _ in $(seq 1 100); do
  n=$("$bin" status --addr 127.0.0.31:18081 --json 2>/dev/null | grep -o '"state":"alive"' | wc -l || true)
  [ "$n" = 3 ] && break
  sleep 0.1
done
[ "$n" = 3 ] || { echo "the cluster did not form"; cat "$tmp"/log-*; exit 1; }
# ticks: CPU time (user + system, in clock ticks) the three nodes have used.
ticks() { local s=0; for p in "${pids[@]}"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $s; }
hz=$(getconf CLK_TCK)
field() { grep -o "\"$1\":[0-9.e+-]*" <<<"$2" | cut -d: -f2; }
run() {
  local shape=$1 batch=$2 t0 t1 out args
  args=(--addr 127.0.0.31:18081 --concurrency 50 --batch "$batch" --keys 10000 --duration "$dur" --json)
  if [ "$shape" = envoy ]; then
    args+=(--envoy bench --name user)
  else
    args+=(--name bench --algorithm fixed_window --window 1h)
  fi
  t0=$(ticks)
  out=$("$bin" bench "${args[@]}")
  t1=$(ticks)
  awk -v shape="$shape" -v batch="$batch" -v calls="$(field calls_per_sec "$out")" \
    -v p50="$(field p50_us "$out")" -v p99="$(field p99_us "$out")" -v items="$(field checks "$out")" \
    -v errs="$(( $(field call_errors "$out") + $(field item_errors "$out") ))" \
    -v cpu="$(( (t1 - t0) * 1000 / hz ))" \
    'BEGIN { printf "%-6s %d  %8.0f calls/s  p50 %6.2f ms  p99 %6.2f ms  %8d items  errors %d  nodes %6d ms CPU  %6.1f µs/item\n",
             shape, batch, calls, p50/1000, p99/1000, items, errs, cpu, cpu*1000/items }'
}
echo "# shape batch calls/s p50 p99 items errors node-CPU CPU-per-item; $dur per run, 50 callers, 10k keys"
for r in $(seq 1 "$rounds"); do
  echo "== round $r"
  if [ $((r % 2)) = 1 ]; then
    run check 1; run envoy 1; run check 5; run envoy 5
  else
    run envoy 5; run check 5; run envoy 1; run check 1
  fi
done
