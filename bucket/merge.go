package bucket

import "math"

// Merge combines two copies of one counter that may have diverged (the two
// sides of a healed network partition each decided it) into one that is at
// least as strict as each of them, and reports whether Algorithm has such
// a rule. The rules are joins: commutative, idempotent and associative, so
// copies may be merged in any order and any number of times, and merging a
// copy with one of its own later states gives that later state (so normal
// replication, where the incoming copy descends from the held one, is
// unchanged):
//
//   - fixed window: in the same window the larger count wins; otherwise the
//     later window, the earlier one being over;
//   - GCRA and the leaky bucket: the later theoretical arrival time (TAT)
//     wins, the one that has seen more debt;
//   - sliding log: the union of both logs (a timestamp appearing k times in
//     one and j in the other appears max(k, j) times: the entries both
//     sides inherited count once), without the entries expired by the
//     newest of them (at most MaxLogLimit, the newest: a log longer than
//     its limit refuses until enough of it expires, and only the newest
//     limit entries matter to a decision).
//
// Each side admitted at most the limit on its own, and the merged copy is
// at least as strict as each, so admissions after the merge keep within
// sides × limit (TestMergeIsAtLeastAsStrict checks it against Decide).
//
// For the token bucket and the sliding-window counters, and when either
// copy is fresh or the algorithms or the epochs differ, it returns false
// and the caller keeps its own rule: the newer version wins. (Copies of
// different epochs are on either side of a Reset: the larger count is the
// one the reset forgot.) (A token bucket's level can
// only be compared at one time with its refill rate, which the state does
// not hold; the sliding-window counter is approximate by design.)
func Merge(a, b State) (State, bool) {
	if a.Algorithm != b.Algorithm || a.Epoch != b.Epoch {
		return State{}, false
	}
	switch a.Algorithm {
	case FixedWindow:
		return mergeFixedWindow(a, b), true
	case GCRA, LeakyBucket:
		if cmpTAT(b, a) > 0 {
			return b, true
		}
		return a, true
	case SlidingLog:
		if a.Ext == nil || b.Ext == nil {
			return State{}, false
		}
		return mergeLogs(a, b), true
	}
	return State{}, false
}

func mergeFixedWindow(a, b State) State {
	switch {
	case a.Start > b.Start:
		return a
	case b.Start > a.Start:
		return b
	case b.Count > a.Count:
		return b
	}
	return a
}

// cmpTAT compares the theoretical arrival times of two GCRA or leaky-bucket
// states: Start + Prev/Count ns (decideTAT). A fraction that is not one of
// a valid limit (Count 0, or Prev ≥ Count) is rounded up to a whole ns, as
// decideTAT reads it.
func cmpTAT(a, b State) int {
	ai, an, ad := tat(a)
	bi, bn, bd := tat(b)
	switch {
	case ai != bi:
		if ai < bi {
			return -1
		}
		return 1
	}
	// an/ad vs bn/bd, both in [0, 1).
	return mul128(an, bd).cmp(mul128(bn, ad))
}

// tat returns s's TAT as whole ns and a fraction num/den with den > 0.
func tat(s State) (whole, num, den int64) {
	if s.Prev == 0 {
		return s.Start, 0, 1
	}
	if s.Count <= 0 || s.Prev >= s.Count || s.Prev < 0 {
		return addSat(s.Start, 1), 0, 1
	}
	return s.Start, s.Prev, s.Count
}

// mergeLogs is Merge for two sliding logs (both with an Ext).
func mergeLogs(a, b State) State {
	x, y := a.Ext.vals, b.Ext.vals
	newest := max(x[len(x)-1], y[len(y)-1])
	// The window is Expires − the newest entry (decideSlidingLog); entries
	// at or before newest − W are expired at every time a decision can
	// follow both copies. With a saturated Expires nothing is dropped.
	var from int64 = -1
	for _, s := range [2]State{a, b} {
		last := s.Ext.vals[len(s.Ext.vals)-1]
		if w := s.Expires - last; w > 0 && s.Expires != math.MaxInt64 {
			from = max(from, newest-w)
		}
	}
	keep := int(MaxLogLimit)
	out := make([]int64, 0, len(x)+len(y))
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		// The next timestamp and how often each log holds it.
		var t int64
		switch {
		case j == len(y) || (i < len(x) && x[i] <= y[j]):
			t = x[i]
		default:
			t = y[j]
		}
		ni, nj := 0, 0
		for i < len(x) && x[i] == t {
			i, ni = i+1, ni+1
		}
		for j < len(y) && y[j] == t {
			j, nj = j+1, nj+1
		}
		if t <= from {
			continue
		}
		for range max(ni, nj) {
			out = append(out, t)
		}
	}
	if len(out) > keep {
		out = out[len(out)-keep:]
	}
	if len(out) == 0 {
		// Every entry expired: either copy says as much; keep the one
		// that expires later.
		if a.Expires >= b.Expires {
			return a
		}
		return b
	}
	m := State{Algorithm: SlidingLog, Expires: max(a.Expires, b.Expires), Ext: &Ext{vals: out}}
	// A merge that changes nothing returns the held copy itself, so that
	// the caller sees an unchanged state (State compares Ext by pointer).
	if sameVals(out, x) && m.Expires == a.Expires {
		return a
	}
	if sameVals(out, y) && m.Expires == b.Expires {
		return b
	}
	return m
}

func sameVals(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// MaxEpoch is the largest State.Epoch; Reset wraps around to 0 after it.
const MaxEpoch = 15

// Reset forgets what s counted: a decision on the result is one on a fresh
// counter (the full quota, a full bucket). The result is not fresh before
// s's own Expires, so that it is kept, copied to replicas and outranks
// (by version) every copy of the count it forgot until those expire too,
// and its Epoch is the next one, so that no copy of the forgotten count
// is merged into it (Merge). A fresh s is returned unchanged.
func Reset(s State, now int64) State {
	if s.Fresh(now) {
		return s
	}
	return State{Algorithm: s.Algorithm, Epoch: (s.Epoch + 1) & MaxEpoch, Expires: s.Expires}
}
