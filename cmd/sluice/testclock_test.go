package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestTestClockOffset(t *testing.T) {
	t.Parallel()
	env := func(v string, ok bool) func(string) (string, bool) {
		return func(k string) (string, bool) {
			if k != testClockEnv {
				t.Fatalf("looked up %q", k)
			}
			return v, ok
		}
	}
	for _, tc := range []struct {
		v      string
		set    bool
		off    time.Duration
		errHas string
	}{
		{set: false},
		{v: "", set: true},
		{v: "2s", set: true, off: 2 * time.Second},
		{v: "-2s", set: true, off: -2 * time.Second},
		{v: "2", set: true, errHas: "not a duration"},
		{v: "25h", set: true, errHas: "within ±24h"},
		{v: "-25h", set: true, errHas: "within ±24h"},
	} {
		var logs bytes.Buffer
		lg := slog.New(slog.NewTextHandler(&logs, nil))
		now, err := testClock(env(tc.v, tc.set), lg)
		switch {
		case tc.errHas != "":
			if err == nil || !strings.Contains(err.Error(), tc.errHas) || !strings.Contains(err.Error(), testClockEnv) {
				t.Errorf("%q: error %v, want one naming %s and saying %q", tc.v, err, testClockEnv, tc.errHas)
			}
			continue
		case err != nil:
			t.Errorf("%q: %v", tc.v, err)
			continue
		}
		if tc.off == 0 {
			if now != nil || logs.Len() != 0 {
				t.Errorf("%q: clock %v, log %q; want the node's own clock and no log", tc.v, now != nil, logs.String())
			}
			continue
		}
		before := time.Now()
		got := now()
		after := time.Now()
		if got.Before(before.Add(tc.off)) || got.After(after.Add(tc.off)) {
			t.Errorf("%q: clock says %v, want between %v and %v", tc.v, got, before.Add(tc.off), after.Add(tc.off))
		}
		if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "offset="+tc.off.String()) {
			t.Errorf("%q: want a warning with the offset, logged %q", tc.v, logs.String())
		}
	}
}
