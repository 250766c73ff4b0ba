#!/usr/bin/env bash
# Capacity against cluster size: N real `sluice serve` nodes on loopback,
# each in its own cgroup (v1 cpu controller) held to CAP_CPU cores, for N
# in CAP_NODES, and `sluice bench` from outside at saturation on many keys,
# in two shapes:
#
#   owner-aware  the client learns the owner table and sends each check
#                straight to its key's owner (bench --owner-aware): no node
#                forwards, so capacity should grow with N almost one for one.
#                Each caller's batches hold keys of one owner
#                (--owner-batches; CAP_OWNER_BATCHES=0 mixes them), so that
#                a node gets batches of CAP_BATCH checks whatever N is, as
#                the lone node does, not N calls of CAP_BATCH/N
#   sidecar      each caller calls one node, its own, as an application
#                calls the sidecar beside it (bench spreads its callers
#                over --addr, caller w on node w mod N): (N-1)/N of the
#                checks take a second hop to their owner
#
# Both send batches of CAP_BATCH checks per call over CAP_KEYS keys at
# random, limits that admit everything, once the cluster is steady: the
# rounds start CAP_SETTLE seconds after every node saw every node alive,
# past the move window of the last join (30 s), within which a node pulls
# each key of a partition that came to it before its first decision. A
# light load (one caller per node, single checks) runs until then: a node
# left without checks for --heartbeat-idle (30 s) stops its pause
# heartbeat, and its first check after that is handled as a pause, every
# key it owns pulled before its next decision for 30 s. Then every key is
# checked once, so that the rounds measure a warm cluster: a key's first
# check reads the store on its owner, and its first copy on its replica.
# The pulls of each round are counted and printed, with the checks the nodes
# forwarded and stood in for, and the owner-aware checks the client sent to
# any node instead of the owner (owner skipped or failed). The budget, not the generator,
# must be what stops the nodes: the script reports, per round, the share
# of the nodes' 100 ms CFS periods that ran out of quota (throttled) and
# the generator's own CPU (bench's user+system time from /usr/bin/time),
# and the servers' CPU per check (cpuacct.usage of their cgroups), and the
# machine's other busy cores (other processes, and kernel work charged to
# neither, such as loopback networking): a round whose nodes did not get
# their quota shows what took it.
#
# At the end it prints the curve, and the two ratios the scale promise is
# held to (docs/scaling.md): owner-aware capacity(largest N) over
# capacity(1), and sidecar capacity(largest N) over capacity(2).
#
# Usage: test/capacity.sh [SECONDS]   (per round, 3..120; default 10)
# Environment:
#   CAP_NODES   cluster sizes, ascending (default "1 2 4 8"; each 1..16)
#   CAP_CPU     cores per node (default 0.2)
#   CAP_BATCH   checks per call (default 500)
#   CAP_CONC    bench callers per node (default 4)
#   CAP_KEYS    distinct keys (default 100000)
#   CAP_OWNER_BATCHES  1 (default): owner-aware batches of one owner's keys;
#               0: batches of keys at random, split per owner by the client
#   CAP_NET     first three octets of the node addresses (default 127.0.5)
#   CAP_SETTLE  seconds from formation to the first round (default 32)
#   CAP_REPLICAS  copies of each key, the owner's included (--replicas;
#               default 2, the node's default; 1 replicates nothing, to
#               measure what replication costs)
#   SLUICE_BIN  a prebuilt binary (default: go build ./cmd/sluice)
#   CAP_KEEP    non-empty: keep the temp dir, with each node's log (warnings
#               and errors, pauses among them) as log-N-I for node I of the
#               N-node cluster
# Needs root and a writable /sys/fs/cgroup/cpu (cgroup v1); exits 2
# without. Nodes are stopped by PID, cgroups removed and the temp dir
# deleted on exit (the dir kept with CAP_KEEP), also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 3 ] || [ "$secs" -gt 120 ]; then
  echo "usage: $0 [SECONDS 3..120]" >&2; exit 2
fi
sizes=${CAP_NODES:-1 2 4 8}
cpu=${CAP_CPU:-0.2}
batch=${CAP_BATCH:-500}
conc=${CAP_CONC:-4}
keys=${CAP_KEYS:-100000}
net=${CAP_NET:-127.0.5}
settle=${CAP_SETTLE:-32}
replicas=${CAP_REPLICAS:-2}
owner_batches=${CAP_OWNER_BATCHES:-1}
for s in $sizes; do
  if ! [[ "$s" =~ ^[0-9]+$ ]] || [ "$s" -lt 1 ] || [ "$s" -gt 16 ]; then echo "CAP_NODES: want sizes 1..16, got $s" >&2; exit 2; fi
done
if ! [[ "$cpu" =~ ^[0-9]*\.?[0-9]+$ ]]; then echo "CAP_CPU: want a number of cores" >&2; exit 2; fi
if ! [[ "$batch" =~ ^[0-9]+$ ]] || [ "$batch" -lt 1 ] || [ "$batch" -gt 1000 ]; then echo "CAP_BATCH: want 1..1000" >&2; exit 2; fi
if ! [[ "$conc" =~ ^[0-9]+$ ]] || [ "$conc" -lt 1 ] || [ "$conc" -gt 64 ]; then echo "CAP_CONC: want 1..64" >&2; exit 2; fi
if ! [[ "$keys" =~ ^[0-9]+$ ]] || [ "$keys" -lt 1 ]; then echo "CAP_KEYS: want a positive whole number" >&2; exit 2; fi
if ! [[ "$settle" =~ ^[0-9]+$ ]] || [ "$settle" -gt 600 ]; then echo "CAP_SETTLE: want 0..600 seconds" >&2; exit 2; fi
if ! [[ "$replicas" =~ ^[1-9]$ ]]; then echo "CAP_REPLICAS: want 1..9" >&2; exit 2; fi
if ! [[ "$owner_batches" =~ ^[01]$ ]]; then echo "CAP_OWNER_BATCHES: want 0 or 1" >&2; exit 2; fi
cg=/sys/fs/cgroup/cpu
acct=/sys/fs/cgroup/cpuacct
if [ ! -w "$cg" ] || [ ! -w "$acct" ]; then
  echo "capacity: needs a writable cgroup v1 cpu and cpuacct controller ($cg, $acct): run as root on cgroup v1" >&2
  exit 2
fi
quota=$(awk -v c="$cpu" 'BEGIN {printf "%d", c * 100000}')

tmp=$(mktemp -d)
pids=()
groups=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for g in "${groups[@]}"; do rmdir "$g" 2>/dev/null || true; done
  if [ -n "${CAP_KEEP:-}" ]; then echo "capacity: kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT INT TERM
bin=${SLUICE_BIN:-}
if [ -z "$bin" ]; then
  bin=$tmp/sluice
  go build -o "$bin" ./cmd/sluice
fi

# alive I: the members node I sees alive (sluice_members_alive), 0 if it
# does not answer.
alive() {
  curl -fsS -m 1 "http://$net.$1:8080/metrics" 2>/dev/null | awk '$1 == "sluice_members_alive" {v = $2} END {printf "%d\n", v + 0}'
}

# start N: nodes 1..N, each in its cgroup, until every node sees N alive.
start() {
  local n=$1 i g
  pids=()
  for ((i = 1; i <= n; i++)); do
    local join=()
    [ "$i" -gt 1 ] && join=(--join "$net.1:7946")
    rm -rf "$tmp/data-$i"
    "$bin" serve --node-name "cap-$i" --grpc-addr "$net.$i:8081" --http-addr "$net.$i:8080" \
      --gossip-addr "$net.$i:7946" --data-dir "$tmp/data-$i" --replicas "$replicas" --log-level warn "${join[@]}" \
      </dev/null 2>"$tmp/log-$n-$i" &
    pids[i]=$!
    for c in cpu cpuacct; do
      g=/sys/fs/cgroup/$c/sluice-cap-$$-$i
      [ -d "$g" ] || { mkdir "$g"; groups+=("$g"); }
      echo "${pids[i]}" >"$g/cgroup.procs"
    done
    g=$cg/sluice-cap-$$-$i
    echo 100000 >"$g/cpu.cfs_period_us"
    echo "$quota" >"$g/cpu.cfs_quota_us"
    if [ "$i" = 1 ]; then
      for _ in $(seq 1 300); do curl -sf -m 1 -o /dev/null "http://$net.1:8080/healthz" && break; sleep 0.1; done
    fi
  done
  local ok
  for _ in $(seq 1 600); do
    ok=0
    for ((i = 1; i <= n; i++)); do [ "$(alive "$i")" = "$n" ] && ok=$((ok + 1)); done
    [ "$ok" = "$n" ] && return 0
    sleep 0.1
  done
  echo "capacity: $n nodes did not see each other alive within 60 s; logs:" >&2
  tail -n 5 "$tmp"/log-"$n"-* >&2
  exit 1
}

stop() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

# usage N: the nodes' CPU ns (cpuacct.usage), periods, throttled periods,
# pulls made (sluice_pulls_total), and pauses and idle resumes noticed
# (sluice_pauses_total, sluice_idle_resumes_total), checks forwarded to
# another node and checks stood in for an owner that did not answer
# (sluice_forwarded_total, sluice_failovers_total), summed; then the
# machine's busy clock ticks (/proc/stat: all but idle and iowait).
usage() {
  local n=$1 i u=0 p=0 t=0 l=0 q=0 fw=0 fo=0 g m b
  for ((i = 1; i <= n; i++)); do
    g=sluice-cap-$$-$i
    u=$((u + $(cat "$acct/$g/cpuacct.usage")))
    p=$((p + $(awk '$1 == "nr_periods" {print $2}' "$cg/$g/cpu.stat")))
    t=$((t + $(awk '$1 == "nr_throttled" {print $2}' "$cg/$g/cpu.stat")))
    m=$(curl -fsS -m 2 "http://$net.$i:8080/metrics")
    l=$((l + $(awk '$1 == "sluice_pulls_total" {v = $2} END {printf "%d\n", v + 0}' <<<"$m")))
    q=$((q + $(awk '$1 == "sluice_pauses_total" || $1 == "sluice_idle_resumes_total" {v += $2} END {printf "%d\n", v + 0}' <<<"$m")))
    fw=$((fw + $(awk '$1 == "sluice_forwarded_total" {v = $2} END {printf "%d\n", v + 0}' <<<"$m")))
    fo=$((fo + $(awk '$1 == "sluice_failovers_total" {v = $2} END {printf "%d\n", v + 0}' <<<"$m")))
  done
  b=$(awk '$1 == "cpu" { busy = 0; for (i = 2; i <= NF; i++) if (i != 5 && i != 6) busy += $i; print busy; exit }' /proc/stat)
  echo "$u $p $t $l $q $fw $fo $b"
}

field() { sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p" "$1"; }

# round N SHAPE: one bench run; appends a line to $tmp/curve.
round() {
  local n=$1 shape=$2 i addrs="" flags=()
  for ((i = 1; i <= n; i++)); do addrs+="${addrs:+,}$net.$i:8081"; done
  if [ "$shape" = owner-aware ]; then
    flags=(--owner-aware)
    [ "$owner_batches" = 1 ] && flags+=(--owner-batches)
  fi
  local before after
  before=$(usage "$n")
  /usr/bin/time -f '%U %S' -o "$tmp/gen" "$bin" bench --addr "$addrs" "${flags[@]}" --batch "$batch" \
    --concurrency $((conc * n)) --keys "$keys" --duration "${secs}s" --progress 0 --json >"$tmp/bench.json"
  after=$(usage "$n")
  local f=$tmp/bench.json
  read -r u0 p0 t0 l0 q0 fw0 fo0 b0 <<<"$before"
  read -r u1 p1 t1 l1 q1 fw1 fo1 b1 <<<"$after"
  read -r gu gs <"$tmp/gen"
  # other: the machine's busy cores that were neither the nodes' nor the
  # generator's (other processes, and kernel work charged to neither, such
  # as loopback networking in softirq), over the same span as the nodes'.
  awk -v n="$n" -v s="$shape" -v cps="$(field "$f" checks_per_sec)" -v checks="$(field "$f" checks)" \
    -v p99="$(field "$f" p99_us)" -v errs="$(($(field "$f" call_errors) + $(field "$f" item_errors)))" \
    -v du="$((u1 - u0))" -v dp="$((p1 - p0))" -v dt="$((t1 - t0))" -v pulls="$((l1 - l0))" -v pauses="$((q1 - q0))" -v fwd="$((fw1 - fw0))" -v fo="$((fo1 - fo0))" -v fb="$(field "$f" owner_fallback)" -v gen="$gu $gs" -v secs="$(field "$f" seconds)" \
    -v busy="$((b1 - b0))" -v hz="$(getconf CLK_TCK)" 'BEGIN {
      split(gen, g, " ")
      printf "%d\t%s\t%.0f\t%.0f\t%d\t%.2f\t%.0f\t%.2f\t%.2f\t%d\t%d\t%.2f\t%d\t%d\t%s\n", n, s, cps, p99, errs, du / 1e3 / checks,
        (dp > 0 ? 100 * dt / dp : 0), du / 1e9 / secs, (g[1] + g[2]) / secs, pulls, pauses,
        busy / hz / secs - du / 1e9 / secs - (g[1] + g[2]) / secs, fwd, fo, (s == "owner-aware" ? fb + 0 : "-") }' >>"$tmp/curve"
}

echo "capacity: nodes {$sizes}, $cpu core each (cpu.cfs_quota_us $quota of 100000), ${secs} s a round," \
  "batches of $batch (owner batches: $owner_batches), $conc callers per node, $keys keys; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$tmp/curve"
for n in $sizes; do
  start "$n"
  # Past the move window of the last join, never idle (see the head).
  addrs=""
  for ((i = 1; i <= n; i++)); do addrs+="${addrs:+,}$net.$i:8081"; done
  "$bin" bench --addr "$addrs" --concurrency "$n" --keys "$keys" --duration "${settle}s" --progress 0 --json >/dev/null
  # Every key once (see the head).
  "$bin" bench --addr "$addrs" --sequential --batch "$batch" --calls $(((keys + batch - 1) / batch)) \
    --concurrency 1 --keys "$keys" --duration 120s --progress 0 --json >/dev/null
  round "$n" owner-aware
  round "$n" sidecar
  stop
done

printf '\n%-5s %-11s %10s %9s %6s %11s %10s %12s %10s %12s %7s %6s %10s %9s %9s\n' nodes shape checks/s "p99 µs" errors "µs CPU/chk" throttled "server cores" "gen cores" "other cores" pulls pauses forwarded stood-in "to any"
awk -F'\t' '{printf "%-5d %-11s %10.0f %9.0f %6d %11.2f %9.0f%% %12.2f %10.2f %12.2f %7d %6d %10d %9d %9s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $12, $10, $11, $13, $14, $15}' "$tmp/curve"
awk -F'\t' -v sizes="$sizes" '
  { cap[$2, $1] = $3; errs += $5 }
  END {
    n = split(sizes, s, " "); big = s[n]
    printf "\n"
    if (("owner-aware", 1) in cap && big > 1)
      printf "owner-aware: capacity(%d) / capacity(1) = %.2f (the promise: at least %.1f at 8 nodes)\n", big, cap["owner-aware", big] / cap["owner-aware", 1], 7
    if (("sidecar", 2) in cap && big > 2)
      printf "sidecar:     capacity(%d) / capacity(2) = %.2f (the promise: at least %.1f at 8 nodes)\n", big, cap["sidecar", big] / cap["sidecar", 2], 3.4
    if (errs > 0) { printf "errors: %d\n", errs; exit 1 }
  }' "$tmp/curve"
