package bucket

import "math"

// decideTAT is GCRA, and the leaky bucket as a meter, which makes the
// same decisions: the state is the theoretical arrival time TAT — when
// the bucket is empty again (the queue has drained) — kept exactly as
// Start + Prev/Count ns, Count being the limit the fraction is in.
//
// With T = W / limit the emission interval and b the burst, the debt at
// now is D = max(TAT − now, 0), and a request of hits is admitted when
// D + hits × T ≤ b × T; then TAT = now + D + hits × T. So any interval of
// length t admits at most b + limit × t / W hits.
//
// For a shaping leaky bucket the admitted request is to be delayed by D,
// the time the queue ahead of it needs to drain: it is the allowed
// answer's RetryAfterMS.
func decideTAT(s *State, alg Algorithm, p *params, hits, now int64, shaping bool) Decision {
	limit, b, w := p.limit, p.burst, p.w
	// The debt D = di + df/limit ns.
	var di, df int64
	if st := *s; st.Algorithm == alg {
		ti, tf := st.Start, st.Prev
		if st.Count != limit || tf >= limit {
			// A fraction of another limit: round TAT up to a whole ns.
			if tf != 0 {
				ti = addSat(ti, 1)
			}
			tf = 0
		}
		if ti > now || (ti == now && tf > 0) {
			di, df = ti-now, tf
		}
	}
	need := max(hits, 1)
	// Admitted when D ≤ (b − need) × T = cq + cr/limit.
	var cq, cr int64
	allowed := false
	if need <= b {
		var ok bool
		cq, cr, ok = mulDiv(b-need, w, limit)
		allowed = !ok || di < cq || (di == cq && df <= cr)
	}
	delay := ceilNS(di, df)
	commit := false
	switch {
	case allowed && hits > 0:
		hq, hr, _ := mulDiv(hits, w, limit)
		di, df = addFrac(di, df, hq, hr, limit)
		commit = true
	case !allowed && p.refused && hits > 0:
		// Refused hits count too: the bucket is left full of debt.
		bq, br, _ := mulDiv(b, w, limit)
		if di < bq || (di == bq && df < br) {
			di, df = bq, br
			commit = true
		}
	}
	if commit {
		tat := addSat(now, di)
		if tat == math.MaxInt64 {
			df = 0
		}
		*s = State{Algorithm: alg, Start: tat, Count: limit, Prev: df, Expires: addSat(tat, min(df, 1))}
	}
	d := Decision{ResetAfterMS: ceilMS(ceilNS(di, df))}
	// Remaining = floor(b − D × limit / W).
	if used := mul128(di, limit).add(df).divCeil(w); used < b {
		d.Remaining = b - used
	}
	switch {
	case allowed:
		d.Status = UnderLimit
		if shaping {
			d.RetryAfterMS = ceilMS(delay)
		}
	case need > b:
		// Never admissible.
		d.Status = OverLimit
		d.RetryAfterMS = max(d.ResetAfterMS, w/nsPerMS)
	default:
		// Wait D − (b − need) × T, from the state after this request.
		d.Status = OverLimit
		wi, wf := di-cq, df-cr
		if wf < 0 {
			wi, wf = wi-1, wf+limit
		}
		d.RetryAfterMS = ceilMS(ceilNS(wi, wf))
	}
	return d
}

// addFrac returns (ai + af/d) + (bi + bf/d) as a whole part and a fraction
// in [0, d), saturating at MaxInt64 (fraction 0), for fractions in [0, d).
func addFrac(ai, af, bi, bf, d int64) (int64, int64) {
	i, f := addSat(ai, bi), af+bf
	if f >= d {
		i, f = addSat(i, 1), f-d
	}
	if i == math.MaxInt64 {
		f = 0
	}
	return i, f
}

// ceilNS returns ceil(i + f/d) for a fraction 0 ≤ f < d, saturated.
func ceilNS(i, f int64) int64 {
	if f > 0 {
		return addSat(i, 1)
	}
	return i
}
