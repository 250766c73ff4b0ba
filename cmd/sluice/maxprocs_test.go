package main

import (
	"log/slog"
	"testing"
)

// TestSubCoreProcsFollowsTheLimit: GOMAXPROCS goes to 1 when the CPU limit
// falls below one core, once, and back to the runtime's default when the
// limit is a core or more, or gone, once; without a limit nothing is done.
func TestSubCoreProcsFollowsTheLimit(t *testing.T) {
	t.Parallel()
	type limit struct {
		cores   float64
		limited bool
	}
	var cur limit
	var calls []string
	p := &subCoreProcs{
		limit:   func() (float64, bool) { return cur.cores, cur.limited },
		setOne:  func() { calls = append(calls, "one") },
		restore: func() { calls = append(calls, "default") },
		log:     slog.New(slog.DiscardHandler),
	}
	for i, step := range []struct {
		limit
		want string // "" for no call
	}{
		{limit{0, false}, ""},
		{limit{2, true}, ""},
		{limit{0.2, true}, "one"},
		{limit{0.2, true}, ""},
		{limit{0.99, true}, ""},
		{limit{1, true}, "default"},
		{limit{1.5, true}, ""},
		{limit{0.25, true}, "one"},
		{limit{0, false}, "default"},
		{limit{0, false}, ""},
	} {
		cur, calls = step.limit, nil
		p.adjust()
		got := ""
		if len(calls) > 0 {
			got = calls[0]
		}
		if len(calls) > 1 || got != step.want {
			t.Errorf("step %d, limit %+v: calls %v, want %q", i, step.limit, calls, step.want)
		}
	}
}
