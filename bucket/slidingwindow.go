package bucket

import (
	"math"
	"math/bits"
)

const nsPerMS = int64(1_000_000)

// decideSlidingWindow is the sliding-window counter: two fixed windows
// aligned to the epoch, the previous one weighted by how much of it the
// sliding window still covers:
//
//	estimate = floor(Prev × (W − elapsed) / W) + Count
//
// A request of hits is admitted when estimate + hits ≤ limit. The bound
// (docs/algorithms.md): every aligned window admits at most limit, so any
// trailing window of length W admits at most 2 × limit; the estimate itself
// is exact when the previous window's hits were spread evenly.
func decideSlidingWindow(out *Decision, s *State, p *params, hits, now int64) {
	// The state is read and written field by field, never copied whole:
	// this is the path of every check, and a whole-struct copy of fields
	// just written one by one stalls the processor's store forwarding.
	w, limit := p.w, p.limit
	cur := now - now%w
	start, count, prev := s.Start, s.Count, s.Prev
	if s.Algorithm != SlidingWindow && s.Algorithm != AlgorithmUnspecified || s.Ext != nil {
		// Another algorithm's counter (the limit's algorithm changed), or
		// a sub-window counter's: count afresh; only an admission
		// replaces it. (A sub-window state read here is counted
		// conservatively below.)
		start, count, prev = 0, 0, 0
		if s.Ext != nil && s.Algorithm == SlidingWindow && !s.Fresh(now) {
			// Its hits, in the window that keeps them until its Expires.
			last := s.Expires - 1
			start, count = max(last-last%w-w, 0), min(extSum(s.Ext), MaxLimit)
		}
	}
	switch {
	case start == cur:
	case start > cur:
		// The state is ahead of this clock (another node's clock, or a
		// window length that changed): keep counting in its window.
		cur = start
	case start == cur-w:
		prev, count, start = count, 0, cur
	default:
		prev, count, start = 0, 0, cur
	}
	elapsed := min(now-cur, w)
	if elapsed < 0 {
		elapsed = 0
	}
	estimate := weigh(prev, w-elapsed, w) + count

	allowed := hits <= limit && estimate+hits <= limit
	if hits == 0 {
		allowed = estimate < limit
	}
	add := int64(0)
	switch {
	case allowed:
		add = hits
	case p.refused && hits > 0 && count < limit:
		// Refused hits count too, up to a full window.
		add = min(hits, limit-count)
	}
	if add > 0 {
		count += add
		estimate += add
		// Two windows after its start the state is forgotten. Set on
		// every admission: the window may have grown since the last one.
		s.Algorithm, s.Start, s.Count, s.Prev, s.Expires = SlidingWindow, start, count, prev, addSat(cur, 2*w)
		if s.Ext != nil {
			s.Ext = nil
		}
	}
	status, retry := UnderLimit, int64(0)
	if !allowed {
		status = OverLimit
		retry = ceilMS(retrySlidingWindow(count, prev, limit, max(hits, 1), now, cur, w))
	}
	*out = Decision{
		Status:       status,
		Remaining:    max(limit-estimate, 0),
		ResetAfterMS: ceilMS(resetSlidingWindow(count, prev, now, cur, w)),
		RetryAfterMS: retry,
	}
}

// weigh returns floor(n × part / whole) without overflow, for 0 ≤ part ≤
// whole and n ≥ 0.
func weigh(n, part, whole int64) int64 {
	if n == 0 || part <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(n), uint64(part))
	q, _ := bits.Div64(hi, lo, uint64(whole)) // hi < whole since part ≤ whole
	return int64(q)
}

// waitFor returns the smallest e in [0, w] at which
// floor(prev × (w − e) / w) ≤ room, for prev > 0 and room ≥ 0.
func waitFor(prev, room, w int64) int64 {
	if prev <= room {
		return 0
	}
	// Largest x = w − e with prev × x < (room+1) × w, that is
	// x = ceil((room+1) × w / prev) − 1.
	hi, lo := bits.Mul64(uint64(room+1), uint64(w))
	if hi >= uint64(prev) {
		return 0
	}
	q, r := bits.Div64(hi, lo, uint64(prev))
	if r != 0 {
		q++
	}
	x := int64(q) - 1
	if x >= w {
		return 0
	}
	return w - x
}

// retrySlidingWindow returns how long, from now, until hits would be
// admitted if nothing else arrived. hits > limit is never admitted: it
// returns the time until the counter is empty, and at least one window,
// so that a refusal never says "retry now".
//
// cur − now is in (−w, 0] unless the state is ahead of this clock, when it
// may be as large as MaxInt64: sums saturate rather than wrap.
func retrySlidingWindow(count, prev, limit, hits, now, cur, w int64) int64 {
	if hits > limit {
		return max(resetSlidingWindow(count, prev, now, cur, w), w)
	}
	if count+hits <= limit {
		return max(addSat(cur-now, waitFor(prev, limit-hits-count, w)), 0)
	}
	// The current window's hits must first become the previous window's.
	return max(addSat(cur-now, w+waitFor(count, limit-hits, w)), 0)
}

// resetSlidingWindow returns how long, from now, until the estimate is 0.
func resetSlidingWindow(count, prev, now, cur, w int64) int64 {
	switch {
	case count > 0:
		return max(addSat(cur-now, w+waitFor(count, 0, w)), 0)
	case prev > 0:
		return max(addSat(cur-now, waitFor(prev, 0, w)), 0)
	}
	return 0
}

// addSat returns a + b, or MaxInt64 when that overflows, for b ≥ 0.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// ceilMS rounds nanoseconds (≥ 0) up to milliseconds without overflow.
func ceilMS(ns int64) int64 {
	q := ns / nsPerMS
	if ns%nsPerMS != 0 {
		q++
	}
	return q
}
