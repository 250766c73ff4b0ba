package main

import (
	"fmt"
	"log/slog"
	"time"
)

// testClockEnv names the environment variable that shifts the clock of a
// node's decisions by a Go duration ("2s", "-2s"), for tests that need one
// node's clock to differ from the others' on one machine (a `date -s` would
// move every process's). It is not a flag on purpose: no deployment should
// set it, and a node that reads it says so in a warning.
const testClockEnv = "SLUICE_TEST_CLOCK_OFFSET"

// maxTestClockOffset bounds the offset: a skew of a day is far past any a
// test needs, and a larger value is more likely a typo (a missing unit).
const maxTestClockOffset = 24 * time.Hour

// testClock returns the decision clock SLUICE_TEST_CLOCK_OFFSET asks for,
// or nil (the node's own wall clock) when it is unset or empty. A value
// that is not a duration within ±24 h is an error naming the variable.
func testClock(lookup func(string) (string, bool), lg *slog.Logger) (func() time.Time, error) {
	v, ok := lookup(testClockEnv)
	if !ok || v == "" {
		return nil, nil
	}
	off, err := time.ParseDuration(v)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: not a duration (e.g. 2s, -2s): %w", testClockEnv, v, err)
	}
	if off > maxTestClockOffset || off < -maxTestClockOffset {
		return nil, fmt.Errorf("%s=%q: the offset must be within ±%v", testClockEnv, v, maxTestClockOffset)
	}
	lg.Warn("test-only clock offset in effect: every decision of this node uses the wall clock shifted by the offset; never set this outside tests",
		"env", testClockEnv, "offset", off.String())
	return func() time.Time { return time.Now().Add(off) }, nil
}
