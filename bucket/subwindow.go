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
	cur := now - now%g
	var one [1]int64
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
	off := (cur - top) / g
	get := func(i int64) int64 {
		j := int64(len(vals)) - 1 - i + off
		if i < off || j < 0 {
			return 0
		}
		return vals[j]
	}
	elapsed := min(max(now-cur, 0), g)
	var full int64 // the n newest sub-windows
	for i := range n {
		full += get(i)
	}
	estimate := weigh(get(n), g-elapsed, g) + full

	need := max(hits, 1)
	allowed := need <= limit && estimate <= limit-need
	add := int64(0)
	switch {
	case allowed && hits > 0:
		add = hits
	case !allowed && p.refused && hits > 0 && get(0) < limit:
		add = min(hits, limit-get(0))
	}
	if add > 0 {
		// The new counts: sub-windows cur − n·g .. cur, leading zeros dropped.
		lo := n
		for lo > 0 && get(lo) == 0 {
			lo--
		}
		next := make([]int64, lo+1)
		for i := range lo + 1 {
			next[lo-i] = get(i)
		}
		next[lo] += add
		vals, off = next, 0
		full += add
		estimate += add
		*s = State{Algorithm: SlidingWindow, Start: cur, Count: w / nsPerMS, Prev: n, Expires: addSat(cur, (n+1)*g), Ext: &Ext{vals: next}}
	}
	d := Decision{Remaining: max(limit-estimate, 0)}
	// Reset: the newest non-empty sub-window must become the oldest and
	// weigh nothing.
	for i := range n + 1 {
		if c := get(i); c > 0 {
			d.ResetAfterMS = ceilMS(max(addSat(cur, (n-i)*g+waitFor(c, 0, g))-now, 0))
			break
		}
	}
	switch {
	case allowed:
		d.Status = UnderLimit
	case need > limit:
		d.Status = OverLimit
		d.RetryAfterMS = max(d.ResetAfterMS, w/nsPerMS)
	default:
		// At the k-th edge from cur, sub-windows 0 .. n−1−k count fully
		// and sub-window n − k is the weighted one.
		d.Status = OverLimit
		for k := range n + 1 {
			if k > 0 {
				full -= get(n - k)
			}
			if full+need <= limit {
				at := addSat(cur, k*g+waitFor(get(n-k), limit-need-full, g))
				d.RetryAfterMS = ceilMS(max(at-now, 0))
				break
			}
		}
	}
	return d
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
