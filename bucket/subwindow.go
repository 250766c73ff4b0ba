package bucket

// decideSubWindow is the sliding window counted in n ≥ 2 sub-windows of
// g = ceil(W / n) ns aligned to the epoch: the current sub-window and the
// n − 1 before it count fully, the one before those is weighted by how much
// of it the trailing window still covers:
//
//	estimate = floor(oldest × (g − elapsed) / g) + (the n newest)
//
// A request is admitted when estimate + hits ≤ limit. Any n consecutive
// sub-windows admit at most the limit, so a trailing window of length
// n × g ≥ W admits at most the limit plus the hits of the one sub-window it
// only partly covers. With n = 1 this is the classic two-window counter.
//
// State: Start is the start of the newest sub-window, Count the window in
// ms and Prev the number of sub-windows (the shape the counts were made
// in), Ext the counts oldest first (the last at Start, leading zeros
// dropped).
func decideSubWindow(s *State, p *params, n, hits, now int64) Decision {
	limit, w := p.limit, p.w
	g := (w + n - 1) / n
	var one [1]int64
	c, cur := subWindowCounts(s, n, w, g, now, &one)
	elapsed := min(max(now-cur, 0), g)
	var full int64 // the n newest sub-windows
	for i := range n {
		full += c.at(i)
	}
	estimate := weigh(c.at(n), g-elapsed, g) + full

	need := max(hits, 1)
	allowed := need <= limit && estimate <= limit-need
	add := int64(0)
	switch {
	case allowed && hits > 0:
		add = hits
	case !allowed && p.refused && hits > 0 && c.at(0) < limit:
		add = min(hits, limit-c.at(0))
	}
	if add > 0 {
		next := c.plus(n, add)
		c = subCounts{vals: next}
		full += add
		estimate += add
		*s = State{Algorithm: SlidingWindow, Start: cur, Count: w / nsPerMS, Prev: n, Expires: addSat(cur, (n+1)*g), Ext: &Ext{vals: next}}
	}
	d := Decision{Remaining: max(limit-estimate, 0), ResetAfterMS: c.resetAfterMS(n, g, cur, now)}
	switch {
	case allowed:
		d.Status = UnderLimit
	case need > limit:
		d.Status = OverLimit
		d.RetryAfterMS = max(d.ResetAfterMS, w/nsPerMS)
	default:
		d.Status = OverLimit
		d.RetryAfterMS = c.retryAfterMS(n, g, cur, now, full, limit-need)
	}
	return d
}

// subCounts are the counts of a window's sub-windows, newest first through
// at: at(0) is the sub-window the decision counts in, at(i) the one i
// sub-windows before it. vals holds them oldest first, its last value off
// sub-windows before at(0).
type subCounts struct {
	vals []int64
	off  int64
}

func (c subCounts) at(i int64) int64 {
	j := int64(len(c.vals)) - 1 - i + c.off
	if i < c.off || j < 0 {
		return 0
	}
	return c.vals[j]
}

// subWindowCounts reads s as n sub-windows of g ns of a window of w ns, at
// now, and returns them with the start of the sub-window the decision
// counts in. A state of another shape is read into one sub-window, one[0].
func subWindowCounts(s *State, n, w, g, now int64, one *[1]int64) (subCounts, int64) {
	cur := now - now%g
	var vals []int64
	top := cur
	st := *s
	switch {
	case st.Fresh(now) || st.Algorithm != SlidingWindow:
	case st.Ext != nil && st.Prev == n && st.Count == w/nsPerMS && st.Start%g == 0:
		vals, top = st.Ext.vals, st.Start
	default:
		// A classic counter, or sub-windows of another shape: count
		// everything it holds in one sub-window, placed so that it
		// counts until the state's Expires (errs towards refusing; a
		// function of the state alone, so later answers agree).
		one[0] = min(st.Count+st.Prev, MaxLimit)
		if st.Ext != nil {
			one[0] = min(extSum(st.Ext), MaxLimit)
		}
		vals = one[:]
		last := st.Expires - 1 // > now ≥ 0: the state is not fresh
		top = max(last-last%g-n*g, 0)
	}
	if top > cur {
		// The state is ahead of this clock: count in its sub-window.
		cur = top
	}
	return subCounts{vals: vals, off: (cur - top) / g}, cur
}

// plus returns the new counts, oldest first, with add hits in at(0):
// sub-windows cur − n·g .. cur, leading zeros dropped, in a new slice.
func (c subCounts) plus(n, add int64) []int64 {
	lo := n
	for lo > 0 && c.at(lo) == 0 {
		lo--
	}
	next := make([]int64, lo+1)
	for i := range lo + 1 {
		next[lo-i] = c.at(i)
	}
	next[lo] += add
	return next
}

// resetAfterMS is the time until the counts weigh nothing: the newest
// non-empty sub-window must become the oldest and weigh nothing.
func (c subCounts) resetAfterMS(n, g, cur, now int64) int64 {
	for i := range n + 1 {
		if v := c.at(i); v > 0 {
			return ceilMS(max(addSat(cur, (n-i)*g+waitFor(v, 0, g))-now, 0))
		}
	}
	return 0
}

// retryAfterMS is the time until the counts leave room for the refused
// hits: until they count at most room, full being the n newest sub-windows
// now. At the k-th edge from cur, sub-windows 0 .. n−1−k count fully and
// sub-window n − k is the weighted one.
func (c subCounts) retryAfterMS(n, g, cur, now, full, room int64) int64 {
	for k := range n + 1 {
		if k > 0 {
			full -= c.at(n - k)
		}
		if full <= room {
			return ceilMS(max(addSat(cur, k*g+waitFor(c.at(n-k), room-full, g))-now, 0))
		}
	}
	return 0
}

// extSum returns the sum of an Ext's values, saturated at MaxInt64 (only
// meaningful for sub-window counts).
func extSum(e *Ext) int64 {
	var t int64
	for _, v := range e.vals {
		t = addSat(t, v)
	}
	return t
}
