package main

import (
	"testing"
	"time"
)

// The floor returns free heap to the system only from a quiet process
// holding much more of it than its headroom, at most once per
// gcReleaseEvery.
func TestGCFloorReleasesFreeHeapWhenQuiet(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name              string
		live, free, alloc uint64 // alloc: bytes allocated in the second since the last sample
		releasedAgo       time.Duration
		want              bool
	}{
		{name: "quiet, 100 MiB free over 70 MiB live", live: 70 * mib, free: 100 * mib, alloc: 1 * mib, want: true},
		{name: "busy: a second of allocation is over a quarter of the free heap", live: 70 * mib, free: 100 * mib, alloc: 30 * mib},
		{name: "free within the quiet headroom (a quarter of live)", live: 200 * mib, free: 40 * mib, alloc: 0},
		{name: "too little to be worth a collection", live: 8 * mib, free: 15 * mib, alloc: 0},
		{name: "returned 30 s ago", live: 70 * mib, free: 100 * mib, alloc: 0, releasedAgo: 30 * time.Second},
		{name: "returned a minute ago", live: 70 * mib, free: 100 * mib, alloc: 0, releasedAgo: time.Minute, want: true},
	} {
		released := 0
		g := &gcFloor{floor: 64 * mib, base: 100, cur: 100, span: time.Second,
			last:    heapSample{live: tc.live, allocs: 1000 * mib, at: t0},
			set:     func(int) {},
			release: func() { released++ }}
		if tc.releasedAgo > 0 {
			g.released = t0.Add(time.Second - tc.releasedAgo)
		}
		g.sample = func() heapSample {
			return heapSample{live: tc.live, allocs: 1000*mib + tc.alloc, free: tc.free, at: t0.Add(time.Second)}
		}
		g.adjust()
		if got := released == 1; got != tc.want || released > 1 {
			t.Errorf("%s: released %d times, want %v", tc.name, released, tc.want)
		}
	}
}
