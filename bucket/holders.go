package bucket

// Concurrency limits: at most Limit holders of a key at once, each holding
// a lease until it releases it or its TTL passes without a renew. The
// holders are a State of the internal algorithm Holders, which no limit
// names: the cluster keeps it beside the key's counters, under a key of
// its own.

// Holders is the algorithm of a holders state (Acquire). A limit never
// names it; it is 15, past the algorithms of sluice.v1.Algorithm, so that
// it never takes one of their numbers.
const Holders Algorithm = 15

// MaxHolders is the largest concurrency limit: the state keeps 16 bytes per
// holder.
const MaxHolders = 10_000

// MaxHoldTTLMS is the longest lease of a concurrency limit: a holder that
// crashed keeps its slot that long.
const MaxHoldTTLMS = 24 * 3600 * 1000

// A holders state keeps, in Ext, one (id, expiry) pair per holder, by id;
// Count is the number of pairs and Expires the latest expiry (the state is
// fresh once every lease has expired).

// holderPairs returns s's pairs when s is a holders state, else nil.
func holderPairs(s *State) []int64 {
	if s.Algorithm != Holders || s.Ext == nil {
		return nil
	}
	return s.Ext.vals
}

// live returns the pairs of s whose lease has not expired at now.
func live(s *State, now int64) []int64 {
	ps := holderPairs(s)
	out := make([]int64, 0, len(ps))
	for i := 0; i+1 < len(ps); i += 2 {
		if ps[i+1] > now {
			out = append(out, ps[i], ps[i+1])
		}
	}
	return out
}

// setHolders makes s the holders state of pairs (sorted by id).
func setHolders(s *State, pairs []int64) {
	if len(pairs) == 0 {
		*s = State{}
		return
	}
	var exp int64
	for i := 1; i < len(pairs); i += 2 {
		exp = max(exp, pairs[i])
	}
	*s = State{Algorithm: Holders, Epoch: s.Epoch, Count: int64(len(pairs) / 2), Expires: exp, Ext: &Ext{vals: pairs}}
}

// HoldersAt returns how many leases s holds at now.
func HoldersAt(s *State, now int64) int64 { return int64(len(live(s, now)) / 2) }

// holdDecision is the answer to an acquire or a renew: Remaining is the
// free slots, ResetAfterMS the time until the lease (of id) expires; a
// refusal waits RetryAfterMS, until the first lease expires.
func holdDecision(pairs []int64, limit, id, now int64) Decision {
	d := Decision{Status: UnderLimit, Limit: limit, Remaining: max(limit-int64(len(pairs)/2), 0)}
	first := int64(0)
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] == id {
			d.ResetAfterMS = ceilMS(pairs[i+1] - now)
		}
		if first == 0 || pairs[i+1] < first {
			first = pairs[i+1]
		}
	}
	if id == 0 {
		d.Status = OverLimit
		d.RetryAfterMS = max(ceilMS(first-now), 1)
	}
	return d
}

// Acquire takes a lease of a concurrency limit of limit holders, for
// ttlMS from now, under id (unique among the key's leases, above 0), when
// fewer than limit leases are live at now. It returns the decision: allowed
// with Remaining the free slots after it and ResetAfterMS the lease's life,
// or refused with RetryAfterMS until the first live lease expires. Expired
// leases are dropped.
func Acquire(s *State, limit, ttlMS, id, now int64) Decision {
	pairs := live(s, now)
	if int64(len(pairs)/2) >= limit || id <= 0 {
		d := holdDecision(pairs, limit, 0, now)
		setHolders(s, pairs)
		return d
	}
	exp := addSat(now, ttlMS*nsPerMS)
	at := len(pairs)
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] >= id {
			at = i
			break
		}
	}
	if at < len(pairs) && pairs[at] == id {
		pairs[at+1] = max(pairs[at+1], exp) // the same id again: one lease
	} else {
		pairs = append(pairs[:at], append([]int64{id, exp}, pairs[at:]...)...)
	}
	setHolders(s, pairs)
	return holdDecision(pairs, limit, id, now)
}

// Renew extends the live lease id for ttlMS from now and reports whether
// it was live: an expired lease may have gone to another holder and is
// not renewed.
func Renew(s *State, limit, ttlMS, id, now int64) (Decision, bool) {
	pairs := live(s, now)
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] == id {
			pairs[i+1] = max(pairs[i+1], addSat(now, ttlMS*nsPerMS))
			setHolders(s, pairs)
			return holdDecision(pairs, limit, id, now), true
		}
	}
	setHolders(s, pairs)
	return Decision{Status: UnderLimit, Limit: limit, Remaining: max(limit-int64(len(pairs)/2), 0)}, false
}

// Release ends lease id and reports whether it was live; Remaining is the
// free slots after it.
func Release(s *State, limit, id, now int64) (Decision, bool) {
	pairs := live(s, now)
	found := false
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] == id {
			pairs = append(pairs[:i:i], pairs[i+2:]...)
			found = true
			break
		}
	}
	setHolders(s, pairs)
	return Decision{Status: UnderLimit, Limit: limit, Remaining: max(limit-int64(len(pairs)/2), 0)}, found
}
