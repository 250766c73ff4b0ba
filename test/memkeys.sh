#!/usr/bin/env bash
# Memory per distinct key, all copies on all nodes: starts three `sluice
# serve` processes with the default flags (plus --pprof, to read the Go
# heap) on 127.0.0.x loopback, waits until every node sees three alive
# members, sums their RSS (/proc/PID/status VmRSS), loads KEYS distinct keys
# once each through node 1 with `sluice bench --sequential` (100 checks per
# call, window 1 h so that nothing expires meanwhile), waits for
# replication and flushes, and prints the RSS growth per key, 5 s after the
# load and again after SETTLE seconds. Then the latency with that many keys
# held: MEM_LAT_ROUNDS pairs of 10-s `sluice bench` runs through all three
# nodes, single checks at random over the first 10,000 keys and over all
# KEYS (same callers, same limits, alternated, in the same minutes), and the
# ratio of their p99s. Stops the nodes by PID.
#
# Usage: test/memkeys.sh [KEYS] [SETTLE]   (default 1000000 and 60; at most
#                                            10000000 keys and 600 s)
# Environment:
#   SLUICE_BIN  a prebuilt binary to measure (default: built from this tree)
#   BENCH_BIN   the binary whose `bench` loads (default SLUICE_BIN; it needs
#               --sequential)
#   MEM_NET     the first node's address (default 127.0.0.71: .71, .72, .73)
#   MEM_ARGS    extra flags for every node (e.g. "--gc-min-heap 0")
#   MEM_LAT_ROUNDS  pairs of latency runs after the settle (default 3; 0: none)
set -euo pipefail
cd "$(dirname "$0")/.."
keys=${1:-1000000}
settle=${2:-60}
if ! [[ "$keys" =~ ^[0-9]+$ ]] || [ "$keys" -lt 100 ] || [ "$keys" -gt 10000000 ] ||
  ! [[ "$settle" =~ ^[0-9]+$ ]] || [ "$settle" -gt 600 ]; then
  echo "usage: $0 [KEYS 100..10000000] [SETTLE 0..600]" >&2; exit 2
fi
. test/threenodes.sh # the working directory is the repository
threenodes_setup "${MEM_NET:-127.0.0.71}"
node_flags() { FLAGS=(--http-addr "$(ip "$1"):18080" --pprof); }
# shellcheck disable=SC2086 # MEM_ARGS is a list of flags
threenodes_start mem ${MEM_ARGS:-}
threenodes_wait
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; } # kB
total() { local t=0; for p in "${pids[@]}"; do t=$((t + $(rss "$p"))); done; echo "$t"; }
each() { for i in 1 2 3; do printf "mem-%d %.1f MB  " "$i" "$(echo "$(rss "${pids[i-1]}") / 1024" | bc -l)"; done; echo; }
heap() {
  for i in 1 2 3; do
    curl -fsS "http://$(ip "$i"):18080/debug/pprof/heap?debug=1" 2>/dev/null |
      awk -v n="mem-$i" '/^# HeapAlloc/ {a=$4} /^# HeapSys/ {s=$4} /^# HeapReleased/ {r=$4} /^# NextGC/ {g=$4}
        END {printf "%s: heap live+garbage %.1f MB, retained %.1f MB, next GC at %.1f MB\n", n, a/1048576, (s-r)/1048576, g/1048576}'
  done
}
before=$(total)
echo "before: $(each)"
"${BENCH_BIN:-$bin}" bench --addr "$(ip 1):18081" --concurrency 8 --batch 100 --keys "$keys" --sequential \
  --calls $(((keys + 99) / 100)) --duration 30m --window 1h --progress 0 | tee "$tmp/load" | sed 's/^/  /'
# The keys loaded: each admitted check is one key's first hit (the load
# stops after 30 minutes even when it has not reached them all).
loaded=$(awk '$1 == "allowed" {print $2}' "$tmp/load")
if [ "${loaded:-0}" -lt 1 ]; then echo "memkeys: the load admitted no check" >&2; exit 1; fi
[ "$loaded" = "$keys" ] || echo "  only $loaded of $keys keys loaded: the figures below are per key loaded"

report() {
  local after; after=$(total)
  echo "$1: $(each)"
  awk -v b="$before" -v a="$after" -v k="$loaded" \
    'BEGIN { printf "  RSS growth, three nodes: %.1f MB, %.0f B per key\n", (a - b) / 1024, (a - b) * 1024 / k }'
  heap | sed 's/^/  /'
}
sleep 5
report "5 s after the load"
if [ "$settle" -gt 5 ]; then
  sleep $((settle - 5))
  report "$settle s after the load"
fi
rounds=${MEM_LAT_ROUNDS:-3}
if [ "$rounds" -gt 0 ]; then
  addrs="$(ip 1):18081,$(ip 2):18081,$(ip 3):18081"
  few=$((keys < 10000 ? keys : 10000))
  echo "latency: $rounds pairs of 10-s runs, 24 callers over the three nodes, single checks at random over $few keys and over $keys"
  lat() { # KEYS: the p99 in µs of one run
    "${BENCH_BIN:-$bin}" bench --addr "$addrs" --concurrency 24 --keys "$1" --window 1h --duration 10s --progress 0 --json |
      sed -n 's/.*"p99_us": *\([0-9.e+-]*\).*/\1/p'
  }
  ratios=()
  for ((r = 1; r <= rounds; r++)); do
    a=$(lat "$few"); b=$(lat "$keys")
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}')
    ratios+=("$ratio")
    echo "  round $r: p99 $a µs over $few keys, $b µs over $keys keys: ratio $ratio"
  done
  printf '%s\n' "${ratios[@]}" | sort -n | awk '{r[NR] = $1} END {printf "  p99 over %s keys / over %s keys, median of %d rounds: %.3f\n", k, f, NR, r[int((NR + 1) / 2)]}' k="$keys" f="$few"
fi
for i in 1 2 3; do
  "$bin" status --addr "$(ip "$i"):18081" --json 2>/dev/null | grep -o '"keys":"\?[0-9]*' | head -1 | sed "s/^/  mem-$i /"
done
