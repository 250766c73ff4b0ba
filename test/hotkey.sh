#!/usr/bin/env bash
# One hot key through three nodes (docs/leases.md): starts three `sluice
# serve` nodes on loopback with --hot-key-threshold THRESHOLD, each in its
# own cgroup (v1 cpu controller) limited to HOTKEY_CPU cores when the
# machine has one we may write to, and drives all three with `sluice bench`
# on one key (key:0 of name bench, a fixed window of 1 s), in two rounds:
#
#   capacity   the limit admits everything: checks/s, p50/p99, and the
#              servers' CPU per check (/proc/PID/stat), per node
#   limited    a limit of HOTKEY_LIMIT per second, which the load exceeds:
#              hits admitted per second against the limit
#   at-owner   as capacity, all callers on the key's owner: the latency of
#              a check decided where it arrives, to set the leased
#              checks' beside
#
# and, for each round, which node decided the answers: the key's owner,
# or the node asked from a lease or a refusal lease
# (sluice_lease_decisions_total + sluice_lease_refused_total at each
# node's /metrics).
#
# Usage: test/hotkey.sh [SECONDS]   (default 10, 2..120)
# Environment:
#   HOTKEY_THRESHOLD  --hot-key-threshold of every node (default: the
#                     node's default); 0 turns leases off, to compare
#   HOTKEY_CPU        cores per node, e.g. 0.4 (default 0.4; 0: no cgroup)
#   HOTKEY_LIMIT      hits per second in the limited round (default 1000)
#   HOTKEY_CONC       bench callers, spread over the three nodes (default 48)
#   HOTKEY_NET        first node address (default 127.0.0.111)
#   SLUICE_BIN        a prebuilt binary (default: built from this tree)
# The nodes are stopped by PID, their cgroups removed and the temp dir
# deleted on exit, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 2 ] || [ "$secs" -gt 120 ]; then
  echo "usage: $0 [SECONDS 2..120]" >&2; exit 2
fi
cpu=${HOTKEY_CPU:-0.4}
limit=${HOTKEY_LIMIT:-1000}
conc=${HOTKEY_CONC:-48}
if ! [[ "$cpu" =~ ^[0-9]*\.?[0-9]+$ ]]; then echo "HOTKEY_CPU: want a number of cores" >&2; exit 2; fi
if ! [[ "$limit" =~ ^[0-9]+$ ]] || [ "$limit" -lt 1 ]; then echo "HOTKEY_LIMIT: want a positive whole number" >&2; exit 2; fi
if ! [[ "$conc" =~ ^[0-9]+$ ]] || [ "$conc" -lt 3 ] || [ "$conc" -gt 1000 ]; then echo "HOTKEY_CONC: want 3..1000" >&2; exit 2; fi
flags=()
if [ -n "${HOTKEY_THRESHOLD:-}" ]; then flags+=(--hot-key-threshold "$HOTKEY_THRESHOLD"); fi

. test/threenodes.sh
threenodes_setup "${HOTKEY_NET:-127.0.0.111}"
cgroups=()
hotkey_cleanup() {
  threenodes_cleanup
  for g in "${cgroups[@]}"; do rmdir "$g" 2>/dev/null || true; done
}
trap hotkey_cleanup EXIT INT TERM
node_flags() { FLAGS=(--http-addr "$(ip "$1"):18080"); }
threenodes_start hotkey "${flags[@]}"

cg=/sys/fs/cgroup/cpu
quota=$(awk -v c="$cpu" 'BEGIN {printf "%d", c * 100000}')
budget="none (cgroup v1 cpu controller not writable here)"
if [ "$quota" -gt 0 ] && [ -w "$cg" ]; then
  for i in 0 1 2; do
    g=$cg/sluice-hotkey-$$-$i
    mkdir "$g"
    cgroups+=("$g")
    echo 100000 >"$g/cpu.cfs_period_us"
    echo "$quota" >"$g/cpu.cfs_quota_us"
    echo "${pids[i]}" >"$g/cgroup.procs"
  done
  budget="$cpu core per node (cpu.cfs_quota_us $quota of 100000)"
elif [ "$quota" -eq 0 ]; then
  budget="none (HOTKEY_CPU=0)"
fi
threenodes_wait

hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
metric() { curl -fsS "http://$(ip "$1"):18080/metrics" | awk -v m="$2" '$1 == m {print $2 + 0}'; }
addrs="$(ip 1):18081,$(ip 2):18081,$(ip 3):18081"
owner=$("$bin" check --addr "$(ip 1):18081" --name bench --key key:0 --hits 0 --limit 1 --window 1s --algorithm fixed_window --json | sed -n 's/.*"owner": *"\([^"]*\)".*/\1/p')
echo "nodes: hotkey-1..3 on $(ip 1)..$(ip 3); key owner $owner; CPU budget: $budget; threshold ${HOTKEY_THRESHOLD:-default}"

round() { # NAME LIMIT [ADDRS]
  local name=$1 lim=$2 addrs=${3:-$addrs} i
  declare -a t0 d0
  local_decisions() { echo $(( $(metric "$1" sluice_lease_decisions_total) + $(metric "$1" sluice_lease_refused_total) )); }
  for i in 1 2 3; do t0[i]=$(ticks "${pids[i - 1]}"); d0[i]=$(local_decisions "$i"); done
  local ts te
  ts=$(date +%s.%N)
  "$bin" bench --addr "$addrs" --keys 1 --algorithm fixed_window --window 1s --limit "$lim" \
    --concurrency "$conc" --conns 1 --duration "${secs}s" --progress 0 --json >"$tmp/bench-$name.json"
  local j checks allowed cps p50 p99 errs
  te=$(date +%s.%N)
  j=$(cat "$tmp/bench-$name.json")
  field() { echo "$j" | sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p"; }
  checks=$(field checks); allowed=$(field allowed); cps=$(field checks_per_sec)
  p50=$(field p50_us); p99=$(field p99_us); errs=$(( $(field call_errors) + $(field item_errors) ))
  local leased=0 cpu_total=0 line=""
  for i in 1 2 3; do
    local t d
    t=$(( $(ticks "${pids[i - 1]}") - t0[i] ))
    d=$(( $(local_decisions "$i") - d0[i] ))
    leased=$((leased + d)); cpu_total=$((cpu_total + t))
    local role=other; [ "hotkey-$i" = "$owner" ] && role=owner
    line+=$(awk -v n="hotkey-$i" -v r="$role" -v t="$t" -v hz="$hz" -v s="$secs" -v d="$d" \
      'BEGIN {printf "    %s (%s): CPU %.0f%% of a core, %d checks decided from leases\n", n, r, 100 * t / hz / s, d}')$'\n'
  done
  awk -v n="$name" -v c="$checks" -v a="$allowed" -v cps="$cps" -v p50="$p50" -v p99="$p99" -v e="$errs" \
    -v cpu="$cpu_total" -v hz="$hz" -v l="$leased" -v lim="$lim" -v s="$secs" -v ts="$ts" -v te="$te" 'BEGIN {
      printf "%-9s %8.0f checks/s  p50 %6.0f us  p99 %7.0f us  errors %d  server CPU %6.1f us/check  decided from leases %5.1f%%", n, cps, p50, p99, e, 1e6 * cpu / hz / c, 100 * l / c
      # The run touches the 1-s windows from the one it started in to the
      # one it ended in: at most that many times the limit.
      w = int(te) - int(ts) + 1
      if (lim < 1e12) printf "  admitted %d in %d windows touched (at most %d), %.1f%% of the limit over the run", a, w, w * lim, 100 * a / s / lim
      printf "\n" }'
  printf '%s' "$line"
}
round capacity 1099511627776
round limited "$limit"
round at-owner 1099511627776 "$(ip "${owner##*-}"):18081"
