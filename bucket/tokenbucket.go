package bucket

// decideTokenBucket is the token bucket: capacity b (the burst), refilled
// continuously at limit per window. The state keeps the level exactly: at
// time t ≥ Start the bucket holds
//
//	min(b, Count + ((t − Start) × limit + Prev) / W)
//
// tokens, W the window in ns and 0 ≤ Prev < limit (the part of a token
// that does not make a whole ns; Start is moved back by the whole ns). A
// fresh bucket is full. A request of hits is admitted when the bucket holds
// at least hits tokens; then it takes them. So any interval of length t
// admits at most b + limit × t / W hits. It makes the same decisions as
// GCRA with the same limit and burst.
func decideTokenBucket(s *State, p *params, hits, now int64) Decision {
	limit, b, w := p.limit, p.burst, p.w
	st := *s
	c, fr, last := b, int64(0), now
	if st.Algorithm == TokenBucket {
		c, fr, last = st.Count, min(st.Prev, w-1), st.Start
	}
	if c >= b {
		c, fr = b, 0
	}
	if now > last {
		// Refill (now − last) × limit / W tokens, exactly.
		q, r, ok := mul128(now-last, limit).add(fr).div(w)
		if !ok || q >= b-c {
			c, fr, last = b, 0, now
		} else {
			// r/W of a token is r/limit ns of refill: keep the whole ns
			// in last and the rest, below limit, in fr.
			c, fr, last = c+q, r%limit, now-r/limit
			if last < 0 {
				last = 0 // at the epoch: drop the part of a token
			}
		}
	}
	// since is how far this clock is past the state's (negative when the
	// state is ahead).
	since := now - last
	need := max(hits, 1)
	allowed := need <= c
	commit := false
	switch {
	case allowed && hits > 0:
		c -= hits
		commit = true
	case !allowed && p.refused && hits > 0 && (c > 0 || fr > 0 || last < now):
		// Refused hits count too: the bucket is left empty.
		c, fr, last, since = 0, 0, max(now, last), min(since, 0)
		commit = true
	}
	// wait returns the ns from now until the bucket holds n tokens.
	wait := func(n int64) int64 {
		if n <= c {
			return 0
		}
		return max(mul128(n-c, w).sub(fr).divCeil(limit)-since, 0)
	}
	reset := wait(b)
	if commit {
		*s = State{Algorithm: TokenBucket, Start: last, Count: c, Prev: fr, Expires: addSat(now, reset)}
	}
	d := Decision{Remaining: c, ResetAfterMS: ceilMS(reset)}
	switch {
	case allowed:
		d.Status = UnderLimit
	case need > b:
		d.Status = OverLimit
		d.RetryAfterMS = max(d.ResetAfterMS, w/nsPerMS)
	default:
		d.Status = OverLimit
		d.RetryAfterMS = ceilMS(wait(need))
	}
	return d
}
