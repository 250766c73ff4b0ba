# Sourced by test/idle.sh and test/memkeys.sh: three `sluice serve` nodes on
# loopback, started, joined and stopped by PID the same way for both.
#
#   threenodes_setup FIRST_ADDR   temp dir, binary (SLUICE_BIN or built from this
#                                 tree), cleanup on exit
#   threenodes_start NAME [FLAG...]
#                                 nodes NAME-1..3 on FIRST_ADDR and the next two
#                                 addresses (gRPC :18081, gossip :17946); the
#                                 caller may define node_flags I, which sets the
#                                 array FLAGS of node I's own flags
#   threenodes_wait               until every node sees three alive (20 s), then 5 s
#                                 for joining, the first flush and collections
# Sets: bin, tmp, pids (one PID per node), ip I (node I's address).

threenodes_setup() {
  prefix=${1%.*}; first=${1##*.}
  tmp=$(mktemp -d)
  pids=()
  trap threenodes_cleanup EXIT INT TERM
  bin=${SLUICE_BIN:-}
  if [ -z "$bin" ]; then
    bin=$tmp/sluice
    go build -o "$bin" ./cmd/sluice
  fi
}

threenodes_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}

ip() { echo "$prefix.$((first + $1 - 1))"; }

threenodes_start() {
  local name=$1 i; shift
  for i in 1 2 3; do
    local join=(); [ "$i" -gt 1 ] && join=(--join "$(ip 1):17946")
    FLAGS=(--http-addr "")
    if declare -F node_flags >/dev/null; then node_flags "$i"; fi
    "$bin" serve --node-name "$name-$i" --grpc-addr "$(ip "$i"):18081" "${FLAGS[@]}" \
      --gossip-addr "$(ip "$i"):17946" --data-dir "$tmp/data-$i" --log-level warn \
      "${join[@]}" "$@" 2>"$tmp/log-$i" &
    pids+=($!)
  done
}

threenodes_wait() {
  local ok i n
  for _ in $(seq 1 200); do
    ok=0
    for i in 1 2 3; do
      n=$("$bin" status --addr "$(ip "$i"):18081" --json 2>/dev/null | grep -o '"state":"alive"' | wc -l || true)
      [ "$n" = 3 ] && ok=$((ok + 1))
    done
    if [ "$ok" = 3 ]; then
      sleep 5 # let joining, the first flush and the first collections pass
      return 0
    fi
    sleep 0.1
  done
  echo "the nodes did not join within 20 s; logs:" >&2; tail -n 5 "$tmp"/log-* >&2
  exit 1
}
