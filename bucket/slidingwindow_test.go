package bucket

import (
	"math"
	"math/rand/v2"
	"testing"
)

const (
	ms  = nsPerMS                              // one millisecond in ns
	sec = 1000 * ms                            // one second in ns
	t0  = int64(1_700_006_400) * 1_000_000_000 // 2023-11-15T00:00:00Z: aligned to 1 ms, 3 ms, 1 s, 1 min, 1 h and 1 day
)

func sw(limit, windowMS int64) Limit {
	return Limit{Algorithm: SlidingWindow, Limit: limit, WindowMS: windowMS}
}

func under(limit, remaining, resetMS int64) Decision {
	return Decision{Status: UnderLimit, Limit: limit, Remaining: remaining, ResetAfterMS: resetMS}
}

func over(limit, remaining, resetMS, retryMS int64) Decision {
	return Decision{Status: OverLimit, Limit: limit, Remaining: remaining, ResetAfterMS: resetMS, RetryAfterMS: retryMS}
}

// step is one request of a scenario: hits at t0+at, the decision it must
// get and the counters (Start relative to t0) the state must hold after it.
type step struct {
	at, hits          int64
	want              Decision
	start, count, prv int64
}

// The expected numbers below are computed by hand from
//
//	estimate = floor(Prev × (W − elapsed) / W) + Count
//
// with W = 1 s = 1e9 ns unless said otherwise. The first instant at which
// floor(n × (W − e) / W) ≤ r is e = W − (ceil((r+1) × W / n) − 1); for
// example n = 3, r = 0: e = 1e9 − 333333333 = 666666667 ns.
// One table of cases; long on purpose: each case reads alone.
func TestDecideScenarios(t *testing.T) {
	t.Parallel()
	full := func(start, count, prev int64) State {
		return State{Algorithm: SlidingWindow, Start: t0 + start, Count: count, Prev: prev, Expires: t0 + start + 2*sec}
	}
	tests := []struct {
		name  string
		lim   Limit
		state State
		steps []step
	}{{
		name: "fill, refuse, peek, roll over, gap",
		lim:  sw(3, 1000),
		steps: []step{
			// Reset: the one hit weighs floor(1 × (W−e)/W) = 0 from e = 1 ns into the next window.
			{at: 0, hits: 1, want: under(3, 2, 1001), count: 1},
			// Reset: 1e9 + 666666667 − 100e6 = 1566666667 ns.
			{at: 100 * ms, hits: 2, want: under(3, 0, 1567), count: 3},
			// Refused: nothing consumed. Retry: floor(3 × (W−e)/W) ≤ 2 from e = 1 ns into the next window: 1e9 + 1 − 200e6 ns.
			{at: 200 * ms, hits: 1, want: over(3, 0, 1467, 801), count: 3},
			{at: 200 * ms, hits: 3, want: over(3, 0, 1467, 1467), count: 3},
			// Peek: same answer as one hit, nothing changes.
			{at: 200 * ms, hits: 0, want: over(3, 0, 1467, 801), count: 3},
			// Peek 1 ns before the edge: Retry 2 ns, Reset 666666668 ns.
			{at: sec - 1, hits: 0, want: over(3, 0, 667, 1), count: 3},
			// At the edge the previous window weighs fully: 3.
			{at: sec, hits: 1, want: over(3, 0, 667, 1), count: 3},
			// 1 ns later it weighs floor(3 × (1e9−1)/1e9) = 2. Reset: 1e9 + 1 − 1 ns.
			{at: sec + 1, hits: 1, want: under(3, 0, 1000), start: sec, count: 1, prv: 3},
			// Half-way: floor(1.5) + 1 = 2. Reset: 1e9 + 500000001 − 500e6 ns.
			{at: 1500 * ms, hits: 1, want: under(3, 0, 1001), start: sec, count: 2, prv: 3},
			// Retry: floor(3 × (W−e)/W) ≤ 0 from e = 666666667: 166666667 ns.
			{at: 1500 * ms, hits: 0, want: over(3, 0, 1001, 167), start: sec, count: 2, prv: 3},
			// Two windows later everything is forgotten.
			{at: 3500 * ms, hits: 3, want: under(3, 0, 1167), start: 3 * sec, count: 3},
		},
	}, {
		name:  "previous window weighted at 0 ms",
		lim:   sw(10, 1000),
		state: full(0, 10, 4),
		// Retry: floor(10 × (W−e)/W) ≤ 9 from e = 1 ns. Reset: ≤ 0 from e = 900000001.
		steps: []step{{at: sec, hits: 1, want: over(10, 0, 901, 1), count: 10, prv: 4}},
	}, {
		name:  "previous window weighted at 250 ms",
		lim:   sw(10, 1000),
		state: full(0, 10, 4),
		// floor(7.5) = 7, + 1 = 8. Reset: 1e9 + 1 − 250e6 ns.
		steps: []step{{at: 1250 * ms, hits: 1, want: under(10, 2, 751), start: sec, count: 1, prv: 10}},
	}, {
		name:  "previous window weighted at 500 ms, refused",
		lim:   sw(10, 1000),
		state: full(0, 10, 4),
		// 5 + 6 > 10. Retry: floor(10 × (W−e)/W) ≤ 4 from e = 500000001. Reset: 900000001 − 500e6.
		steps: []step{{at: 1500 * ms, hits: 6, want: over(10, 5, 401, 1), count: 10, prv: 4}},
	}, {
		name:  "previous window weighted at 500 ms, admitted",
		lim:   sw(10, 1000),
		state: full(0, 10, 4),
		// Reset: 1e9 + (1e9 − 199999999) − 500e6 = 1300000001 ns.
		steps: []step{{at: 1500 * ms, hits: 5, want: under(10, 0, 1301), start: sec, count: 5, prv: 10}},
	}, {
		name:  "previous window weighted at 900 ms",
		lim:   sw(10, 1000),
		state: full(0, 10, 4),
		// floor(1) + 9. Reset: 1e9 + (1e9 − 111111111) − 900e6 = 988888889 ns.
		steps: []step{{at: 1900 * ms, hits: 9, want: under(10, 0, 989), start: sec, count: 9, prv: 10}},
	}, {
		name:  "previous window weighted at 999 ms",
		lim:   sw(10, 1000),
		state: full(0, 10, 4),
		// floor(0.01) = 0. Reset: 1e9 + 900000001 − 999e6 = 901000001 ns.
		steps: []step{{at: 1999 * ms, hits: 10, want: under(10, 0, 902), start: sec, count: 10, prv: 10}},
	}, {
		name:  "previous window weighted in its last ns",
		lim:   sw(10, 1000),
		state: full(0, 10, 4),
		// floor(10 × 1/1e9) = 0. Reset: 1e9 + 900000001 − (1e9 − 1) = 900000002 ns.
		steps: []step{{at: 2*sec - 1, hits: 10, want: under(10, 0, 901), start: sec, count: 10, prv: 10}},
	}, {
		name:  "3 ms window at 1 ms",
		lim:   sw(5, 3),
		state: State{Algorithm: SlidingWindow, Start: t0, Count: 5, Expires: t0 + 6*ms},
		// floor(5 × 2/3) = 3, + 2. Reset: 3e6 + 1500001 − 1e6 ns.
		steps: []step{{at: 4 * ms, hits: 2, want: under(5, 0, 4), start: 3 * ms, count: 2, prv: 5}},
	}, {
		name:  "3 ms window at 2 ms",
		lim:   sw(5, 3),
		state: State{Algorithm: SlidingWindow, Start: t0, Count: 5, Expires: t0 + 6*ms},
		// floor(5/3) = 1, + 1. Reset: 3e6 + 1 − 2e6 ns.
		steps: []step{{at: 5 * ms, hits: 1, want: under(5, 3, 2), start: 3 * ms, count: 1, prv: 5}},
	}, {
		name:  "gap of exactly two windows",
		lim:   sw(10, 1000),
		state: full(0, 10, 10),
		steps: []step{{at: 2 * sec, hits: 10, want: under(10, 0, 1901), start: 2 * sec, count: 10}},
	}, {
		name:  "gap of many windows",
		lim:   sw(10, 1000),
		state: full(0, 10, 10),
		steps: []step{{at: 7*sec + 123*ms, hits: 10, want: under(10, 0, 1778), start: 7 * sec, count: 10}},
	}, {
		name: "hits over the limit on an empty counter",
		lim:  sw(5, 1000),
		// Never admissible: retry is at least one window, never 0.
		steps: []step{{at: 0, hits: 6, want: over(5, 5, 0, 1000)}},
	}, {
		name:  "hits over the limit on a busy counter",
		lim:   sw(5, 1000),
		state: full(0, 3, 0),
		steps: []step{{at: 100 * ms, hits: math.MaxInt64, want: over(5, 2, 1567, 1567), count: 3}},
	}, {
		name:  "zero limit refuses everything",
		lim:   sw(0, 1000),
		steps: []step{{at: 0, hits: 0, want: over(0, 0, 0, 1000)}, {at: 0, hits: 1, want: over(0, 0, 0, 1000)}},
	}, {
		name:  "clock behind the state's window, refused",
		lim:   sw(10, 1000),
		state: full(sec, 7, 3),
		// The state's window starts 500 ms from now and weighs fully until then.
		// Retry: floor(3 × (W−e)/W) ≤ 2 from e = 1 ns after it: 500000001 ns.
		// Reset: 1e9 (ahead) − 500e6 + 1e9 + (1e9 − 142857142) = 2357142858 ns.
		steps: []step{{at: 500 * ms, hits: 1, want: over(10, 0, 2358, 501), start: sec, count: 7, prv: 3}},
	}, {
		name:  "state absurdly far ahead: waits saturate, never wrap to 0",
		lim:   sw(10, 1000),
		state: State{Algorithm: SlidingWindow, Start: math.MaxInt64 - 5, Count: 10, Expires: math.MaxInt64},
		// At now = 0: ceil(MaxInt64 ns / 1e6) = 9223372036855 ms.
		steps: []step{
			{at: -t0, hits: 1, want: over(10, 0, 9223372036855, 9223372036855)},
			{at: -t0, hits: 0, want: over(10, 0, 9223372036855, 9223372036855)},
		},
	}, {
		name:  "clock behind the state's window, admitted into it",
		lim:   sw(10, 1000),
		state: full(sec, 5, 3),
		steps: []step{{at: 500 * ms, hits: 2, want: under(10, 0, 2358), start: sec, count: 7, prv: 3}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.state
			for i, st := range tc.steps {
				before := s
				got := Decide(&s, tc.lim, st.hits, t0+st.at)
				if got != st.want {
					t.Fatalf("step %d (hits %d at +%d ns): got %+v, want %+v", i, st.hits, st.at, got, st.want)
				}
				if !got.Allowed() || st.hits == 0 {
					if s != before {
						t.Fatalf("step %d: refused or peek changed the state: %+v → %+v", i, before, s)
					}
					continue
				}
				if s.Start != t0+st.start || s.Count != st.count || s.Prev != st.prv {
					t.Fatalf("step %d: state %+v, want Start t0+%d Count %d Prev %d", i, s, st.start, st.count, st.prv)
				}
				if s.Algorithm != SlidingWindow || s.Expires != s.Start+2*tc.lim.WindowMS*ms {
					t.Fatalf("step %d: state %+v: want algorithm sliding_window, Expires Start + 2 windows", i, s)
				}
			}
		})
	}
}

// randomState returns a state that real traffic under lim could leave,
// around now: its window is the current one, one or several behind, or
// ahead (another node's clock), with counts up to the limit.
func randomState(rng *rand.Rand, lim Limit, now int64) State {
	w := lim.WindowMS * ms
	cur := now - now%w
	start := cur
	switch rng.IntN(6) {
	case 0:
		start = cur - w
	case 1:
		start = max(cur-w*(2+rng.Int64N(3)), 0)
	case 2:
		start = cur + w*(1+rng.Int64N(2))
	}
	count := rng.Int64N(lim.Limit + 1)
	return State{Algorithm: SlidingWindow, Start: start, Count: count, Prev: rng.Int64N(lim.Limit + 1), Expires: start + 2*w}
}

func randomLimit(rng *rand.Rand) Limit {
	windows := []int64{1, 2, 3, 7, 10, 1000, 1001, 60_000, 3_600_000, MaxWindowMS}
	limits := []int64{1, 2, 3, 10, 999, 1000, 1 << 20, MaxLimit}
	lim := sw(limits[rng.IntN(len(limits))], windows[rng.IntN(len(windows))])
	if rng.IntN(2) == 0 {
		lim.Limit = 1 + rng.Int64N(1000)
	}
	return lim
}

// TestRetryAfterIsExact checks on random states that waiting exactly
// RetryAfterMS admits the same request and waiting 1 ms less does not.
func TestRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	refused := 0
	for range 20000 {
		lim := randomLimit(rng)
		now := t0 + rng.Int64N(400*24*3600*sec)
		s := randomState(rng, lim, now)
		hits := rng.Int64N(min(lim.Limit, 1000) + 1)
		if rng.IntN(3) == 0 {
			hits = lim.Limit - rng.Int64N(min(lim.Limit, 3)+1)
		}
		before := s
		d := Decide(&s, lim, hits, now)
		if d.Allowed() {
			if d.RetryAfterMS != 0 {
				t.Fatalf("allowed with retry %d: %+v", d.RetryAfterMS, d)
			}
			continue
		}
		refused++
		if d.RetryAfterMS <= 0 {
			t.Fatalf("refused with retry %d: state %+v lim %+v hits %d now %d", d.RetryAfterMS, before, lim, hits, now)
		}
		later := before
		if d2 := Decide(&later, lim, hits, now+d.RetryAfterMS*ms); !d2.Allowed() {
			t.Fatalf("not admitted after RetryAfter %d ms: state %+v lim %+v hits %d now %d: %+v", d.RetryAfterMS, before, lim, hits, now, d2)
		}
		earlier := before
		if d2 := Decide(&earlier, lim, hits, now+(d.RetryAfterMS-1)*ms); d2.Allowed() {
			t.Fatalf("admitted 1 ms before RetryAfter %d ms: state %+v lim %+v hits %d now %d", d.RetryAfterMS, before, lim, hits, now)
		}
	}
	if refused < 1000 {
		t.Fatalf("only %d refusals: the generator is too kind", refused)
	}
}

// TestResetAfterIsExact checks on random states that after ResetAfterMS
// the whole limit is available again, and not 1 ms earlier.
func TestResetAfterIsExact(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		lim := randomLimit(rng)
		now := t0 + rng.Int64N(400*24*3600*sec)
		s := randomState(rng, lim, now)
		d := Decide(&s, lim, rng.Int64N(min(lim.Limit, 1000)+1), now)
		peek := func(at int64) int64 {
			c := s
			return Decide(&c, lim, 0, at).Remaining
		}
		if r := peek(now + d.ResetAfterMS*ms); r != lim.Limit {
			t.Fatalf("remaining %d after ResetAfter %d ms, want %d: state %+v", r, d.ResetAfterMS, lim.Limit, s)
		}
		if d.ResetAfterMS > 0 {
			if r := peek(now + (d.ResetAfterMS-1)*ms); r == lim.Limit {
				t.Fatalf("remaining already %d 1 ms before ResetAfter %d ms: state %+v", r, d.ResetAfterMS, s)
			}
		}
	}
}

// TestClockBehindNeverOverAdmits replays traffic from a node whose clock
// runs behind the state's: the aligned window the state counts in never
// holds more than the limit, and nothing panics.
func TestClockBehindNeverOverAdmits(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		lim := randomLimit(rng)
		lim.Limit = 1 + rng.Int64N(100)
		w := lim.WindowMS * ms
		now := t0 + rng.Int64N(100*w)
		s := randomState(rng, lim, now)
		s.Start = now - now%w + w*(1+rng.Int64N(3))
		if rng.IntN(4) == 0 {
			s.Start = now + 1 + rng.Int64N(math.MaxInt64-now) // unaligned, possibly absurdly far
		}
		for range 50 {
			start := s.Start
			d := Decide(&s, lim, rng.Int64N(lim.Limit+2), now)
			if s.Start == start && s.Count > lim.Limit {
				t.Fatalf("window at %d holds %d > limit %d", start, s.Count, lim.Limit)
			}
			if !d.Allowed() && d.RetryAfterMS <= 0 {
				t.Fatalf("refused with retry %d", d.RetryAfterMS)
			}
			if d.Remaining < 0 || d.Remaining > lim.Limit || d.ResetAfterMS < 0 {
				t.Fatalf("bad decision %+v", d)
			}
			now += rng.Int64N(w / 4)
		}
	}
}

func TestDecideExtremes(t *testing.T) {
	t.Parallel()
	lim := sw(MaxLimit, MaxWindowMS)
	w := MaxWindowMS * ms
	for _, now := range []int64{0, 1, math.MaxInt64 / 2, math.MaxInt64/2 + w - 1, math.MaxInt64 - 3*w, math.MaxInt64 - w - 1, math.MaxInt64 - 1, math.MaxInt64} {
		var s State
		if d := Decide(&s, lim, math.MaxInt64, now); d.Allowed() || d.RetryAfterMS <= 0 || d.Remaining != MaxLimit || s != (State{}) {
			t.Errorf("now %d: hits MaxInt64: %+v, state %+v", now, d, s)
		}
		if d := Decide(&s, lim, MaxLimit, now); !d.Allowed() || d.Remaining != 0 || d.ResetAfterMS <= 0 {
			t.Errorf("now %d: hits 2^40 on a fresh counter: %+v", now, d)
		}
		if s.Count != MaxLimit || s.Expires < now || s.Fresh(now) {
			t.Errorf("now %d: state after 2^40 hits: %+v (fresh %v)", now, s, s.Fresh(now))
		}
		b, _ := s.MarshalBinary()
		var back State
		if err := back.UnmarshalBinary(b); err != nil || back != s {
			t.Errorf("now %d: state %+v does not survive encoding: %v", now, s, err)
		}
		before := s
		d := Decide(&s, lim, 1, now)
		if d.Allowed() || d.RetryAfterMS <= 0 || d.Remaining != 0 || s != before {
			t.Errorf("now %d: one more hit: %+v", now, d)
		}
		if at := now + d.RetryAfterMS*ms; at > now && at <= math.MaxInt64-w {
			c := before
			if !Decide(&c, lim, 1, at).Allowed() {
				t.Errorf("now %d: not admitted after RetryAfter %d ms", now, d.RetryAfterMS)
			}
			c = before
			if Decide(&c, lim, 1, at-ms).Allowed() {
				t.Errorf("now %d: admitted 1 ms before RetryAfter %d ms", now, d.RetryAfterMS)
			}
			c = before
			if r := Decide(&c, lim, 0, now+d.ResetAfterMS*ms).Remaining; r != MaxLimit {
				t.Errorf("now %d: remaining %d after ResetAfter %d ms", now, r, d.ResetAfterMS)
			}
		}
	}
	// A 1 ms window with the largest limit, and the smallest limit with the longest window.
	for _, lim := range []Limit{sw(MaxLimit, 1), sw(1, MaxWindowMS)} {
		s := State{}
		now := int64(math.MaxInt64 / 2)
		if d := Decide(&s, lim, lim.Limit, now); !d.Allowed() {
			t.Errorf("%+v: %+v", lim, d)
		}
		if d := Decide(&s, lim, lim.Limit, now+1); d.Allowed() || d.RetryAfterMS <= 0 {
			t.Errorf("%+v: %+v", lim, d)
		}
	}
}

// A state written by another algorithm is replaced only by an admission:
// a peek or a refusal leaves it alone.
func TestDecideForeignAlgorithmState(t *testing.T) {
	t.Parallel()
	foreign := State{Algorithm: TokenBucket, Start: 5, Count: 7, Prev: 1, Expires: 9}
	s := foreign
	if d := Decide(&s, sw(10, 1000), 0, t0); !d.Allowed() || d.Remaining != 10 || s != foreign {
		t.Fatalf("peek: %+v, state %+v", d, s)
	}
	if d := Decide(&s, sw(10, 1000), 11, t0); d.Allowed() || s != foreign {
		t.Fatalf("refused: %+v, state %+v", d, s)
	}
	if d := Decide(&s, sw(10, 1000), 4, t0); !d.Allowed() || d.Remaining != 6 {
		t.Fatalf("admitted: %+v", d)
	}
	if want := (State{Algorithm: SlidingWindow, Start: t0, Count: 4, Expires: t0 + 2*sec}); s != want {
		t.Fatalf("state %+v, want %+v", s, want)
	}
}

// When the window of a limit grows, an admission must push Expires out to
// the new window's horizon, or a store drops a state that still counts.
func TestDecideWindowChangeKeepsState(t *testing.T) {
	t.Parallel()
	var s State
	Decide(&s, sw(100, 1000), 5, t0)
	d := Decide(&s, sw(100, 60_000), 1, t0+1500*ms)
	if !d.Allowed() || d.Remaining != 94 {
		t.Fatalf("%+v", d)
	}
	if s.Fresh(t0+2*sec) || s.Expires != t0+120*sec {
		t.Fatalf("state %+v: fresh at t0+2s while it counts 6 hits in a 60 s window", s)
	}
}

// Fresh means equivalent to the zero State: from Expires on, every
// request gets the answer a fresh counter would give.
func TestFreshIsEquivalentToZero(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	var zero State
	if !zero.Fresh(0) {
		t.Fatal("zero state is not fresh")
	}
	for range 5000 {
		lim := randomLimit(rng)
		now := t0 + rng.Int64N(1000*sec)
		var s State
		for range 1 + rng.IntN(5) {
			Decide(&s, lim, rng.Int64N(min(lim.Limit, 100)+1), now)
			now += rng.Int64N(lim.WindowMS * ms)
		}
		if s.Fresh(now) {
			continue
		}
		for _, at := range []int64{s.Expires, s.Expires + 1, s.Expires + rng.Int64N(3*lim.WindowMS*ms)} {
			hits := rng.Int64N(min(lim.Limit, 100) + 1)
			a, z := s, State{}
			if got, want := Decide(&a, lim, hits, at), Decide(&z, lim, hits, at); got != want {
				t.Fatalf("at Expires+%d: got %+v, a fresh counter gets %+v (state %+v)", at-s.Expires, got, want, s)
			}
		}
	}
}

// Not parallel: AllocsPerRun counts the allocations of the whole process.
func TestDecideAllocatesNothing(t *testing.T) {
	var s State
	lim := sw(1000, 1000)
	now := t0
	allocs := testing.AllocsPerRun(1000, func() {
		now += ms
		Decide(&s, lim, 1, now)
		Decide(&s, lim, 2000, now)
	})
	if allocs != 0 {
		t.Fatalf("Decide allocates %v times per call", allocs)
	}
}
