package bucket

import (
	"math"
	"time"
)

// decideFixedWindow is the fixed window: windows of length W aligned to
// the epoch (so every node agrees on them), or calendar windows in UTC or
// in the limit's CalendarTZ.
// Start is the start of the state's window and Count the hits admitted in
// it; a request is admitted when Count + hits ≤ limit. Every window admits
// at most the limit; a trailing window of length W may see 2 × limit
// across an edge.
func decideFixedWindow(s *State, p *params, lim *Limit, hits, now int64) Decision {
	limit := p.limit
	cal, loc := lim.Calendar, zoneOf(lim)
	start, end := windowAt(cal, loc, p.w, now)
	st := *s
	count := int64(0)
	if st.Algorithm == FixedWindow {
		switch {
		case st.Start == start:
			count = st.Count
		case st.Start > start:
			// The state is ahead of this clock: keep counting in its window.
			start = st.Start
			_, end = windowAt(cal, loc, p.w, st.Start)
			count = st.Count
		}
	}
	need := max(hits, 1)
	allowed := need <= limit && count <= limit-need
	add := int64(0)
	switch {
	case allowed && hits > 0:
		add = hits
	case !allowed && p.refused && hits > 0 && count < limit:
		add = min(hits, limit-count)
	}
	if add > 0 {
		count += add
		*s = State{Algorithm: FixedWindow, Start: start, Count: count, Expires: end}
	}
	d := Decision{Remaining: max(limit-count, 0)}
	if count > 0 {
		d.ResetAfterMS = ceilMS(end - now)
	}
	switch {
	case allowed:
		d.Status = UnderLimit
	case need > limit:
		d.Status = OverLimit
		d.RetryAfterMS = max(d.ResetAfterMS, ceilMS(end-start))
	default:
		// The next window is empty.
		d.Status = OverLimit
		d.RetryAfterMS = ceilMS(end - now)
	}
	return d
}

const nsPerDay = 24 * 3600 * 1_000_000_000

// windowAt returns the window [start, end) that holds t ≥ 0: a multiple
// of w since the epoch, or the day, week (from Monday) or month in UTC,
// or in loc when it is not nil (zoneWindowAt). end saturates at MaxInt64;
// start is never before the epoch.
func windowAt(cal Calendar, loc *time.Location, w, t int64) (start, end int64) {
	if loc != nil && cal != CalendarNone {
		return zoneWindowAt(cal, loc, t)
	}
	switch cal {
	case CalendarDay:
		start = t - t%nsPerDay
		return start, addSat(start, nsPerDay)
	case CalendarWeek:
		// 1970-01-01 was a Thursday: day d is (d + 3) % 7 days after a Monday.
		day := t / nsPerDay
		monday := (day - (day+3)%7) * nsPerDay
		return max(monday, 0), addSat(monday, 7*nsPerDay)
	case CalendarMonth:
		y, m, _ := time.Unix(t/1e9, 0).UTC().Date()
		first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).Unix()
		next := time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).Unix()
		end = math.MaxInt64
		if next <= math.MaxInt64/1_000_000_000 {
			end = next * 1e9
		}
		return first * 1e9, end
	}
	start = t - t%w
	return start, addSat(start, w)
}
