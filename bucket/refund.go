package bucket

// Refund takes back, at now, up to hits that s admitted at grantedAt under
// lim and that nobody spent: the unspent part of a quota lease
// (docs/leases.md), returned to the key's owner. It returns the hits taken
// back; s is left as if they had never been admitted, and is not changed
// when it no longer counts them:
//
//   - fixed window: only while now and s are still in the window grantedAt
//     is in;
//   - sliding-window counter: while grantedAt's window is s's current one
//     (taken from its count) or the one before (taken from the previous
//     window's count, which only weighs on later estimates), and now is no
//     later than the window after grantedAt's;
//   - token bucket: tokens go back, up to the burst. Taking h tokens and
//     giving them back later leaves the bucket where it would be had they
//     never been taken: min(b, c−h+refill) + h, capped at b, is min(b,
//     c+refill).
//
// Every other algorithm or mode, and a state of another algorithm, takes
// nothing back (they are never leased). The caller guarantees that the hits
// were admitted into this state and are no longer spendable.
func Refund(s *State, lim *Limit, hits, grantedAt, now int64) int64 {
	epoch := s.Epoch
	back := refund(s, lim, hits, grantedAt, now)
	s.Epoch = epoch
	return back
}

func refund(s *State, lim *Limit, hits, grantedAt, now int64) int64 {
	if hits <= 0 || grantedAt < 0 || lim.WindowMS < MinWindowMS || lim.Mode != ModeHard || lim.CountRefused {
		return 0
	}
	now = max(now, 0)
	var p params
	effective(&p, lim, 1)
	switch lim.Algorithm {
	case TokenBucket:
		return refundTokenBucket(s, &p, hits, now)
	case FixedWindow:
		if s.Algorithm != FixedWindow {
			return 0
		}
		start, end := windowAt(lim.Calendar, zoneOf(lim), p.w, grantedAt)
		if s.Start != start || now >= end {
			return 0
		}
		back := min(hits, s.Count)
		s.Count -= back
		return back
	case SlidingWindow, AlgorithmUnspecified:
		if lim.SubWindows > 1 || s.Algorithm != SlidingWindow || s.Ext != nil {
			return 0
		}
		w := p.w
		cur := grantedAt - grantedAt%w
		if now-now%w > cur+w {
			return 0 // neither window weighs on an estimate any more
		}
		switch s.Start {
		case cur:
			back := min(hits, s.Count)
			s.Count -= back
			return back
		case cur + w:
			back := min(hits, s.Prev)
			s.Prev -= back
			return back
		}
	}
	return 0
}

// refundTokenBucket puts hits back into the bucket s, refilled to now, up
// to its capacity.
func refundTokenBucket(s *State, p *params, hits, now int64) int64 {
	if s.Algorithm != TokenBucket || p.limit <= 0 {
		return 0 // a fresh bucket is full
	}
	limit, b, w := p.limit, p.burst, p.w
	c, fr, last := s.Count, min(s.Prev, w-1), s.Start
	if c >= b {
		return 0
	}
	if now > last {
		q, r, ok := mul128(now-last, limit).add(fr).div(w)
		if !ok || q >= b-c {
			return 0 // full by now
		}
		c, fr, last = c+q, r%limit, now-r/limit
		if last < 0 {
			last = 0
		}
	}
	back := min(hits, b-c)
	c += back
	since := now - last
	reset := int64(0)
	if c < b {
		reset = max(mul128(b-c, w).sub(fr).divCeil(limit)-since, 0)
	}
	*s = State{Algorithm: TokenBucket, Start: last, Count: c, Prev: fr, Expires: addSat(now, reset)}
	return back
}
