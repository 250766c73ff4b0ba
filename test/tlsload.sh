#!/usr/bin/env bash
# The cost of mTLS: two 3-node Sluice clusters side by side, one plaintext
# (127.0.0.21-23) and one with mTLS between nodes, client certificates and
# encrypted gossip (127.0.0.24-26), driven alternately through one node
# with `sluice bench` (single-check calls, 50 callers, 10k keys). Prints
# each round's summary and the CPU time the three nodes of the cluster
# under load used, so checks/s, p99 and server CPU per check compare in
# the same minutes. Bounded: ROUNDS rounds of DURATION per cluster.
# Usage: test/tlsload.sh [DURATION] [ROUNDS]   (default 10s 3)
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
rounds=${2:-3}
work=$(mktemp -d)
bin=$work/sluice
go build -o "$bin" ./cmd/sluice
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$bin" certs --out "$work/pki" --nodes tls-1,tls-2,tls-3 --hosts 127.0.0.24,127.0.0.25,127.0.0.26 >/dev/null
"$bin" keygen >"$work/gossip.key"
pki=$work/pki
start() { # start NAME-PREFIX FIRST-IP-SUFFIX EXTRA-ARGS-FN
  local prefix=$1 base=$2
  for i in 1 2 3; do
    local ip=127.0.0.$((base + i - 1)) join=() sec=()
    [ "$i" -gt 1 ] && join=(--join 127.0.0.$base:17946)
    [ "$prefix" = tls ] && sec=(--tls-cert "$pki/tls-$i.pem" --tls-key "$pki/tls-$i-key.pem" --tls-ca "$pki/node-ca.pem"
      --client-ca "$pki/client-ca.pem" --gossip-key-file "$work/gossip.key")
    "$bin" serve --node-name "$prefix-$i" --cluster-name "$prefix" --grpc-addr $ip:18081 --http-addr "" --gossip-addr $ip:17946 \
      --data-dir "$work/$prefix-$i" --log-level warn "${join[@]}" "${sec[@]}" 2>"$work/log-$prefix-$i" &
    pids+=($!)
  done
}
start plain 21
start tls 24
admin=(--tls-ca "$pki/node-ca.pem" --tls-cert "$pki/admin.pem" --tls-key "$pki/admin-key.pem")
client=(--tls-ca "$pki/node-ca.pem" --tls-cert "$pki/client.pem" --tls-key "$pki/client-key.pem")
for addr in 127.0.0.21 127.0.0.24; do
  sec=(); [ $addr = 127.0.0.24 ] && sec=("${admin[@]}")
  for _ in $(seq 1 100); do
    n=$("$bin" status --addr $addr:18081 --json "${sec[@]}" 2>/dev/null | grep -o '"state":"alive"' | wc -l || true)
    [ "$n" = 3 ] && break
    sleep 0.1
  done
done
hz=$(getconf CLK_TCK)
ticks() { local s=0; for p in "$@"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $s; }
round() { # round plain|tls
  local which=$1 addr sec=() nodes
  if [ "$which" = plain ]; then addr=127.0.0.21; nodes=("${pids[@]:0:3}"); else addr=127.0.0.24; sec=("${client[@]}"); nodes=("${pids[@]:3:3}"); fi
  local t0 t1 out calls
  t0=$(ticks "${nodes[@]}")
  out=$("$bin" bench --addr $addr:18081 --concurrency 50 --batch 1 --keys 10000 --duration "$dur" --progress 0 --json "${sec[@]}")
  t1=$(ticks "${nodes[@]}")
  calls=$(echo "$out" | grep -o '"checks":[0-9]*' | head -1 | cut -d: -f2)
  echo "$which: $(echo "$out" | tr -d '\n') nodes_cpu_ms=$(( (t1 - t0) * 1000 / hz )) cpu_per_check_us=$(( (t1 - t0) * 1000000 / hz / (calls > 0 ? calls : 1) ))"
}
for r in $(seq 1 "$rounds"); do
  echo "== round $r"
  round plain
  round tls
done
