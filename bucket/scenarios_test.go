package bucket

import (
	"math"
	"testing"
	"time"
)

// act is one request of a scripted sequence: hits at t0 + at (ns) under
// load, and the decision it must get.
type act struct {
	at, hits int64
	want     Decision
	load     float64 // 0 unless said; only elastic limits look at it
}

func allowedDelay(limit, remaining, resetMS, delayMS int64) Decision {
	d := under(limit, remaining, resetMS)
	d.RetryAfterMS = delayMS
	return d
}

func runScript(t *testing.T, lim Limit, s State, acts []act) State {
	t.Helper()
	if err := lim.Validate(); err != nil {
		t.Fatal(err)
	}
	for i, a := range acts {
		if got := DecideLoad(&s, lim, a.hits, t0+a.at, a.load); got != a.want {
			t.Fatalf("step %d (hits %d at +%d ns): got %+v, want %+v", i, a.hits, a.at, got, a.want)
		}
	}
	return s
}

// The numbers below are computed by hand; comments give the working.
// One table of cases; long on purpose: each case reads alone.
func TestAlgorithmScenarios(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		lim  Limit
		acts []act
	}{{
		// 10 per s, burst 5: one token per 100 ms.
		name: "token bucket",
		lim:  Limit{Algorithm: TokenBucket, Limit: 10, WindowMS: 1000, Burst: 5},
		acts: []act{
			{at: 0, hits: 3, want: under(10, 2, 300)},                           // 3 tokens to refill
			{at: 0, hits: 3, want: over(10, 2, 300, 100)},                       // 2 < 3: one more token in 100 ms
			{at: 50 * ms, hits: 0, want: under(10, 2, 250)},                     // 2.5 tokens
			{at: 100 * ms, hits: 3, want: under(10, 0, 500)},                    // 3 tokens, all taken
			{at: 100 * ms, hits: 6, want: over(10, 0, 500, 1000)},               // 6 > burst: never; at least a window
			{at: 130 * ms, hits: 1, want: over(10, 0, 470, 70)},                 // 0.3 tokens
			{at: 600 * ms, hits: 5, want: under(10, 0, 500)},                    // full again
			{at: 10 * sec, hits: 0, want: under(10, 5, 0)},                      // full, nothing to reset
			{at: 10*sec + 1, hits: 5, want: under(10, 0, 500)},                  // the burst at once
			{at: 10*sec + 1, hits: math.MaxInt64, want: over(10, 0, 500, 1000)}, // absurd hits: no overflow
		},
	}, {
		// 3 per s, burst 1: T = 333333333.3 ns.
		name: "token bucket, fractional interval",
		lim:  Limit{Algorithm: TokenBucket, Limit: 3, WindowMS: 1000, Burst: 1},
		acts: []act{
			{at: 0, hits: 1, want: under(3, 0, 334)},          // ceil(333333333.3 ns)
			{at: 333333333, hits: 1, want: over(3, 0, 1, 1)},  // 0.999999999 tokens: 0.33 ns to go
			{at: 333333334, hits: 1, want: under(3, 0, 334)},  // 1.000000002 tokens
			{at: 1000000000, hits: 1, want: under(3, 0, 334)}, // 2.000000001 tokens > burst: full
		},
	}, {
		name: "gcra: the token bucket's decisions",
		lim:  Limit{Algorithm: GCRA, Limit: 10, WindowMS: 1000, Burst: 5},
		acts: []act{
			{at: 0, hits: 3, want: under(10, 2, 300)},           // TAT = 300 ms
			{at: 0, hits: 3, want: over(10, 2, 300, 100)},       // 300 + 300 > 500
			{at: 50 * ms, hits: 0, want: under(10, 2, 250)},     // debt 250 ms
			{at: 100 * ms, hits: 3, want: under(10, 0, 500)},    // TAT = 600 ms
			{at: 130 * ms, hits: 1, want: over(10, 0, 470, 70)}, // debt 470 > 400
			{at: 600 * ms, hits: 5, want: under(10, 0, 500)},    // debt 0
		},
	}, {
		name: "leaky bucket meter",
		lim:  Limit{Algorithm: LeakyBucket, Limit: 10, WindowMS: 1000},
		acts: []act{
			{at: 0, hits: 10, want: under(10, 0, 1000)},        // queue of 10 drains in 1 s
			{at: 50 * ms, hits: 1, want: over(10, 0, 950, 50)}, // 9.5 queued: room at 9
			{at: 100 * ms, hits: 1, want: under(10, 0, 1000)},  // 9 queued + 1
		},
	}, {
		// Queue of 5 draining at 10 per s: 100 ms per hit.
		name: "leaky bucket shaping: admitted with a delay",
		lim:  Limit{Algorithm: LeakyBucket, Limit: 10, WindowMS: 1000, Burst: 5, Shaping: true},
		acts: []act{
			{at: 0, hits: 1, want: allowedDelay(10, 4, 100, 0)},          // empty queue: go now
			{at: 0, hits: 1, want: allowedDelay(10, 3, 200, 100)},        // one ahead: wait 100 ms
			{at: 0, hits: 3, want: allowedDelay(10, 0, 500, 200)},        // two ahead
			{at: 0, hits: 1, want: over(10, 0, 500, 100)},                // queue full
			{at: 250 * ms, hits: 1, want: allowedDelay(10, 1, 350, 250)}, // 2.5 ahead
		},
	}, {
		name: "fixed window",
		lim:  Limit{Algorithm: FixedWindow, Limit: 3, WindowMS: 1000},
		acts: []act{
			{at: 0, hits: 2, want: under(3, 1, 1000)},
			{at: 999 * ms, hits: 2, want: over(3, 1, 1, 1)}, // the window ends in 1 ms
			{at: 999 * ms, hits: 1, want: under(3, 0, 1)},
			{at: 1000 * ms, hits: 3, want: under(3, 0, 1000)},     // a new window
			{at: 1500 * ms, hits: 4, want: over(3, 0, 500, 1000)}, // never: at least a window
			{at: 1500 * ms, hits: 0, want: over(3, 0, 500, 500)},
		},
	}, {
		name: "sliding log",
		lim:  Limit{Algorithm: SlidingLog, Limit: 3, WindowMS: 1000},
		acts: []act{
			{at: 0, hits: 1, want: under(3, 2, 1000)},
			{at: 400 * ms, hits: 2, want: under(3, 0, 1000)},      // the newest leaves at 1400
			{at: 999 * ms, hits: 1, want: over(3, 0, 401, 1)},     // the hit at 0 leaves at 1000
			{at: 1000 * ms, hits: 1, want: under(3, 0, 1000)},     // (0, 1000] no longer holds 0
			{at: 1000 * ms, hits: 2, want: over(3, 0, 1000, 400)}, // the two at 400 leave at 1400
			{at: 1400 * ms, hits: 2, want: under(3, 0, 1000)},
		},
	}, {
		// 4 per s in 2 sub-windows of 500 ms. A count c weighs
		// floor(c × (500 ms − e)/500 ms) ≤ r from e = 500 ms − (ceil((r+1) × 500 ms / c) − 1 ns).
		name: "sub-window counter",
		lim:  Limit{Algorithm: SlidingWindow, Limit: 4, WindowMS: 1000, SubWindows: 2},
		acts: []act{
			// Reset: the 2 at [0, 500) weigh 0 from 1000 + 250 ms + 1 ns.
			{at: 0, hits: 2, want: under(4, 2, 1251)},
			// 2 in [0, 500) count fully. Reset: 500 + 1000 + 250 ms + 1 ns − 600.
			{at: 600 * ms, hits: 2, want: under(4, 0, 1151)},
			// Retry: at 1000 ms + 1 ns the 2 at [0, 500) weigh 1: 1 + 2 + 1 ≤ 4.
			{at: 900 * ms, hits: 1, want: over(4, 0, 851, 101)},
			// Peek at 1250: floor(2 × 250/500) + 2 = 3.
			{at: 1250 * ms, hits: 0, want: under(4, 1, 501)},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runScript(t, tc.lim, State{}, tc.acts)
		})
	}
}

func TestModes(t *testing.T) {
	t.Parallel()
	t.Run("soft: 20% over, remaining against the real limit", func(t *testing.T) {
		t.Parallel()
		lim := Limit{Algorithm: FixedWindow, Limit: 10, WindowMS: 1000, Mode: ModeSoft, SoftPercent: 20}
		runScript(t, lim, State{}, []act{
			{at: 0, hits: 9, want: under(10, 1, 1000)},
			{at: 0, hits: 1, want: under(10, 0, 1000)},
			{at: 0, hits: 2, want: under(10, 0, 1000)},      // 12 of 12
			{at: 0, hits: 1, want: over(10, 0, 1000, 1000)}, // 13 > 12
		})
	})
	t.Run("soft token bucket: burst and rate scale", func(t *testing.T) {
		t.Parallel()
		// 10 per s, burst 10, 50%: 15 tokens, one per 66.7 ms.
		lim := Limit{Algorithm: TokenBucket, Limit: 10, WindowMS: 1000, Mode: ModeSoft, SoftPercent: 50}
		runScript(t, lim, State{}, []act{
			{at: 0, hits: 15, want: under(10, 0, 1000)},      // 15 tokens refill in 1 s
			{at: 0, hits: 1, want: over(10, 0, 1000, 67)},    // 66666667 ns per token
			{at: 500 * ms, hits: 0, want: under(10, 2, 500)}, // 7.5 tokens, 5 of them headroom
			{at: 1000 * ms, hits: 0, want: under(10, 10, 0)}, // 15 tokens: 10 against the real burst
		})
	})
	t.Run("elastic: the ceiling while load is low", func(t *testing.T) {
		t.Parallel()
		lim := Limit{Algorithm: FixedWindow, Limit: 10, WindowMS: 1000, Mode: ModeElastic, ElasticCeiling: 15, ElasticLoadPercent: 70}
		s := runScript(t, lim, State{}, []act{
			{at: 0, hits: 10, want: under(10, 0, 1000), load: 0.5},
			{at: 0, hits: 1, want: over(10, 0, 1000, 1000), load: 0.7},        // 70% is not below 70%
			{at: 0, hits: 1, want: over(10, 0, 1000, 1000), load: math.NaN()}, // unknown load: no headroom
			{at: 0, hits: 5, want: under(10, 0, 1000), load: 0.69},
			{at: 0, hits: 1, want: over(10, 0, 1000, 1000), load: 0}, // 16 > ceiling
		})
		// Decide knows no load: the plain limit.
		if d := Decide(&s, lim, 0, t0+500*ms); d.Allowed() || d.Remaining != 0 {
			t.Fatalf("Decide with a full window: %+v", d)
		}
		if d := Decide(&s, lim, 10, t0+1500*ms); !d.Allowed() {
			t.Fatalf("Decide in a new window: %+v", d)
		}
		if d := Decide(&s, lim, 1, t0+1500*ms); d.Allowed() {
			t.Fatalf("Decide over the real limit at unknown load: %+v", d)
		}
	})
	t.Run("elastic gcra: rate and burst scale with the ceiling", func(t *testing.T) {
		t.Parallel()
		// 10 per s burst 4; ceiling 20: burst 8, 50 ms per hit.
		lim := Limit{Algorithm: GCRA, Limit: 10, WindowMS: 1000, Burst: 4, Mode: ModeElastic, ElasticCeiling: 20, ElasticLoadPercent: 50}
		runScript(t, lim, State{}, []act{
			{at: 0, hits: 8, want: under(10, 0, 400), load: 0.1},
			{at: 0, hits: 1, want: over(10, 0, 400, 50), load: 0.1},
			// Under load the plain limit (100 ms per hit, burst 4) reads the same TAT.
			{at: 0, hits: 1, want: over(10, 0, 400, 100), load: 0.9},
		})
	})
}

func TestCountRefused(t *testing.T) {
	t.Parallel()
	t.Run("sliding window", func(t *testing.T) {
		t.Parallel()
		lim := Limit{Algorithm: SlidingWindow, Limit: 4, WindowMS: 1000, CountRefused: true}
		// 4 hits weigh 0 from 750 ms + 1 ns into the next window: reset
		// 1750000001 ns. At 1500 ms they weigh 2: 2 + 3 > 4. The 3 refused
		// hits count in [1000, 2000): estimate 5. Reset: 3 weigh 0 from
		// 666666667 ns into [2000, 3000): 2666666667 − 1500 ms. Retry:
		// the 3 must weigh ≤ 1, from 333333334 ns into it.
		s := runScript(t, lim, State{}, []act{
			{at: 0, hits: 4, want: under(4, 0, 1751)},
			{at: 1500 * ms, hits: 3, want: over(4, 0, 1167, 834)},
		})
		if s.Count != 3 || s.Prev != 4 {
			t.Fatalf("state %+v: the refused hits should count", s)
		}
		plain := lim
		plain.CountRefused = false
		// Without: estimate 2, remaining 2; the 4 weigh ≤ 1 from 1500 ms + 1 ns.
		s2 := runScript(t, plain, State{}, []act{
			{at: 0, hits: 4, want: under(4, 0, 1751)},
			{at: 1500 * ms, hits: 3, want: over(4, 2, 251, 1)},
		})
		if s2.Count != 4 || s2.Start != t0 {
			t.Fatalf("state %+v: refused hits changed it", s2)
		}
	})
	t.Run("token bucket", func(t *testing.T) {
		t.Parallel()
		lim := Limit{Algorithm: TokenBucket, Limit: 10, WindowMS: 1000, Burst: 5, CountRefused: true}
		runScript(t, lim, State{}, []act{
			{at: 0, hits: 5, want: under(10, 0, 500)},
			{at: 50 * ms, hits: 1, want: over(10, 0, 500, 100)},  // 0.5 tokens, emptied
			{at: 150 * ms, hits: 1, want: under(10, 0, 500)},     // 1 token, not 1.5
			{at: 150 * ms, hits: 0, want: over(10, 0, 500, 100)}, // a peek consumes nothing
			{at: 250 * ms, hits: 1, want: under(10, 0, 500)},
		})
	})
	t.Run("sliding log", func(t *testing.T) {
		t.Parallel()
		lim := Limit{Algorithm: SlidingLog, Limit: 2, WindowMS: 1000, CountRefused: true}
		runScript(t, lim, State{}, []act{
			{at: 0, hits: 2, want: under(2, 0, 1000)},
			{at: 500 * ms, hits: 1, want: over(2, 0, 1000, 500)},   // logged at 500: [0, 500]
			{at: 1000 * ms, hits: 2, want: over(2, 0, 1000, 1000)}, // [500] + 2 > 2; logged: [1000, 1000]
			{at: 1999 * ms, hits: 1, want: over(2, 0, 1000, 1)},    // newest 2 kept: [1000, 1999]
			{at: 2999 * ms, hits: 2, want: under(2, 0, 1000)},
		})
	})
	t.Run("fixed window saturates at the limit", func(t *testing.T) {
		t.Parallel()
		lim := Limit{Algorithm: FixedWindow, Limit: 5, WindowMS: 1000, CountRefused: true}
		s := runScript(t, lim, State{}, []act{
			{at: 0, hits: 3, want: under(5, 2, 1000)},
			{at: 0, hits: math.MaxInt64, want: over(5, 0, 1000, 1000)},
			{at: 1000 * ms, hits: 5, want: under(5, 0, 1000)},
		})
		if s.Count != 5 {
			t.Fatalf("state %+v", s)
		}
	})
}

func utc(y int, m time.Month, d, h, min int) int64 {
	return time.Date(y, m, d, h, min, 0, 0, time.UTC).UnixNano()
}

func TestCalendarWindows(t *testing.T) {
	t.Parallel()
	const day = 24 * 3600 * 1000 // ms
	monthly := Limit{Algorithm: FixedWindow, Limit: 2, WindowMS: 30 * day, Calendar: CalendarMonth}
	tests := []struct {
		name string
		lim  Limit
		at   int64 // first request, 2 hits
		next int64 // the window's end
	}{
		{"January ends", monthly, utc(2024, 1, 31, 23, 59), utc(2024, 2, 1, 0, 0)},
		{"February of a leap year", monthly, utc(2024, 2, 1, 0, 0), utc(2024, 3, 1, 0, 0)},
		{"February 29", monthly, utc(2024, 2, 29, 12, 0), utc(2024, 3, 1, 0, 0)},
		{"February of a common year", monthly, utc(2023, 2, 10, 0, 0), utc(2023, 3, 1, 0, 0)},
		{"2000 is a leap year", monthly, utc(2000, 2, 28, 0, 0), utc(2000, 3, 1, 0, 0)},
		{"2100 is not", monthly, utc(2100, 2, 28, 0, 0), utc(2100, 3, 1, 0, 0)},
		{"the year ends", monthly, utc(2023, 12, 31, 23, 0), utc(2024, 1, 1, 0, 0)},
		{"April has 30 days", monthly, utc(2024, 4, 30, 23, 0), utc(2024, 5, 1, 0, 0)},
		{"day: Feb 28 of a leap year", Limit{Algorithm: FixedWindow, Limit: 2, WindowMS: day, Calendar: CalendarDay}, utc(2024, 2, 28, 22, 0), utc(2024, 2, 29, 0, 0)},
		{"day: Feb 29", Limit{Algorithm: FixedWindow, Limit: 2, WindowMS: day, Calendar: CalendarDay}, utc(2024, 2, 29, 1, 0), utc(2024, 3, 1, 0, 0)},
		// 2024-01-01 was a Monday.
		{"week: Sunday night", Limit{Algorithm: FixedWindow, Limit: 2, WindowMS: 7 * day, Calendar: CalendarWeek}, utc(2024, 1, 7, 23, 0), utc(2024, 1, 8, 0, 0)},
		{"week: Monday", Limit{Algorithm: FixedWindow, Limit: 2, WindowMS: 7 * day, Calendar: CalendarWeek}, utc(2024, 1, 8, 0, 0), utc(2024, 1, 15, 0, 0)},
		{"week across a year", Limit{Algorithm: FixedWindow, Limit: 2, WindowMS: 7 * day, Calendar: CalendarWeek}, utc(2024, 12, 31, 0, 0), utc(2025, 1, 6, 0, 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			left := (tc.next - tc.at) / ms
			var s State
			if d := Decide(&s, tc.lim, 2, tc.at); d != under(2, 0, left) {
				t.Fatalf("first: %+v, want reset %d ms", d, left)
			}
			if d := Decide(&s, tc.lim, 1, tc.next-1); d != over(2, 0, 1, 1) {
				t.Fatalf("1 ns before the edge: %+v", d)
			}
			if s.Expires != tc.next {
				t.Fatalf("Expires %v, want %v", time.Unix(0, s.Expires).UTC(), time.Unix(0, tc.next).UTC())
			}
			if d := Decide(&s, tc.lim, 2, tc.next); !d.Allowed() {
				t.Fatalf("at the edge: %+v", d)
			}
		})
	}
}

// windowAt agrees with package time for every calendar, and saturates
// at the end of int64 time.
func TestWindowAt(t *testing.T) {
	t.Parallel()
	lastSafe := utc(2262, 3, 1, 0, 0)
	for i := range 20000 {
		at := int64(i) * (lastSafe / 20000)
		at += int64(i*7919) % nsPerDay
		for cal := CalendarDay; cal <= CalendarMonth; cal++ {
			s, e := windowAt(cal, nil, 0, at)
			rs, re := refWindow(cal, 0, at)
			if cal == CalendarWeek {
				rs = max(rs, 0)
			}
			if s != rs || e != re || s > at || e <= at {
				t.Fatalf("%v at %v: [%d, %d), want [%d, %d)", cal, time.Unix(0, at).UTC(), s, e, rs, re)
			}
		}
	}
	for cal := CalendarDay; cal <= CalendarMonth; cal++ {
		if s, e := windowAt(cal, nil, 0, math.MaxInt64); e != math.MaxInt64 || s < math.MaxInt64-32*nsPerDay {
			t.Errorf("%v at MaxInt64: [%d, %d)", cal, s, e)
		}
		if s, e := windowAt(cal, nil, 0, 0); s != 0 || e <= 0 {
			t.Errorf("%v at 0: [%d, %d)", cal, s, e)
		}
	}
}
