package bucket

import (
	"math/rand/v2"
	"testing"
)

func TestMerge(t *testing.T) {
	t.Parallel()
	fw := func(start, count int64) State {
		return State{Algorithm: FixedWindow, Start: start, Count: count, Expires: start + 100}
	}
	sw := State{Algorithm: SlidingWindow, Start: 100, Count: 3, Expires: 300}
	for _, tc := range []struct {
		name string
		a, b State
		want State
		ok   bool
	}{
		{"same window, larger count first", fw(100, 10), fw(100, 6), fw(100, 10), true},
		{"same window, larger count second", fw(100, 6), fw(100, 10), fw(100, 10), true},
		{"same window, same count", fw(100, 4), fw(100, 4), fw(100, 4), true},
		{"later window wins over a larger count", fw(100, 10), fw(200, 1), fw(200, 1), true},
		{"later window first", fw(200, 1), fw(100, 10), fw(200, 1), true},
		{"fresh copy: no rule", fw(100, 3), State{}, State{}, false},
		{"fresh held: no rule", State{}, fw(100, 3), State{}, false},
		{"other algorithm: no rule", sw, sw, State{}, false},
		{"mixed algorithms: no rule", fw(100, 3), sw, State{}, false},
	} {
		got, ok := Merge(tc.a, tc.b)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: Merge(%+v, %+v) = %+v, %v; want %+v, %v", tc.name, tc.a, tc.b, got, ok, tc.want, tc.ok)
		}
	}
}

// TestMergeKeepsSidesTimesLimit: two sides decide the same fixed-window
// counter from a common copy, each up to the limit, in random orders and
// windows; the merge of their copies (in either order) then admits no
// more than sides × limit in any window, counting what each side admitted.
// Merge is commutative and idempotent.
func TestMergeKeepsSidesTimesLimit(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	const w = int64(1_000_000_000) // 1 s windows
	for range 2000 {
		limit := int64(1 + rng.IntN(10))
		lim := Limit{Algorithm: FixedWindow, Limit: limit, WindowMS: w / 1e6}
		admitted := map[int64]int64{} // window start → admitted over the run
		var common State
		now := int64(rng.IntN(3)) * w
		for range rng.IntN(int(limit) + 1) {
			if Decide(&common, lim, 1, now).Status == UnderLimit {
				admitted[now-now%w]++
			}
		}
		sides := [2]State{common, common}
		for s := range sides {
			at := now
			for range rng.IntN(3 * int(limit)) {
				at += int64(rng.IntN(int(w / 2)))
				if Decide(&sides[s], lim, 1, at).Status == UnderLimit {
					admitted[at-at%w]++
				}
			}
		}
		if sides[0].Algorithm != FixedWindow && sides[1].Algorithm != FixedWindow {
			continue // no hit anywhere: nothing to merge
		}
		if sides[0].Algorithm != FixedWindow || sides[1].Algorithm != FixedWindow {
			// One side never admitted a hit (and had no common copy): the
			// caller keeps the other by its version.
			if _, ok := Merge(sides[0], sides[1]); ok {
				t.Fatal("merged a fresh copy")
			}
			continue
		}
		m1, ok1 := Merge(sides[0], sides[1])
		m2, ok2 := Merge(sides[1], sides[0])
		if !ok1 || !ok2 || m1 != m2 {
			t.Fatalf("not commutative: %+v, %v vs %+v, %v", m1, ok1, m2, ok2)
		}
		if again, _ := Merge(m1, m1); again != m1 {
			t.Fatalf("not idempotent: %+v → %+v", m1, again)
		}
		// After the merge, hit the merged counter until it refuses in its
		// window: the whole window then stays within 2 × limit.
		at := m1.Start
		for Decide(&m1, lim, 1, at).Status == UnderLimit {
			admitted[at-at%w]++
		}
		for start, n := range admitted {
			if n > 2*limit {
				t.Fatalf("window %d: %d admitted, limit %d, sides 2; copies %+v", start, n, limit, sides)
			}
		}
	}
}

// equalState compares two states by value, Ext by its values.
func equalState(a, b State) bool {
	if a.Algorithm != b.Algorithm || a.Start != b.Start || a.Count != b.Count || a.Prev != b.Prev || a.Expires != b.Expires {
		return false
	}
	return sameVals(a.Ext.values(), b.Ext.values())
}

func (e *Ext) values() []int64 {
	if e == nil {
		return nil
	}
	return e.vals
}

func TestMergeTAT(t *testing.T) {
	t.Parallel()
	g := func(start, prev, count int64) State {
		return State{Algorithm: GCRA, Start: start, Count: count, Prev: prev, Expires: start + 1}
	}
	for _, tc := range []struct {
		name string
		a, b State
		want State
	}{
		{"later TAT second", g(100, 0, 5), g(200, 0, 5), g(200, 0, 5)},
		{"later TAT first", g(200, 0, 5), g(100, 4, 5), g(200, 0, 5)},
		{"same ns, larger fraction", g(100, 1, 3), g(100, 2, 5), g(100, 2, 5)},
		{"same ns, fractions of other limits", g(100, 2, 3), g(100, 3, 5), g(100, 2, 3)},
		{"a fraction not of a valid limit is a whole ns more", g(100, 7, 5), g(100, 4, 5), g(100, 7, 5)},
		{"equal: the first", g(100, 1, 2), g(100, 2, 4), g(100, 1, 2)},
	} {
		got, ok := Merge(tc.a, tc.b)
		if !ok || got != tc.want {
			t.Errorf("%s: Merge(%+v, %+v) = %+v, %v; want %+v", tc.name, tc.a, tc.b, got, ok, tc.want)
		}
	}
	lb := State{Algorithm: LeakyBucket, Start: 5, Count: 1}
	if got, ok := Merge(lb, State{Algorithm: LeakyBucket, Start: 9, Count: 1}); !ok || got.Start != 9 {
		t.Errorf("leaky bucket: Merge = %+v, %v; want the later TAT", got, ok)
	}
	if _, ok := Merge(lb, g(9, 0, 1)); ok {
		t.Error("merged a leaky bucket with a GCRA state")
	}
	tb := State{Algorithm: TokenBucket, Start: 5, Count: 1}
	if _, ok := Merge(tb, tb); ok {
		t.Error("merged token buckets: no rule without the refill rate")
	}
}

func TestMergeLogs(t *testing.T) {
	t.Parallel()
	const w = 100
	log := func(vals ...int64) State {
		return State{Algorithm: SlidingLog, Expires: vals[len(vals)-1] + w, Ext: &Ext{vals: vals}}
	}
	for _, tc := range []struct {
		name string
		a, b State
		want State
	}{
		{"shared prefix counts once", log(10, 20, 30), log(10, 20, 40), log(10, 20, 30, 40)},
		{"repeated timestamps: the larger multiplicity", log(10, 10, 20), log(10, 20, 20), log(10, 10, 20, 20)},
		{"expired by the newest entry are dropped", log(10, 20), log(150, 160), log(150, 160)},
		{"distinct admissions of both sides", log(10, 20, 30), log(11, 21, 31), log(10, 11, 20, 21, 30, 31)},
		{"a later state of the same log is that state", log(10, 20, 30), log(20, 30, 140), log(140)},
	} {
		got, ok := Merge(tc.a, tc.b)
		if !ok || !equalState(got, tc.want) {
			t.Errorf("%s: Merge = %+v %v, %v; want %v", tc.name, got, got.Ext.values(), ok, tc.want.Ext.values())
		}
	}
	// The held copy itself when it has seen everything (so the caller
	// sees no change).
	a := log(10, 20, 30)
	if got, _ := Merge(a, log(10, 20)); got != a {
		t.Errorf("merge with a copy a has seen all of: %v, want a itself", got.Ext.values())
	}
}

// TestMergeIsAtLeastAsStrict: two copies decide one counter from a common
// state, in random orders, times and hit sizes (refused hits counted or
// not); their merge, in either order, then refuses every request that
// either copy refuses, at any later time; a run of single hits admits no
// more from the merge than from either copy; Merge is commutative,
// idempotent, associative, and merging a copy with one of its own later
// states gives that later state.
// Long on purpose: one random run (two copies, a merge), then each property.
func TestMergeIsAtLeastAsStrict(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	const w = int64(1_000_000_000)
	algs := []Algorithm{FixedWindow, GCRA, LeakyBucket, SlidingLog}
	for iter := range 4000 {
		alg := algs[iter%len(algs)]
		limit := int64(1 + rng.IntN(8))
		lim := Limit{Algorithm: alg, Limit: limit, WindowMS: w / 1e6, CountRefused: rng.IntN(4) == 0}
		if alg != FixedWindow && alg != SlidingLog && rng.IntN(2) == 0 {
			lim.Burst = limit + int64(rng.IntN(4))
		}
		hit := func() int64 { return int64(1 + rng.IntN(int(min(limit, 3)))) }
		var common State
		now := int64(rng.IntN(3)) * w
		for range rng.IntN(int(limit) + 2) {
			now += int64(rng.IntN(int(w / 4)))
			Decide(&common, lim, hit(), now)
		}
		var sides [3]State
		var last int64
		for s := range sides {
			sides[s] = common
			at := now
			for range rng.IntN(3 * int(limit)) {
				at += int64(rng.IntN(int(w / 3)))
				Decide(&sides[s], lim, hit(), at)
			}
			last = max(last, at)
		}
		a, b, c := sides[0], sides[1], sides[2]
		if a.Algorithm != alg || b.Algorithm != alg || c.Algorithm != alg {
			continue // a copy that never admitted: the caller keeps the other by version
		}
		m, ok := Merge(a, b)
		m2, ok2 := Merge(b, a)
		if !ok || !ok2 || !equalState(m, m2) {
			t.Fatalf("%v: not commutative: %+v vs %+v", alg, m, m2)
		}
		if again, _ := Merge(m, m); !equalState(again, m) {
			t.Fatalf("%v: not idempotent: %+v → %+v", alg, m, again)
		}
		l, _ := Merge(m, c)
		bc, _ := Merge(b, c)
		r, _ := Merge(a, bc)
		if !equalState(l, r) {
			t.Fatalf("%v: not associative: (a·b)·c = %+v %v, a·(b·c) = %+v %v", alg, l, l.Ext.values(), r, r.Ext.values())
		}
		// A later state of a's own: decide a on from last.
		later := a
		at := last
		for range 1 + rng.IntN(4) {
			at += int64(rng.IntN(int(w / 2)))
			Decide(&later, lim, hit(), at)
		}
		if !lim.CountRefused && later.Algorithm == alg {
			if got, _ := Merge(a, later); !equalState(got, later) {
				t.Fatalf("%v: merging a copy with its later state %+v %v gave %+v %v", alg, later, later.Ext.values(), got, got.Ext.values())
			}
		}
		// Single requests at later times: the merge refuses whatever a
		// copy refuses.
		for range 20 {
			t0 := last + int64(rng.IntN(int(2*w)))
			h := hit()
			mc, ac, bc := m, a, b
			dm := Decide(&mc, lim, h, t0)
			da := Decide(&ac, lim, h, t0)
			db := Decide(&bc, lim, h, t0)
			if dm.Status == UnderLimit && (da.Status != UnderLimit || db.Status != UnderLimit) {
				t.Fatalf("%v %+v: at %d the merge %+v %v admits %d hits, copies %+v %v (%v) and %+v %v (%v)",
					alg, lim, t0, m, m.Ext.values(), h, a, a.Ext.values(), da.Status, b, b.Ext.values(), db.Status)
			}
			// What is left, peeked (hits 0) before that request.
			pm, pa, pb := m, a, b
			rm, ra, rb := Decide(&pm, lim, 0, t0).Remaining, Decide(&pa, lim, 0, t0).Remaining, Decide(&pb, lim, 0, t0).Remaining
			if rm > min(ra, rb) {
				dm.Remaining, da.Remaining, db.Remaining = rm, ra, rb
				t.Fatalf("%v %+v: at %d the merge %+v leaves %d, copies %+v %d and %+v %d", alg, lim, t0, m, dm.Remaining, a, da.Remaining, b, db.Remaining)
			}
		}
		// A run of single hits from the same time: no more admitted.
		mc, ac, bc2 := m, a, b
		var nm, na, nb int
		t0 := last
		for range 3 * int(limit) {
			t0 += int64(rng.IntN(int(w / 8)))
			if Decide(&mc, lim, 1, t0).Status == UnderLimit {
				nm++
			}
			if Decide(&ac, lim, 1, t0).Status == UnderLimit {
				na++
			}
			if Decide(&bc2, lim, 1, t0).Status == UnderLimit {
				nb++
			}
		}
		if nm > min(na, nb) {
			t.Fatalf("%v %+v: a run of single hits admits %d from the merge, %d and %d from the copies", alg, lim, nm, na, nb)
		}
	}
}
