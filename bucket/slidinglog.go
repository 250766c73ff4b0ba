package bucket

import "sort"

// decideSlidingLog is the sliding log, exact: it keeps the time of every
// hit admitted in the trailing window (one int64 per hit, in Ext) and
// admits a request when the hits in (now − W, now] plus its own are at most
// the limit. Validate caps its limit at MaxLogLimit. Hits are logged at
// now, or at the newest logged time if that is ahead of this clock.
func decideSlidingLog(s *State, p *params, hits, now int64) Decision {
	limit, w := p.limit, p.w
	var log []int64
	if s.Algorithm == SlidingLog && s.Ext != nil {
		log = s.Ext.vals
	}
	// live holds the hits in (now − W, now], and any ahead of now.
	from := now - w
	live := log[sort.Search(len(log), func(i int) bool { return log[i] > from }):]
	c := int64(len(live))
	need := max(hits, 1)
	allowed := need <= limit && c <= limit-need
	add := int64(0)
	switch {
	case allowed && hits > 0:
		add = hits
	case !allowed && p.refused && hits > 0:
		// Refused hits count too. Only the newest limit entries can
		// matter to any decision, so the log keeps those.
		add = min(hits, limit)
	}
	if add > 0 {
		at := now
		if c > 0 {
			at = max(at, live[c-1])
		}
		keep := min(c, limit-add) // ≥ 0: add ≤ limit
		next := make([]int64, keep+add)
		copy(next, live[c-keep:])
		for i := keep; i < keep+add; i++ {
			next[i] = at
		}
		live, c = next, keep+add
		*s = State{Algorithm: SlidingLog, Expires: addSat(at, w), Ext: &Ext{vals: next}}
	}
	d := Decision{Remaining: max(limit-c, 0)}
	if c > 0 {
		d.ResetAfterMS = ceilMS(addSat(live[c-1], w) - now)
	}
	switch {
	case allowed:
		d.Status = UnderLimit
	case need > limit:
		d.Status = OverLimit
		d.RetryAfterMS = max(d.ResetAfterMS, w/nsPerMS)
	default:
		// The (c + need − limit)-th oldest hit must leave the window.
		d.Status = OverLimit
		d.RetryAfterMS = ceilMS(addSat(live[c+need-limit-1], w) - now)
	}
	return d
}
