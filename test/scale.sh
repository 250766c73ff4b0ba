#!/usr/bin/env bash
# Cluster formation and idle behaviour at scale: N real `sluice serve`
# processes on this machine, node i on its own loopback address NET.i with
# the default ports (gRPC 8081, HTTP 8080, gossip 7946), started
# SCALE_STAGGER apart, nodes 2..N joining NET.1 (and NET.2).
#
# Usage: test/scale.sh N [STABLE_SECONDS]   (N 1..150; STABLE 1..900, default 60)
# Environment:
#   SLUICE_BIN       a prebuilt binary (default: go build ./cmd/sluice into the temp dir)
#   SCALE_STAGGER    seconds between node starts (default 0.1)
#   SCALE_NET        first three octets of the node addresses, 127.x.y (default 127.0.3)
#   SCALE_ARGS       extra flags for every node (e.g. "--heartbeat-idle 0")
#   SCALE_SETTLE     seconds between formation and the stable window (default 35:
#                    a node beats its pause heartbeat for --heartbeat-idle, 30 s,
#                    after its last check, and idle means after that)
#   SCALE_LOAD_RATE  checks/s of an outside load phase after the stable window,
#                    STABLE seconds long (default 0: no load phase)
#   SCALE_LOAD_BATCH checks per call of that load (default 1)
#   SCALE_EVENTS     membership events to measure after the stable window (default 0):
#                    node N+1 joins, and 8 s later leaves (SIGTERM), this many times;
#                    the N nodes' CPU in the 8 s after each, less their idle CPU
#   SCALE_HOG_SECS   seconds of an overload phase after the others (default 0: none):
#                    a busy loop on every core while a paced load of SCALE_HOG_RATE
#                    checks/s (default 200) runs, with 10 s of that load before and
#                    20 s after
#   SCALE_KEEP       non-empty: keep the temp dir (logs log-I, metrics scrapes)
#
# Phases:
#   start      node 1, until its /healthz answers; then nodes 2..N, SCALE_STAGGER apart.
#   formation  from the last start until every node reports N members alive
#              (sluice_members_alive of GET /metrics, every max(0.2, N/50) s,
#              16 scrapes at a time; 120 s at most). Not `sluice status`: it
#              asks every alive member for its figures, so one poll round of N
#              nodes is N² gRPC calls on N² new connections (at N=100 and 2 s,
#              5000 loopback connections a second left in TIME_WAIT).
#   stable     STABLE seconds with no traffic and no polling: each node's CPU
#              (/proc/PID/stat utime+stime), RSS (/proc/PID/status VmRSS)
#              and its own part, RssAnon (RSS less the binary's file pages,
#              which every node on this machine shares, and which a node
#              alone on its host holds once), and the machine's CPU (/proc/stat) at the start and the end.
#   load       (SCALE_LOAD_RATE > 0) STABLE seconds of `sluice bench` from
#              outside. bench has no rate option and is a closed loop whose
#              caller w only ever calls address w of --addr, so the load is paced
#              in 1 s slots: each slot one bench run with --calls RATE/BATCH
#              (rounded), --concurrency C = ceil(calls/200) (at most N; each
#              caller makes ~200 calls, so its first call, which opens the
#              connection, stays out of p99) and --addr the next C nodes in
#              turn, so every node is an entry node over the phase; the
#              slot's rest is idle. Within a slot the C callers run flat out:
#              the latency figures are those of C callers in a closed loop
#              (per slot: the median and the max over the slots), not of an
#              even RATE. Checks go to any node (forwarded to the key's
#              owner); keys at random out of 10000, limits that admit all.
#              The generator's CPU is this script's reaped children's CPU
#              over the phase (bench processes and a few sleeps).
#   stop       SIGTERM to every node, 30 s to stop, then SIGKILL.
# Instability in each phase, as the difference of the counters the nodes
# export (summed over the nodes) between the scrape before and after the
# phase, and as lines in the nodes' logs (kept at the info level) written in
# the phase: members declared dead (sluice_membership_changes_total
# {event="fail"}, memberlist's "Marking X as failed"), suspicions
# ("Suspect X has failed"), refuted suspicions, pauses (sluice_pauses_total,
# "did not run for longer than the forward timeout"; by cause when the
# binary exports sluice_pause_causes_total), rejoins, idle resumes, pulls,
# and the rounds of questions after pauses by result (when the binary
# exports sluice_pause_queries_total).
# The criterion: no member declared dead and no pause in the stable window,
# every node still running; the script exits 1 when it is not met.
#
# Prints progress on stderr; on stdout the node log lines at warn and error
# (and memberlist's) by message and phase, then key=value lines and last
# `scale: N=… formed_s=… idle_cpu_ms_s_mean=… idle_cpu_ms_s_max=…
# rss_mb_mean=… rss_mb_max=… stable_failures=… stable_pauses=…`.
# Every process it starts is stopped by PID on exit, also on failure and
# Ctrl-C (a second Ctrl-C skips the graceful stop).
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

usage() {
  echo "usage: $0 N [STABLE_SECONDS]   (N 1..150, STABLE 1..900, default 60)" >&2
  exit 2
}
n=${1:-}
stable=${2:-60}
if ! [[ "$n" =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 150 ]; then usage; fi
if ! [[ "$stable" =~ ^[0-9]+$ ]] || [ "$stable" -lt 1 ] || [ "$stable" -gt 900 ]; then usage; fi
[ $# -le 2 ] || usage
stagger=${SCALE_STAGGER:-0.1}
net=${SCALE_NET:-127.0.3}
rate=${SCALE_LOAD_RATE:-0}
batch=${SCALE_LOAD_BATCH:-1}
settle=${SCALE_SETTLE:-35}
hog=${SCALE_HOG_SECS:-0}
events=${SCALE_EVENTS:-0}
hog_rate=${SCALE_HOG_RATE:-200}
keep=${SCALE_KEEP:-}
read -r -a extra <<<"${SCALE_ARGS:-}"
if ! [[ "$stagger" =~ ^[0-9]+(\.[0-9]+)?$ ]] || [ "${stagger%%.*}" -ge 10 ]; then
  echo "SCALE_STAGGER: want seconds below 10 (e.g. 0.1)" >&2; exit 2
fi
octet='(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])'
if ! [[ "$net" =~ ^127\.$octet\.$octet$ ]]; then
  echo "SCALE_NET: want the first three octets of a loopback address, 127.X.Y" >&2; exit 2
fi
if ! [[ "$rate" =~ ^[0-9]+$ ]] || [ "$rate" -gt 10000000 ]; then
  echo "SCALE_LOAD_RATE: want checks per second, 0..10000000" >&2; exit 2
fi
if ! [[ "$batch" =~ ^[0-9]+$ ]] || [ "$batch" -lt 1 ] || [ "$batch" -gt 1000 ]; then
  echo "SCALE_LOAD_BATCH: want 1..1000" >&2; exit 2
fi
if ! [[ "$settle" =~ ^[0-9]+$ ]] || [ "$settle" -gt 900 ]; then
  echo "SCALE_SETTLE: want 0..900 seconds" >&2; exit 2
fi
if ! [[ "$events" =~ ^[0-9]+$ ]] || [ "$events" -gt 50 ]; then
  echo "SCALE_EVENTS: want 0..50" >&2; exit 2
fi
if ! [[ "$hog" =~ ^[0-9]+$ ]] || [ "$hog" -gt 600 ]; then
  echo "SCALE_HOG_SECS: want 0..600 seconds" >&2; exit 2
fi
if ! [[ "$hog_rate" =~ ^[0-9]+$ ]] || [ "$hog_rate" -lt 1 ] || [ "$hog_rate" -gt 100000 ]; then
  echo "SCALE_HOG_RATE: want 1..100000 checks/s" >&2; exit 2
fi
for tool in curl awk stat getconf; do
  command -v "$tool" >/dev/null || { echo "$0: needs $tool" >&2; exit 2; }
done

hz=$(getconf CLK_TCK)
now_us() { local t=$EPOCHREALTIME; NOW=$((10#${t/./})); } # sets NOW, µs
fmt_s() { printf '%d.%02d' $(($1 / 1000000)) $(($1 % 1000000 / 10000)); } # µs as seconds
now_us; t_begin=$NOW
say() { now_us; printf '[scale +%ss] %s\n' "$(fmt_s $((NOW - t_begin)))" "$*" >&2; }

# Nothing may listen on the ports the nodes bind (another run, another
# cluster on the same SCALE_NET, a wildcard listener on a default port).
if command -v ss >/dev/null; then
  busy=$(ss -Hlntu 2>/dev/null | awk -v net="$net" -v n="$n" '
    { a = $5; port = a; sub(/.*:/, "", port); host = a; sub(/:[^:]*$/, "", host); sub(/%.*/, "", host)
      if (port != "8080" && port != "8081" && port != "7946") next
      if (host == "0.0.0.0" || host == "*" || host == "[::]") { print a; next }
      if (index(host, net ".") == 1) { last = substr(host, length(net) + 2); if (last ~ /^[0-9]+$/ && last + 0 >= 1 && last + 0 <= n) print a } }' |
    sort -u | head -n 5 | tr '\n' ' ')
  [ -z "$busy" ] || { echo "$0: ports in use: $busy(another run? set SCALE_NET)" >&2; exit 1; }
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sluice-scale.XXXXXX")
declare -a pids=() # pids[i]: node i
spid=""            # the sleep of nap, while it runs
hogs=()            # the busy loops of the overload phase, while they run
hurry=0
summary=()
put() { summary+=("$1=$2"); } # a key=value line of the summary

# is_running PID: the process exists and is not a zombie (one of ours that
# exited and was not waited for yet).
is_running() {
  local line
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
  line=${line##*) }
  [ "${line%% *}" != Z ]
}

# nap SECONDS: a sleep a trapped signal interrupts.
nap() {
  sleep "$1" &
  spid=$!
  wait "$spid" || true
  spid=""
}

# nap_until US: nap until the time NOW (µs) reaches US, if it is ahead.
nap_until() {
  now_us
  if [ "$1" -gt "$NOW" ]; then nap "$(printf '%d.%06d' $((($1 - NOW) / 1000000)) $((($1 - NOW) % 1000000)))"; fi
}

# stop_nodes SECONDS: SIGTERM to every node, SIGKILL to those still
# running after SECONDS (or at once after a second Ctrl-C); waits for all.
# Sets stopped_us and killed.
stop_nodes() {
  local p deadline left
  killed=0
  now_us; local t0=$NOW
  deadline=$((NOW + $1 * 1000000))
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  while :; do
    left=0
    for p in "${pids[@]}"; do is_running "$p" && { left=1; break; }; done
    now_us
    if [ "$left" = 0 ] || [ "$NOW" -ge "$deadline" ] || [ "$hurry" = 1 ]; then break; fi
    sleep 0.1 || true
  done
  for p in "${pids[@]}"; do
    if is_running "$p"; then kill -KILL "$p" 2>/dev/null || true; killed=$((killed + 1)); fi
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  now_us; stopped_us=$((NOW - t0))
  pids=()
}

# stop_hogs: ends the overload phase's busy loops, if running.
stop_hogs() {
  local p
  for p in "${hogs[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${hogs[@]}"; do wait "$p" 2>/dev/null || true; done
  hogs=()
}

cleanup() {
  local rc=$?
  set +e # a sleep a second Ctrl-C interrupts must not end the cleanup
  trap 'hurry=1' INT TERM
  if [ -n "$spid" ]; then kill "$spid" 2>/dev/null || true; fi
  stop_hogs
  if [ "${#pids[@]}" -gt 0 ]; then
    say "stopping ${#pids[@]} nodes"
    stop_nodes 30
    [ "$killed" = 0 ] || say "$killed nodes still running after SIGTERM (30 s, or a second Ctrl-C): killed"
  fi
  if [ -n "$keep" ]; then
    say "kept $tmp"
  else
    if [ "$rc" != 0 ] && [ -e "$tmp/log-1" ]; then say "logs removed with $tmp (SCALE_KEEP=1 keeps them)"; fi
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  say "FAIL: $*"
  exit 1
}

bin=${SLUICE_BIN:-}
if [ -z "$bin" ]; then
  say "building ./cmd/sluice"
  bin=$tmp/sluice
  go build -o "$bin" ./cmd/sluice
fi
[ -x "$bin" ] || { echo "$0: SLUICE_BIN=$bin is not an executable" >&2; exit 2; }

logs=()
for ((i = 1; i <= n; i++)); do logs+=("$tmp/log-$i"); done

# scrape DIR: GET /metrics of every node into DIR/I, 16 at a time, 5 s each;
# a node that does not answer leaves no file.
scrape() {
  local dir=$1 i args=()
  rm -rf "$dir"
  mkdir -p "$dir"
  for ((i = 1; i <= n; i++)); do args+=(-o "$dir/$i" "http://$net.$i:8080/metrics"); done
  curl -sf --parallel --parallel-max 16 -m 5 "${args[@]}" 2>/dev/null || true
}

# metrics DIR: the series of the scrapes in DIR summed over the nodes, one
# "SERIES<TAB>SUM" a line (and each metric name's sum over its labels), plus
# scraped (nodes that answered), alive_min, alive_max, ready (nodes with
# sluice_ready 1), goroutines_mean, goroutines_max. Into DIR.sum.
metrics() {
  awk -v dir="$1" -v n="$n" 'BEGIN {
    OFS = "\t"; amin = -1; amax = -1
    for (i = 1; i <= n; i++) {
      f = dir "/" i; got = 0
      while ((getline line < f) > 0) {
        if (line ~ /^#/ || line == "") continue
        k = line; sub(/ [^ ]*$/, "", k); v = line; sub(/.* /, "", v); v += 0
        s[k] += v
        name = k; sub(/\{.*/, "", name); if (name != k) s[name] += v
        if (k == "sluice_members_alive") { got = 1; if (amin < 0 || v < amin) amin = v; if (v > amax) amax = v }
        if (k == "sluice_ready" && v == 1) ready++
        if (k == "go_goroutines") { gsum += v; if (v > gmax) gmax = v }
      }
      close(f)
      if (got) scraped++
    }
    for (k in s) printf "%s\t%.17g\n", k, s[k]
    print "scraped", scraped + 0; print "alive_min", amin; print "alive_max", amax; print "ready", ready + 0
    printf "goroutines_mean\t%.0f\n", scraped ? gsum / scraped : 0; print "goroutines_max", gmax + 0
  }' >"$1.sum"
}

# mval DIR KEY: KEY of DIR.sum (0 when absent).
mval() { awk -F'\t' -v k="$2" '$1 == k { v = $2 } END { printf "%.0f\n", v + 0 }' "$1.sum"; }
# mdelta DIR0 DIR1 KEY: the growth of KEY from DIR0 to DIR1.
mdelta() { echo $(($(mval "$2" "$3") - $(mval "$1" "$3"))); }

# alive_counts DIR: "I ALIVE" for every node, -1 for no answer.
alive_counts() {
  awk -v dir="$1" -v n="$n" 'BEGIN {
    for (i = 1; i <= n; i++) {
      f = dir "/" i; v = -1
      while ((getline line < f) > 0) if (line ~ /^sluice_members_alive /) { v = line; sub(/.* /, "", v); v += 0 }
      close(f); print i, v
    } }'
}

# sample FILE: "I TICKS RSS_KB ANON_KB" of every node ("I - - -" for one not
# running; ANON is RssAnon, the node's own memory: RSS less the pages of the
# binary, which every node on one machine shares),
# then "machine BUSY TOTAL" from /proc/stat and "time US".
sample() {
  local i p line f rss anon k v _ us ni sy id io irq si st
  {
    for ((i = 1; i <= n; i++)); do
      p=${pids[i]}
      if ! is_running "$p" || ! { read -r line <"/proc/$p/stat"; } 2>/dev/null; then echo "$i - - -"; continue; fi
      read -r -a f <<<"${line##*) }" # f[0] is field 3 (state): utime is f[11], stime f[12]
      rss=0 anon=0
      while read -r k v _; do
        case $k in VmRSS:) rss=$v ;; RssAnon:) anon=$v; break ;; esac
      done <"/proc/$p/status"
      echo "$i $((f[11] + f[12])) $rss $anon"
    done
    read -r _ us ni sy id io irq si st _ </proc/stat
    echo "machine $((us + ni + sy + irq + si + st)) $((us + ni + sy + id + io + irq + si + st))"
    now_us
    echo "time $NOW"
  } >"$1"
}

# cpu_stats FILE0 FILE1: "CPU_MS_S_MEAN CPU_MS_S_MAX CPU_MS_S_TOTAL RSS_MB_MEAN
# RSS_MB_MAX RSS0_MB_MEAN MACHINE_BUSY_PCT SECONDS GONE ANON_MB_MEAN ANON_MB_MAX"
# between two samples (RSS and ANON at the second).
cpu_stats() {
  awk -v hz="$hz" '
    NR == FNR { a[$1] = $2; r0[$1] = $3; next }
    $1 == "time" { secs = ($2 - a["time"]) / 1e6; next }
    $1 == "machine" { busy = $2 - a["machine"]; tot = $3 - r0["machine"]; next }
    $2 == "-" || a[$1] == "-" { gone++; next }
    { t[$1] = $2 - a[$1]; rss = $3 / 1024; rsum += rss; if (rss > rmax) rmax = rss; r0sum += r0[$1] / 1024; k++
      an = $4 / 1024; asum += an; if (an > amax) amax = an }
    END {
      for (i in t) { ms = t[i] * 1000 / hz / secs; sum += ms; if (ms > max) max = ms }
      printf "%.2f %.2f %.1f %.1f %.1f %.1f %.1f %.1f %d %.1f %.1f\n", k ? sum / k : 0, max, sum, k ? rsum / k : 0, rmax, k ? r0sum / k : 0,
        tot ? 100 * busy / tot : 0, secs, gone + 0, k ? asum / k : 0, amax
    }' "$1" "$2"
}

# offsets FILE: the size of every node's log, in node order.
offsets() { stat -c %s "${logs[@]}" >"$1"; }

# slice OFF0 OFF1 OUT: the log lines written between two offsets files
# ("-" for OFF0: from the start), every node's in turn, into OUT.
slice() {
  local i=0 a b
  : >"$3"
  while read -r a b; do
    i=$((i + 1))
    [ "$b" -gt "$a" ] || continue
    # head reads the file up to b and ends; tail reads all it is given.
    # (tail | head killed tail with SIGPIPE, and with pipefail the script,
    # when a node went on logging more than a pipe holds past b.)
    head -c "$b" "$tmp/log-$i" | tail -c +$((a + 1)) >>"$3"
  done < <(if [ "$1" = - ]; then awk '{ print 0, $1 }' "$2"; else paste -d ' ' "$1" "$2"; fi)
}

# logcount FILE PATTERN: lines of FILE matching the extended regex.
logcount() { grep -cE -- "$2" "$1" || true; }

# bymessage FILE PHASE: the warn and error lines and memberlist's lines at
# info, by level and message (node names, addresses and numbers replaced),
# most frequent first, at most 15.
bymessage() {
  awk -v phase="$2" '
    / level=(WARN|ERROR) / || (/ level=INFO / && / component=memberlist/) {
      lvl = $0; sub(/.* level=/, "", lvl); sub(/ .*/, "", lvl)
      msg = $0
      if (match(msg, /msg="([^"\\]|\\.)*"/)) msg = substr(msg, RSTART + 5, RLENGTH - 6)
      else if (match(msg, /msg=[^ ]*/)) msg = substr(msg, RSTART + 4, RLENGTH - 4)
      gsub(/scale-[0-9]+/, "scale-#", msg)
      gsub(/[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+(:[0-9]+)?/, "ADDR", msg)
      gsub(/[0-9]+(\.[0-9]+)?/, "#", msg)
      c[lvl " " substr(msg, 1, 200)]++
    }
    END { for (k in c) printf "# %s %7d %s\n", phase, c[k], k }' "$1" | sort -k3,3nr | head -n 15
}

# instability PHASE DIR0 DIR1 OFF0 OFF1: the phase'"'"'s counters (DIR0 "-":
# from zero) and log lines into the summary, and its log lines by message
# onto stdout.
instability() {
  local p=$1 d0=$2 d1=$3 k lf=$tmp/lines-$1
  if [ "$d0" = - ]; then d0=$tmp/zero; mkdir -p "$d0"; : >"$d0.sum"; fi
  put "${p}_failures" "$(mdelta "$d0" "$d1" 'sluice_membership_changes_total{event="fail"}')"
  put "${p}_pauses" "$(mdelta "$d0" "$d1" sluice_pauses_total)"
  if grep -q '^sluice_pause_causes_total{' "$d1.sum"; then # binaries that tell the causes apart
    for k in starved busy stopped; do put "${p}_pauses_$k" "$(mdelta "$d0" "$d1" "sluice_pause_causes_total{cause=\"$k\"}")"; done
  fi
  put "${p}_joins" "$(mdelta "$d0" "$d1" 'sluice_membership_changes_total{event="join"}')"
  put "${p}_leaves" "$(mdelta "$d0" "$d1" 'sluice_membership_changes_total{event="leave"}')"
  put "${p}_updates" "$(mdelta "$d0" "$d1" 'sluice_membership_changes_total{event="update"}')"
  put "${p}_rejoins" "$(mdelta "$d0" "$d1" sluice_rejoins_total)"
  put "${p}_idle_resumes" "$(mdelta "$d0" "$d1" sluice_idle_resumes_total)"
  put "${p}_pulls" "$(mdelta "$d0" "$d1" sluice_pulls_total)"
  if grep -q '^sluice_pause_queries_total{' "$d1.sum"; then # binaries that ask after a pause
    for k in narrowed kept skipped; do put "${p}_pause_queries_$k" "$(mdelta "$d0" "$d1" "sluice_pause_queries_total{result=\"$k\"}")"; done
  fi
  put "${p}_peer_rpc_errors" "$(mdelta "$d0" "$d1" sluice_peer_rpc_errors_total)"
  for k in alive_min scraped; do put "${p}_end_$k" "$(mval "$d1" "$k")"; done
  put "${p}_end_suspect" "$(mval "$d1" 'sluice_members{state="suspect"}')"
  put "${p}_end_dead" "$(mval "$d1" 'sluice_members{state="dead"}')"
  slice "$4" "$5" "$lf"
  put "${p}_log_marked_failed" "$(logcount "$lf" 'memberlist: Marking .* as failed')"
  put "${p}_log_suspect" "$(logcount "$lf" 'memberlist: Suspect .* has failed')"
  put "${p}_log_suspected_members" "$(grep -oE 'memberlist: Suspect [^ ]+' "$lf" | sort -u | wc -l)"
  put "${p}_log_refuted" "$(logcount "$lf" 'Refuting a (suspect|dead) message')"
  put "${p}_log_pause" "$(logcount "$lf" 'did not run for longer than the forward timeout')"
  put "${p}_log_warn" "$(logcount "$lf" ' level=WARN ')"
  put "${p}_log_error" "$(logcount "$lf" ' level=ERROR ')"
  bymessage "$lf" "$p"
}

# start_node I: starts node I (joining nodes 1 and 2) and sets pids[I].
start_node() {
  local i=$1 join=()
  if [ "$i" = 2 ]; then join=(--join "$net.1:7946"); elif [ "$i" -gt 2 ]; then join=(--join "$net.1:7946,$net.2:7946"); fi
  "$bin" serve --node-name "scale-$i" --grpc-addr "$net.$i:8081" --http-addr "$net.$i:8080" \
    --gossip-addr "$net.$i:7946" --data-dir "$tmp/data-$i" --log-level info \
    "${join[@]}" "${extra[@]}" </dev/null >>"$tmp/log-$i" 2>&1 &
  pids[i]=$!
}

# --- start -------------------------------------------------------------
say "starting $n nodes on $net.1..$net.$n, ${stagger}s apart (logs in $tmp)"
now_us; t_first=$NOW
for ((i = 1; i <= n; i++)); do
  start_node "$i"
  if [ "$i" = 1 ]; then
    now_us; deadline=$((NOW + 30000000))
    until curl -sf -m 1 -o /dev/null "http://$net.1:8080/healthz"; do
      is_running "${pids[1]}" || { tail -n 20 "$tmp/log-1" >&2; fail "node 1 exited"; }
      now_us; [ "$NOW" -lt "$deadline" ] || { tail -n 20 "$tmp/log-1" >&2; fail "node 1 did not answer /healthz within 30 s"; }
      sleep 0.05
    done
  elif [ "$i" -lt "$n" ]; then
    nap "$stagger"
  fi
done
now_us; t_last=$NOW
say "all $n started in $(fmt_s $((t_last - t_first))) s"
put nodes "$n"
put stable_s "$stable"
put stagger_s "$stagger"
put start_s "$(fmt_s $((t_last - t_first)))"

# --- formation ---------------------------------------------------------
interval=$((n * 20000)) # µs: N/50 s, at least 0.2 s
[ "$interval" -ge 200000 ] || interval=200000
deadline=$((t_last + 120000000))
rounds=0
while :; do
  now_us; round=$NOW
  for ((i = 1; i <= n; i++)); do
    is_running "${pids[i]}" || { tail -n 20 "$tmp/log-$i" >&2; fail "node scale-$i exited during formation (log above)"; }
  done
  scrape "$tmp/poll"
  rounds=$((rounds + 1))
  ok=$(alive_counts "$tmp/poll" | awk -v n="$n" '$2 == n { k++ } END { print k + 0 }')
  now_us
  if [ "$ok" = "$n" ]; then formed=$((NOW - t_last)); break; fi
  if [ "$NOW" -ge "$deadline" ]; then
    say "FAIL: not formed 120 s after the last start: $ok of $n nodes see $n alive"
    alive_counts "$tmp/poll" | awk -v n="$n" '
      { c[$2]++; if ($2 != n) { bad = bad sprintf(" scale-%d=%s", $1, $2); nb++ } }
      END { printf "members alive as the nodes see them (alive: nodes, -1 = no answer):"; for (k in c) printf " %s:%d", k, c[k]; print ""
            printf "nodes not seeing %d:%s\n", n, (nb > 40 ? substr(bad, 1, 600) " …" : bad) }' >&2
    worst=$(alive_counts "$tmp/poll" | sort -k2,2n | awk '$2 >= 0 && !w { w = $1 } END { print w }')
    if [ -n "$worst" ]; then
      seen=$("$bin" status --addr "$net.$worst:8081" --json --timeout 3s 2>/dev/null |
        grep -oE '"name": ?"[^"]*", ?"grpc_addr": ?"[^"]*", ?"state": ?"alive"' | grep -oE 'scale-[0-9]+' || true)
      missing=$(for ((i = 1; i <= n; i++)); do grep -qx "scale-$i" <<<"$seen" || printf ' scale-%d' "$i"; done)
      echo "scale-$worst does not see alive:${missing:- (none now)}" >&2
    fi
    metrics "$tmp/poll"
    offsets "$tmp/off-poll"
    instability formation - "$tmp/poll" - "$tmp/off-poll"
    printf '%s\n' "${summary[@]}"
    echo "scale: N=$n formed_s=not_formed"
    exit 1
  fi
  nap_until $((round + interval))
done
say "formed: all $n nodes see $n alive $(fmt_s "$formed") s after the last start ($rounds polls)"
put formed_s "$(fmt_s "$formed")"
put formation_poll_s "$(fmt_s "$interval")"
scrape "$tmp/m-formed"
metrics "$tmp/m-formed"
offsets "$tmp/off-formed"
put ready_at_formed "$(mval "$tmp/m-formed" ready)"
cross=$("$bin" status --addr "$net.1:8081" --json --timeout 10s 2>/dev/null | grep -oE '"state": ?"alive"' | wc -l || true)
put status_alive_node1 "$cross"
instability formation - "$tmp/m-formed" - "$tmp/off-formed"

m_start=$tmp/m-formed
o_start=$tmp/off-formed
if [ "$settle" -gt 0 ]; then
  say "settling ${settle}s"
  nap "$settle"
  scrape "$tmp/m-settled"
  metrics "$tmp/m-settled"
  offsets "$tmp/off-settled"
  instability settle "$m_start" "$tmp/m-settled" "$o_start" "$tmp/off-settled"
  m_start=$tmp/m-settled
  o_start=$tmp/off-settled
fi

# --- stable ------------------------------------------------------------
say "stable window: ${stable}s idle"
sample "$tmp/cpu-idle0"
nap "$stable"
sample "$tmp/cpu-idle1"
scrape "$tmp/m-idle"
metrics "$tmp/m-idle"
offsets "$tmp/off-idle"
read -r c_mean c_max c_tot r_mean r_max r0_mean busy secs gone a_mean a_max <<<"$(cpu_stats "$tmp/cpu-idle0" "$tmp/cpu-idle1")"
put idle_window_s "$secs"
put idle_cpu_ms_s_mean "$c_mean"
put idle_cpu_ms_s_max "$c_max"
put idle_cpu_ms_s_total "$c_tot"
put idle_machine_busy_pct "$busy"
put rss_mb_start_mean "$r0_mean"
put rss_mb_mean "$r_mean"
put rss_mb_max "$r_max"
put anon_mb_mean "$a_mean"
put anon_mb_max "$a_max"
put goroutines_mean "$(mval "$tmp/m-idle" goroutines_mean)"
put goroutines_max "$(mval "$tmp/m-idle" goroutines_max)"
put stable_nodes_exited "$gone"
idle_line="idle_cpu_ms_s_mean=$c_mean idle_cpu_ms_s_max=$c_max rss_mb_mean=$r_mean rss_mb_max=$r_max"
stable_gone=$gone
instability stable "$m_start" "$tmp/m-idle" "$o_start" "$tmp/off-idle"
stable_failures=$(mdelta "$m_start" "$tmp/m-idle" 'sluice_membership_changes_total{event="fail"}')
stable_pauses=$(mdelta "$m_start" "$tmp/m-idle" sluice_pauses_total)
say "stable: CPU ${c_mean} ms/s per node (max ${c_max}), RSS ${r_mean} MB (max ${r_max}; the node's own ${a_mean}, max ${a_max}), machine ${busy}% busy; failures $stable_failures, pauses $stable_pauses"

# --- membership events ---------------------------------------------------
# Node N+1 joins the idle cluster, and 8 s later leaves (SIGTERM: a
# graceful leave), SCALE_EVENTS times. What one event costs the cluster is
# the N nodes' CPU in the 8 s after it, less what they used in the 8 s
# before the join (idle, measured anew for each event).
if [ "$events" -gt 0 ]; then
  x=$((n + 1))
  evw=8
  say "membership events: scale-$x joins and leaves $events times, ${evw}s apart, after ${evw}s idle each"
  : >"$tmp/ev-costs"
  for ((e = 1; e <= events; e++)); do
    sample "$tmp/ev-b0"
    nap "$evw"
    sample "$tmp/ev-j0"
    read -r _ _ idle_tot _ _ _ _ _ _ _ _ <<<"$(cpu_stats "$tmp/ev-b0" "$tmp/ev-j0")"
    start_node "$x"
    nap "$evw"
    sample "$tmp/ev-j1"
    kill -TERM "${pids[x]}" 2>/dev/null || true
    now_us; deadline=$((NOW + 30000000))
    while is_running "${pids[x]}" && [ "$NOW" -lt "$deadline" ]; do sleep 0.1; now_us; done
    is_running "${pids[x]}" && kill -KILL "${pids[x]}" 2>/dev/null
    wait "${pids[x]}" 2>/dev/null || true
    unset 'pids[x]'
    nap_until $(($(awk '$1 == "time" { print $2 }' "$tmp/ev-j1") + evw * 1000000))
    sample "$tmp/ev-l1"
    read -r _ _ j_tot _ _ _ _ j_secs j_gone _ _ <<<"$(cpu_stats "$tmp/ev-j0" "$tmp/ev-j1")"
    read -r _ _ l_tot _ _ _ _ l_secs l_gone _ _ <<<"$(cpu_stats "$tmp/ev-j1" "$tmp/ev-l1")"
    if [ "$j_gone" != 0 ] || [ "$l_gone" != 0 ]; then fail "a node exited during the membership events"; fi
    awk -v jt="$j_tot" -v js="$j_secs" -v lt="$l_tot" -v ls="$l_secs" -v it="$idle_tot" \
      'BEGIN { printf "%.1f %.1f\n", (jt - it) * js, (lt - it) * ls }' >>"$tmp/ev-costs"
    rm -rf "$tmp/data-$x"
  done
  read -r ev_join ev_join_max ev_leave ev_leave_max <<<"$(awk '{ j += $1; l += $2; if ($1 > jm) jm = $1; if ($2 > lm) lm = $2 }
    END { printf "%.1f %.1f %.1f %.1f\n", j / NR, jm, l / NR, lm }' "$tmp/ev-costs")"
  put event_count "$events"
  put event_window_s "$evw"
  put event_join_cluster_cpu_ms_mean "$ev_join"
  put event_join_cluster_cpu_ms_max "$ev_join_max"
  put event_leave_cluster_cpu_ms_mean "$ev_leave"
  put event_leave_cluster_cpu_ms_max "$ev_leave_max"
  put event_join_cpu_ms_per_node "$(awk -v j="$ev_join" -v n="$n" 'BEGIN { printf "%.2f", j / n }')"
  say "membership events: a join costs the $n nodes ${ev_join} ms of CPU (max ${ev_join_max}), a leave ${ev_leave} ms (max ${ev_leave_max})"
fi

# --- load --------------------------------------------------------------
if [ "$rate" -gt 0 ]; then
  calls=$(((rate + batch / 2) / batch))
  [ "$calls" -ge 1 ] || calls=1
  conc=$(((calls + 199) / 200))
  [ "$conc" -le "$n" ] || conc=$n
  slots=$stable
  say "load: $rate checks/s target, $slots slots of 1 s: $calls calls of $batch, $conc callers each"
  mkdir -p "$tmp/bench"
  read -r line </proc/$$/stat
  read -r -a f <<<"${line##*) }"
  gen0=$((f[13] + f[14])) # cutime + cstime: children this shell waited for
  sample "$tmp/cpu-load0"
  now_us; t0=$NOW
  next=0
  for ((k = 0; k < slots; k++)); do
    nap_until $((t0 + k * 1000000))
    addrs=""
    for ((j = 0; j < conc; j++)); do addrs+="${addrs:+,}$net.$(((next + j) % n + 1)):8081"; done
    next=$(((next + conc) % n))
    "$bin" bench --addr "$addrs" --conns 1 --concurrency "$conc" --batch "$batch" --calls "$calls" \
      --duration 800ms --progress 0 --json --name scale >"$tmp/bench/$k.json" 2>"$tmp/bench/$k.err" || true
  done
  nap_until $((t0 + slots * 1000000))
  sample "$tmp/cpu-load1"
  read -r line </proc/$$/stat
  read -r -a f <<<"${line##*) }"
  gen1=$((f[13] + f[14]))
  scrape "$tmp/m-load"
  metrics "$tmp/m-load"
  offsets "$tmp/off-load"
  read -r c_mean c_max c_tot l_rmean l_rmax _ busy secs gone l_amean l_amax <<<"$(cpu_stats "$tmp/cpu-load0" "$tmp/cpu-load1")"
  # Each slot's bench summary: checks, errors, latency figures.
  for ((k = 0; k < slots; k++)); do
    awk -v want=$((calls * batch)) -v k="$k" '
      function num(key,   s) { if (!match($0, "\"" key "\":[-0-9.eE+]+")) return -1; s = substr($0, RSTART, RLENGTH); sub(/.*:/, "", s); return s + 0 }
      /^\{/ { printf "%d %d %d %.0f %.0f %.0f\n", num("checks"), num("item_errors") + num("call_errors"), (num("checks") < want), num("p50_us"), num("p99_us"), num("max_us"); found = 1 }
      END { if (!found) print "0 0 1 -1 -1 -1" }' "$tmp/bench/$k.json"
  done >"$tmp/bench/slots"
  read -r l_checks l_errs l_short l_max <<<"$(awk '{ c += $1; e += $2; s += $3; if ($6 > m) m = $6 } END { print c + 0, e + 0, s + 0, m + 0 }' "$tmp/bench/slots")"
  median() { awk -v c="$1" '$c >= 0 { print $c }' "$tmp/bench/slots" | sort -n | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : -1 }'; }
  put load_rate_target "$rate"
  put load_batch "$batch"
  put load_callers_per_slot "$conc"
  put load_slots "$slots"
  put load_window_s "$secs"
  put load_checks "$l_checks"
  put load_checks_per_s "$(awk -v c="$l_checks" -v s="$secs" 'BEGIN { printf "%.0f", s ? c / s : 0 }')"
  put load_errors "$l_errs"
  put load_short_slots "$l_short"
  put load_p50_us_median "$(median 4)"
  put load_p99_us_median "$(median 5)"
  put load_p99_us_max "$(sort -k5,5n "$tmp/bench/slots" | tail -n 1 | awk '{ print $5 }')"
  put load_max_us "$l_max"
  first_err=$(cat "$tmp"/bench/*.err 2>/dev/null | grep -m 1 . || true)
  [ -z "$first_err" ] || put load_first_error "\"$first_err\""
  put load_gen_cpu_ms_s "$(awk -v t=$((gen1 - gen0)) -v hz="$hz" -v s="$secs" 'BEGIN { printf "%.1f", t * 1000 / hz / s }')"
  put load_cpu_ms_s_mean "$c_mean"
  put load_cpu_ms_s_max "$c_max"
  put load_cpu_ms_s_total "$c_tot"
  put load_machine_busy_pct "$busy"
  put load_rss_mb_mean "$l_rmean"
  put load_rss_mb_max "$l_rmax"
  put load_anon_mb_mean "$l_amean"
  put load_anon_mb_max "$l_amax"
  put load_nodes_exited "$gone"
  put load_checks_answered "$(mdelta "$tmp/m-idle" "$tmp/m-load" sluice_checks_total)"
  put load_forward_errors "$(mdelta "$tmp/m-idle" "$tmp/m-load" sluice_forward_errors_total)"
  instability load "$tmp/m-idle" "$tmp/m-load" "$tmp/off-idle" "$tmp/off-load"
  say "load: $l_checks checks in ${secs} s, $l_errs errors, CPU ${c_mean} ms/s per node, RSS ${l_rmean} MB (max ${l_rmax}; the node's own ${l_amean}, max ${l_amax}), generator $((gen1 - gen0)) ticks"
fi

# --- overload ----------------------------------------------------------
# A busy loop on every core for SCALE_HOG_SECS under a paced load (one
# bench run a second over the next nodes in turn, as in the load phase):
# 10 s of the load first (the baseline), the hog, then 20 s of the load
# again. The nodes may answer slower; none may be declared dead, and in
# the last 10 s of the 20 after the hog their CPU should be back at the
# baseline's.
hog_failures=0
if [ "$hog" -gt 0 ]; then
  h_calls=$hog_rate
  h_conc=$(((h_calls + 199) / 200))
  [ "$h_conc" -le "$n" ] || h_conc=$n
  h_next=0
  mkdir -p "$tmp/hog"
  # hog_slots FROM COUNT T0: slots FROM..FROM+COUNT-1, slot k starting at
  # T0 + k s; each one bench run into $tmp/hog/k.json.
  hog_slots() {
    local k j addrs
    for ((k = $1; k < $1 + $2; k++)); do
      nap_until $(($3 + k * 1000000))
      addrs=""
      for ((j = 0; j < h_conc; j++)); do addrs+="${addrs:+,}$net.$(((h_next + j) % n + 1)):8081"; done
      h_next=$(((h_next + h_conc) % n))
      "$bin" bench --addr "$addrs" --conns 1 --concurrency "$h_conc" --calls "$h_calls" \
        --duration 900ms --timeout 2s --progress 0 --json --name overload >"$tmp/hog/$k.json" 2>"$tmp/hog/$k.err" || true
    done
  }
  # hog_summary FROM COUNT: "CHECKS ERRORS P99_US_MAX MAX_US" of those slots.
  hog_summary() {
    local k
    for ((k = $1; k < $1 + $2; k++)); do
      awk 'function num(key,   s) { if (!match($0, "\"" key "\":[-0-9.eE+]+")) return -1; s = substr($0, RSTART, RLENGTH); sub(/.*:/, "", s); return s + 0 }
        /^\{/ { printf "%d %d %.0f %.0f\n", num("checks"), num("item_errors") + num("call_errors"), num("p99_us"), num("max_us"); found = 1 }
        END { if (!found) print "0 1 -1 -1" }' "$tmp/hog/$k.json"
    done | awk '{ c += $1; e += $2; if ($3 > p) p = $3; if ($4 > m) m = $4 } END { print c + 0, e + 0, p + 0, m + 0 }'
  }
  say "overload: ${hog}s of a busy loop on each of $(nproc) cores under $hog_rate checks/s, 10 s of the load before and 20 s after"
  scrape "$tmp/m-hog0"; metrics "$tmp/m-hog0"; offsets "$tmp/off-hog0"
  now_us; h0=$((NOW + 200000))
  sample "$tmp/cpu-base0"
  hog_slots 0 10 "$h0"
  nap_until $((h0 + 10 * 1000000))
  sample "$tmp/cpu-base1"
  scrape "$tmp/m-hogb"; metrics "$tmp/m-hogb"
  for ((c = 0; c < $(nproc); c++)); do
    bash -c 'while :; do :; done' &
    hogs+=($!)
  done
  hog_slots 10 "$hog" "$h0"
  nap_until $((h0 + (10 + hog) * 1000000))
  stop_hogs
  scrape "$tmp/m-hog1"; metrics "$tmp/m-hog1"; offsets "$tmp/off-hog1"
  hog_slots $((10 + hog)) 10 "$h0"
  nap_until $((h0 + (20 + hog) * 1000000))
  sample "$tmp/cpu-rec0"
  hog_slots $((20 + hog)) 10 "$h0"
  nap_until $((h0 + (30 + hog) * 1000000))
  sample "$tmp/cpu-rec1"
  scrape "$tmp/m-hog2"; metrics "$tmp/m-hog2"; offsets "$tmp/off-hog2"
  read -r b_mean b_max _ _ _ _ b_busy _ _ _ _ <<<"$(cpu_stats "$tmp/cpu-base0" "$tmp/cpu-base1")"
  read -r r_mean r_max _ _ _ _ r_busy _ r_gone _ _ <<<"$(cpu_stats "$tmp/cpu-rec0" "$tmp/cpu-rec1")"
  read -r hb_checks hb_errs hb_p99 _ <<<"$(hog_summary 0 10)"
  read -r hh_checks hh_errs hh_p99 hh_max <<<"$(hog_summary 10 "$hog")"
  read -r ha_checks ha_errs ha_p99 _ <<<"$(hog_summary $((10 + hog)) 20)"
  put hog_s "$hog"
  put hog_rate "$hog_rate"
  put hog_before_checks "$hb_checks"
  put hog_before_errors "$hb_errs"
  put hog_before_p99_us_max "$hb_p99"
  put hog_during_checks "$hh_checks"
  put hog_during_errors "$hh_errs"
  put hog_during_p99_us_max "$hh_p99"
  put hog_during_max_us "$hh_max"
  put hog_after_checks "$ha_checks"
  put hog_after_errors "$ha_errs"
  put hog_after_p99_us_max "$ha_p99"
  put hog_base_cpu_ms_s_mean "$b_mean"
  put hog_base_cpu_ms_s_max "$b_max"
  put hog_base_machine_busy_pct "$b_busy"
  put hog_recovered_cpu_ms_s_mean "$r_mean"
  put hog_recovered_cpu_ms_s_max "$r_max"
  put hog_recovered_machine_busy_pct "$r_busy"
  put hog_nodes_exited "$r_gone"
  put hog_pulls_before "$(mdelta "$tmp/m-hog0" "$tmp/m-hogb" sluice_pulls_total)"
  put hog_pulls_during "$(mdelta "$tmp/m-hogb" "$tmp/m-hog1" sluice_pulls_total)"
  put hog_pulls_after "$(mdelta "$tmp/m-hog1" "$tmp/m-hog2" sluice_pulls_total)"
  put hog_forward_errors "$(mdelta "$tmp/m-hog0" "$tmp/m-hog2" sluice_forward_errors_total)"
  instability overload "$tmp/m-hog0" "$tmp/m-hog1" "$tmp/off-hog0" "$tmp/off-hog1"
  instability recovery "$tmp/m-hog1" "$tmp/m-hog2" "$tmp/off-hog1" "$tmp/off-hog2"
  hog_failures=$(mdelta "$tmp/m-hog0" "$tmp/m-hog2" 'sluice_membership_changes_total{event="fail"}')
  [ "$r_gone" = 0 ] || hog_failures=$((hog_failures + r_gone))
  say "overload: $hog_failures members declared dead; CPU per node ${b_mean} ms/s before, ${r_mean} ms/s 10-20 s after; p99 ${hb_p99} / ${hh_p99} / ${ha_p99} µs before / during / after"
fi

# --- stop --------------------------------------------------------------
offsets "$tmp/off-run"
say "stopping $n nodes"
stop_nodes 30
offsets "$tmp/off-stop"
put stop_s "$(fmt_s "$stopped_us")"
put stop_killed "$killed"
slice "$tmp/off-run" "$tmp/off-stop" "$tmp/lines-stop"
put stop_log_warn "$(logcount "$tmp/lines-stop" ' level=WARN ')"
put stop_log_error "$(logcount "$tmp/lines-stop" ' level=ERROR ')"
bymessage "$tmp/lines-stop" stop

met=met
if [ "$stable_failures" != 0 ] || [ "$stable_pauses" != 0 ] || [ "$stable_gone" != 0 ] || [ "$hog_failures" != 0 ]; then met=not_met; fi
put criterion "$met"
now_us
put run_s "$(fmt_s $((NOW - t_begin)))"
printf '%s\n' "${summary[@]}"
echo "scale: N=$n formed_s=$(fmt_s "$formed") $idle_line stable_failures=$stable_failures stable_pauses=$stable_pauses"
[ "$met" = met ]
