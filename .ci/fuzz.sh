#!/usr/bin/env bash
# Runs every fuzz target of the module (every func FuzzXxx in a _test.go
# file) for the given budget each: `bash .ci/fuzz.sh 20000x` in CI (a count
# of inputs), `make fuzz` (FUZZTIME, default 2m) by hand. New targets are
# picked up by themselves.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context deadline
# exceeded" when a duration budget (-fuzztime 5s) ends while a worker is
# mid-input (golang/go#75804, fixed in Go 1.27). A count budget (-fuzztime
# Nx) never takes that path, so CI uses one. For duration budgets, a run that
# fails with exactly that message and writes no failing input under
# testdata/fuzz/ is reported as the toolchain race, not as a failure; any
# other failure, or any failing input written, fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-10s}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0
while read -r f; do
  dir=$(dirname "$f")
  for name in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
    echo "--- $name ($dir, $t)"
    corpus="$dir/testdata/fuzz/$name"
    before=$(ls "$corpus" 2>/dev/null | sort || true)
    if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$t" -timeout 10m "./${dir#./}/" 2>&1 | tee "$log"; then
      continue
    fi
    after=$(ls "$corpus" 2>/dev/null | sort || true)
    if [ "$before" = "$after" ] && grep -qx '    context deadline exceeded' "$log" &&
      ! grep -q 'Failing input written' "$log"; then
      echo "--- $name: stopped by Go's fuzz deadline race (golang/go#75804), no failing input: not a failure"
      continue
    fi
    echo "--- $name: FAILED"
    failed=1
  done
done < <(grep -rl --include='*_test.go' '^func Fuzz' . | sort)
exit "$failed"
