#!/usr/bin/env bash
# Side by side: a 3-node Sluice cluster built from this tree, and optionally a
# peer cluster someone started by hand (gubernator, or envoyproxy/ratelimit +
# Redis), driven by the same outside load tool (ghz) in alternating rounds
# through one node each, on 10k keys. Every server process's CPU time
# (/proc/PID/stat utime + stime) and RSS (/proc/PID/status VmRSS) is read
# before and after each round; one table is printed at the end with checks/s,
# p50/p99, server CPU per check and, with a peer, the ratios Sluice / peer.
#
# Usage: test/compare.sh [SECONDS_PER_ROUND]   (default 10, 2..120)
# Rounds (each SECONDS long, Sluice and the peer alternating, the order
# swapped every repetition):
#   single      1 check per call, closed loop, COMPARE_CONC callers
#   single@1k   1 check per call at 1,000 calls/s offered
#   single@3k   1 check per call at 3,000 calls/s offered
#   single@10k  1 check per call at 10,000 calls/s offered
#   batch100    100 checks per call, closed loop
#   batch100@150  100 checks per call at 150 calls/s offered (15,000 checks/s)
# Environment:
#   COMPARE_REPS    repetitions of the whole set (default 1, at most 5)
#   COMPARE_ROUNDS  the rounds to run, space-separated names from the list
#                   above (default: all)
#   COMPARE_CONC    ghz workers (default 50); COMPARE_CONNS connections (1)
#   COMPARE_TIMEOUT each call's deadline, sent to the servers (default 5s)
#   COMPARE_NET     first node address; nodes on it and the next two
#                   (default 127.0.0.71)
#   COMPARE_PPROF   a directory: CPU profiles of the three Sluice nodes
#                   during every single@3k round (nodes run with --pprof),
#                   named nodeN-repR.pprof, or during the rounds named in
#   COMPARE_PPROF_ROUNDS (default single@3k); a round other than single@3k
#                   names its files nodeN-ROUND-repR.pprof
#   SLUICE_BIN      a prebuilt sluice binary (default: built from this tree)
#   SLUICE_ARGS     extra flags for every Sluice node
#   SLUICE_ENV      NAME=VALUE pairs for the Sluice nodes' environment only
#                   (e.g. GOMAXPROCS=1)
#   GHZ             the ghz binary (default: GOPATH/bin/ghz, installed at
#                   the pinned version below when absent)
# A peer (all of PEER_ADDR, PEER_PIDS and the proto are needed):
#   PEER_NAME       label in the table (default: PEER_KIND)
#   PEER_KIND       gubernator | envoy | sluice: the request shape (sluice:
#                   another Sluice build started by hand, to compare two
#                   builds or settings in the same minutes)
#   PEER_ADDR       host:port of the peer's gRPC API on its node 1
#   PEER_PIDS       the peer's server process ids, space-separated (all of
#                   them: for envoy ratelimit include redis-server)
#   PEER_PROTO      the peer's .proto file (ghz compiles it; default for
#                   sluice: this tree's), or
#   PEER_PROTOSET   a compiled protoset (protoc --include_imports -o)
#   PEER_IMPORT_PATHS  comma-separated import paths for PEER_PROTO
#   PEER_CALL       the method (default per kind: pb.gubernator.V1.GetRateLimits,
#                   envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit)
#   PEER_DOMAIN     envoy only: the domain (default "bench"); every
#                   descriptor is {"key": "bench", "value": KEY}, so the
#                   peer's config needs a limit for key "bench"
# Every check is a token bucket (both systems' common algorithm) of limit
# 2^40 per minute: all are allowed, so both do the same work per check.
# Nothing is left behind: the nodes are stopped by PID and the temp dir is
# removed on exit, also on failure. The peer is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
GHZ_VERSION=v0.93.0 # the newest ghz on the Go module proxy

secs=${1:-10}
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 2 ] || [ "$secs" -gt 120 ]; then
  echo "usage: $0 [SECONDS_PER_ROUND 2..120] (got '$secs')" >&2; exit 2
fi
reps=${COMPARE_REPS:-1}
if ! [[ "$reps" =~ ^[0-9]+$ ]] || [ "$reps" -lt 1 ] || [ "$reps" -gt 5 ]; then
  echo "$0: COMPARE_REPS must be 1..5 (got '$reps')" >&2; exit 2
fi
conc=${COMPARE_CONC:-50}; conns=${COMPARE_CONNS:-1}
for v in conc conns; do
  if ! [[ "${!v}" =~ ^[0-9]+$ ]] || [ "${!v}" -lt 1 ] || [ "${!v}" -gt 1000 ]; then
    echo "$0: COMPARE_${v^^} must be 1..1000 (got '${!v}')" >&2; exit 2
  fi
done
all_rounds="single single@1k single@3k single@10k batch100 batch100@150"
rounds=${COMPARE_ROUNDS:-$all_rounds}
for r in $rounds; do
  [[ " $all_rounds " == *" $r "* ]] || { echo "$0: COMPARE_ROUNDS: unknown round '$r' (known: $all_rounds)" >&2; exit 2; }
done
timeout=${COMPARE_TIMEOUT:-5s}
[[ "$timeout" =~ ^[0-9]+(ms|s)$ ]] || { echo "$0: COMPARE_TIMEOUT must look like 200ms or 5s (got '$timeout')" >&2; exit 2; }
command -v jq >/dev/null || { echo "$0: needs jq (apt-get install jq) to read ghz's JSON reports" >&2; exit 2; }

peer=${PEER_ADDR:+yes}
if [ -n "$peer" ]; then
  kind=${PEER_KIND:-}
  case "$kind" in
    gubernator) peer_call=${PEER_CALL:-pb.gubernator.V1.GetRateLimits} ;;
    envoy) peer_call=${PEER_CALL:-envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit} ;;
    sluice) peer_call=${PEER_CALL:-sluice.v1.RateLimiter.Check}; PEER_PROTO=${PEER_PROTO:-proto/sluice/v1/sluice.proto} ;;
    *) echo "$0: PEER_KIND must be gubernator, envoy or sluice (got '$kind')" >&2; exit 2 ;;
  esac
  peer_name=${PEER_NAME:-$kind}
  read -r -a peer_pids <<<"${PEER_PIDS:-}"
  [ "${#peer_pids[@]}" -gt 0 ] || { echo "$0: PEER_PIDS: give the peer's server process ids" >&2; exit 2; }
  for p in "${peer_pids[@]}"; do
    [[ "$p" =~ ^[0-9]+$ ]] && [ -r "/proc/$p/stat" ] || { echo "$0: PEER_PIDS: '$p' is not a running process" >&2; exit 2; }
  done
  peer_desc=()
  if [ -n "${PEER_PROTO:-}" ]; then
    [ -r "$PEER_PROTO" ] || { echo "$0: PEER_PROTO: cannot read '$PEER_PROTO'" >&2; exit 2; }
    peer_desc=(--proto "$PEER_PROTO")
    [ -n "${PEER_IMPORT_PATHS:-}" ] && peer_desc+=(--import-paths "$PEER_IMPORT_PATHS")
  elif [ -n "${PEER_PROTOSET:-}" ]; then
    [ -r "$PEER_PROTOSET" ] || { echo "$0: PEER_PROTOSET: cannot read '$PEER_PROTOSET'" >&2; exit 2; }
    peer_desc=(--protoset "$PEER_PROTOSET")
  else
    echo "$0: a peer needs PEER_PROTO or PEER_PROTOSET (ghz cannot use reflection on every peer)" >&2; exit 2
  fi
fi

ghz=${GHZ:-$(go env GOPATH)/bin/ghz}
if ! [ -x "$ghz" ]; then
  echo "installing ghz $GHZ_VERSION into $(go env GOPATH)/bin" >&2
  go install "github.com/bojand/ghz/cmd/ghz@$GHZ_VERSION"
fi

. test/threenodes.sh # the working directory is the repository
threenodes_setup "${COMPARE_NET:-127.0.0.71}"
pprof_dir=${COMPARE_PPROF:-}
if [ -n "$pprof_dir" ]; then
  mkdir -p "$pprof_dir"
  node_flags() { FLAGS=(--http-addr "$(ip "$1"):18080" --pprof); }
fi
read -r -a senv <<<"${SLUICE_ENV:-}"
for kv in "${senv[@]}"; do
  [[ "$kv" =~ ^[A-Z_][A-Z0-9_]*=.*$ ]] || { echo "$0: SLUICE_ENV: '$kv' is not NAME=VALUE" >&2; exit 2; }
  export "${kv?}"
done
# shellcheck disable=SC2086 # SLUICE_ARGS is a list of flags
threenodes_start cmp ${SLUICE_ARGS:-}
for kv in "${senv[@]}"; do unset "${kv%%=*}"; done
threenodes_wait
sluice_addr="$(ip 1):18081"

# ghz's proto parser (v0.93.0) refuses proto3 `optional` labels, which are
# wire-compatible with plain fields: it gets copies without them.
unoptional() { sed -E 's/^([[:space:]]*)optional[[:space:]]+/\1/' "$1" >"$2"; }
mkdir -p "$tmp/proto/sluice/v1" "$tmp/peerproto"
unoptional proto/sluice/v1/sluice.proto "$tmp/proto/sluice/v1/sluice.proto"
if [ -n "$peer" ] && [ -n "${PEER_PROTO:-}" ]; then
  unoptional "$PEER_PROTO" "$tmp/peerproto/$(basename "$PEER_PROTO")"
  peer_desc=(--proto "$tmp/peerproto/$(basename "$PEER_PROTO")" --import-paths "$(dirname "$PEER_PROTO")${PEER_IMPORT_PATHS:+,$PEER_IMPORT_PATHS}")
fi

# Call data: JSON arrays that ghz sends round-robin, one message per call,
# covering keys k0..k9999 once per pass.
keys=10000
mkdata() { # SYSTEM BATCH FILE
  awk -v sys="$1" -v b="$2" -v n="$keys" -v dom="${PEER_DOMAIN:-bench}" 'BEGIN {
    printf "["
    for (m = 0; m < n / b; m++) {
      if (m) printf ","
      if (sys == "envoy") printf "{\"domain\":\"%s\",\"hits_addend\":1,\"descriptors\":[", dom
      else printf "{\"requests\":["
      for (j = 0; j < b; j++) {
        k = m * b + j
        if (j) printf ","
        if (sys == "sluice") printf "{\"name\":\"bench\",\"key\":\"k%d\",\"hits\":1,\"limit\":1099511627776,\"window_ms\":60000,\"algorithm\":\"ALGORITHM_TOKEN_BUCKET\"}", k
        else if (sys == "gubernator") printf "{\"name\":\"bench\",\"unique_key\":\"k%d\",\"hits\":1,\"limit\":1099511627776,\"duration\":60000,\"algorithm\":\"TOKEN_BUCKET\"}", k
        else printf "{\"entries\":[{\"key\":\"bench\",\"value\":\"k%d\"}]}", k
      }
      printf "]}"
    }
    printf "]\n"
  }' >"$3"
}
for b in 1 100; do
  mkdata sluice "$b" "$tmp/sluice-$b.json"
  [ -n "$peer" ] && mkdata "$kind" "$b" "$tmp/peer-$b.json"
done

# For cluster.Config.MoveWindow (30 s) after the last join, a node's first
# check of a key pulls it from the key's previous owner: a start-up cost, not
# the steady state measured here. Waiting it out idle is no good either: a
# node without a check for --heartbeat-idle (30 s) takes its next check for
# the end of a pause and pulls every key it owns once more, for another
# move window (docs/guarantees.md, "pause"). So a warm-up touches all the
# keys at 400 checks/s for 32 s, past the window, and the rounds follow at
# once. Between two of its rounds Sluice idles while the peer's round runs:
# keep rounds under 30 s to keep that idle gap under --heartbeat-idle.
echo "warming up: every key at 400 checks/s for 32 s, past the move window after the joins" >&2
"$ghz" --insecure -c 4 --rps 400 -z 32s --duration-stop ignore -t 5s -O json -o "$tmp/warmup.json" \
  --proto "$tmp/proto/sluice/v1/sluice.proto" --import-paths "$tmp/proto" --call sluice.v1.RateLimiter.Check \
  -D "$tmp/sluice-1.json" "$sluice_addr" 2>"$tmp/warmup.err" || { echo "warm-up failed:" >&2; cat "$tmp/warmup.err" >&2; exit 1; }

hz=$(getconf CLK_TCK)
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
rss_kb() { local r=0 p; for p in "$@"; do r=$((r + $(awk '/^VmRSS:/ {print $2}' "/proc/$p/status"))); done; echo "$r"; }
alive() { local p; for p in "$@"; do [ -r "/proc/$p/stat" ] || { echo "$0: server process $p is gone" >&2; exit 1; }; done; }

# One round: SYSTEM ROUND REP. Appends a line to $tmp/results:
# round system rep checks/s p50_ms p99_ms errors cpu_us_per_check rss_mb rss_delta_mb client_cpu_s
run_round() {
  local sys=$1 round=$2 rep=$3 batch=1 rps=0 args=() srv=() t0 t1 r0 r1 out prof=()
  case "$round" in
    single) ;; single@1k) rps=1000 ;; single@3k) rps=3000 ;; single@10k) rps=10000 ;;
    batch100) batch=100 ;; batch100@150) batch=100; rps=150 ;;
  esac
  if [ "$sys" = sluice ]; then
    srv=("${pids[@]}")
    args=(--proto "$tmp/proto/sluice/v1/sluice.proto" --import-paths "$tmp/proto" --call sluice.v1.RateLimiter.Check
      -D "$tmp/sluice-$batch.json" "$sluice_addr")
  else
    srv=("${peer_pids[@]}")
    args=("${peer_desc[@]}" --call "$peer_call" -D "$tmp/peer-$batch.json" "$PEER_ADDR")
  fi
  [ "$rps" -gt 0 ] && args+=(--rps "$rps")
  alive "${srv[@]}"
  out="$tmp/ghz-$sys-$round-$rep.json"
  if [ "$sys" = sluice ] && [ -n "$pprof_dir" ] && [[ " ${COMPARE_PPROF_ROUNDS:-single@3k} " == *" $round "* ]]; then
    local tag=""; [ "$round" = single@3k ] || tag="-$round"
    local i
    for i in 1 2 3; do
      curl -fsS -o "$pprof_dir/node$i$tag-rep$rep.pprof" "http://$(ip "$i"):18080/debug/pprof/profile?seconds=$((secs - 1))" &
      prof+=($!)
    done
  fi
  t0=$(cpu_ticks "${srv[@]}"); r0=$(rss_kb "${srv[@]}")
  local c0 c1
  c0=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat) # this shell's reaped children
  "$ghz" --insecure -c "$conc" --connections "$conns" -z "${secs}s" --duration-stop ignore \
    -t "$timeout" -O json -o "$out" "${args[@]}" 2>"$out.err" || { echo "ghz failed ($sys $round):" >&2; cat "$out.err" >&2; exit 1; }
  t1=$(cpu_ticks "${srv[@]}"); r1=$(rss_kb "${srv[@]}")
  c1=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
  local p; for p in "${prof[@]}"; do wait "$p" || echo "a CPU profile failed" >&2; done
  jq -r --arg sys "$sys" --arg round "$round" --arg rep "$rep" --argjson b "$batch" \
    --argjson dt "$((t1 - t0))" --argjson hz "$hz" --argjson r0 "$r0" --argjson r1 "$r1" --argjson dc "$((c1 - c0))" '
    (.statusCodeDistribution.OK // 0) as $ok
    | ($ok * $b) as $checks
    | (.total / 1e9) as $secs
    | ([.latencyDistribution[]? | select(.percentage == 50) | .latency][0] // 0) as $p50
    | ([.latencyDistribution[]? | select(.percentage == 99) | .latency][0] // 0) as $p99
    | ([.statusCodeDistribution | to_entries[] | select(.key != "OK") | .value] | add // 0) as $errs
    | [$round, $sys, $rep, ($checks / $secs), ($p50 / 1e6), ($p99 / 1e6), $errs,
       (if $checks > 0 then $dt / $hz * 1e6 / $checks else 0 end),
       ($r1 / 1024), (($r1 - $r0) / 1024), ($dc / $hz)] | @tsv' "$out" >>"$tmp/results"
  tail -n 1 "$tmp/results" | awk -F'\t' '{printf "  %-13s %-11s rep %s: %8.0f checks/s  p50 %6.2f ms  p99 %6.2f ms  errors %d  server CPU %6.1f us/check  RSS %6.1f MB (%+.1f)  ghz CPU %.1f s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11}' >&2
}

systems=(sluice)
[ -n "$peer" ] && systems+=(peer)
echo "rounds of ${secs}s, $reps repetition(s), $conc ghz workers on $conns connection(s), deadline $timeout, $keys keys; Sluice on $sluice_addr${peer:+, $peer_name on $PEER_ADDR}" >&2
: >"$tmp/results"
for rep in $(seq 1 "$reps"); do
  for round in $rounds; do
    order=("${systems[@]}")
    if [ -n "$peer" ] && [ $((rep % 2)) = 0 ]; then order=(peer sluice); fi
    for sys in "${order[@]}"; do run_round "$sys" "$round" "$rep"; done
  done
done

# The table: one row per round and system (min–max over repetitions when
# there are several), then Sluice / peer for checks/s and CPU per check.
echo
echo "| round | system | checks/s | p50 ms | p99 ms | errors | server CPU µs/check | server RSS MB (Δ) |"
echo "|---|---|---|---|---|---|---|---|"
for round in $rounds; do
  for sys in "${systems[@]}"; do
    label=Sluice; [ "$sys" = peer ] && label=$peer_name
    awk -F'\t' -v r="$round" -v s="$sys" -v l="$label" '
      function span(lo, hi, f) { return (sprintf(f, lo) == sprintf(f, hi)) ? sprintf(f, lo) : sprintf(f "–" f, lo, hi) }
      $1 == r && $2 == s {
        n++
        for (i = 4; i <= 10; i++) { if (n == 1 || $i < lo[i]) lo[i] = $i; if (n == 1 || $i > hi[i]) hi[i] = $i }
      }
      END { if (n) printf "| %s | %s | %s | %s | %s | %s | %s | %s (%s) |\n", r, l, span(lo[4], hi[4], "%.0f"), span(lo[5], hi[5], "%.2f"),
        span(lo[6], hi[6], "%.2f"), span(lo[7], hi[7], "%d"), span(lo[8], hi[8], "%.1f"), span(lo[9], hi[9], "%.0f"), span(lo[10], hi[10], "%+.1f") }' "$tmp/results"
  done
done
if [ -n "$peer" ]; then
  echo
  echo "| round | checks/s Sluice / $peer_name | server CPU per check Sluice / $peer_name |"
  echo "|---|---|---|"
  for round in $rounds; do
    awk -F'\t' -v r="$round" '
      $1 == r && $2 == "sluice" { sc += $4; su += $8; ns++ }
      $1 == r && $2 == "peer" { pc += $4; pu += $8; np++ }
      END { if (ns && np && pc > 0 && pu > 0) printf "| %s | %.2f | %.2f |\n", r, (sc / ns) / (pc / np), (su / ns) / (pu / np) }' "$tmp/results"
  done
fi
echo
echo "server CPU: utime + stime of every server process over the round (/proc/PID/stat, ${hz} ticks/s), divided by the checks answered OK; ratios use the means over repetitions"
