package bucket

// The exact references every algorithm is checked against (refCounter, a
// log of admitted hits, for the counters; refBucket, in exact rationals, for
// the buckets), and the sliding window checked against its reference.

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"
)

// refCounter is the exact reference: the log of every admitted hit, from
// which it computes what the sliding-window counter is specified to
// answer, by definition and by search rather than by formula.
//
// The same log answers for the sub-window counter (n sub-windows of g ns;
// the classic counter is n = 1, g = W), the sliding log and the fixed
// window (plain or calendar): only estimate changes.
type refCounter struct {
	alg      Algorithm
	limit    int64
	headroom int64 // soft or elastic: limit is the one in force, remaining counts against limit − headroom
	w        int64 // window in ns
	n, g     int64 // sub-windows
	cal      Calendar
	refused  bool    // count refused hits
	times    []int64 // admission times, non-decreasing
	cum      []int64 // cum[i] = hits admitted in times[:i]
}

func newRefCounter(lim Limit) *refCounter {
	w := lim.WindowMS * ms
	r := &refCounter{alg: lim.Algorithm, limit: lim.Limit, w: w, n: 1, g: w, cal: lim.Calendar, refused: lim.CountRefused, cum: []int64{0}}
	if lim.SubWindows > 1 {
		r.n = lim.SubWindows
		r.g = (w + r.n - 1) / r.n
	}
	if lim.Mode == ModeSoft {
		r.limit = lim.Limit + lim.Limit*lim.SoftPercent/100
		r.headroom = r.limit - lim.Limit
	}
	return r
}

// refWindow returns the fixed window holding t, computed with package time.
func refWindow(cal Calendar, w, t int64) (start, end int64) {
	u := time.Unix(0, t).UTC()
	y, m, d := u.Date()
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	switch cal {
	case CalendarDay:
		return day.UnixNano(), day.AddDate(0, 0, 1).UnixNano()
	case CalendarWeek:
		back := (int(u.Weekday()) + 6) % 7 // days since Monday
		mon := day.AddDate(0, 0, -back)
		return mon.UnixNano(), mon.AddDate(0, 0, 7).UnixNano()
	case CalendarMonth:
		first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		return first.UnixNano(), first.AddDate(0, 1, 0).UnixNano()
	}
	return t - t%w, t - t%w + w
}

// horizon is a time after which, with no more admissions, the estimate is 0.
func (r *refCounter) horizon(now int64) int64 {
	switch r.alg {
	case SlidingLog:
		return now + r.w
	case FixedWindow:
		_, end := refWindow(r.cal, r.w, now)
		return end
	}
	return now + (r.n+1)*r.g
}

// windowLen is how long a never-admissible request is told to wait at least.
func (r *refCounter) windowLen(now int64) int64 {
	if r.alg == FixedWindow {
		start, end := refWindow(r.cal, r.w, now)
		return end - start
	}
	return r.w
}

// admitted returns the hits admitted in [from, to).
func (r *refCounter) admitted(from, to int64) int64 {
	i := sort.Search(len(r.times), func(k int) bool { return r.times[k] >= from })
	j := sort.Search(len(r.times), func(k int) bool { return r.times[k] >= to })
	return r.cum[j] - r.cum[i]
}

// estimate is, for the sliding window, floor(oldest × (g − elapsed)/g)
// plus the hits in the n newest aligned sub-windows (the classic counter:
// floor(Prev × (W − elapsed)/W) + Count); for the sliding log the hits in
// (t − W, t]; for the fixed window the hits in t's window.
func (r *refCounter) estimate(t int64) int64 {
	switch r.alg {
	case SlidingLog:
		return r.admitted(t-r.w+1, t+1)
	case FixedWindow:
		start, end := refWindow(r.cal, r.w, t)
		return r.admitted(start, end)
	}
	cur := t - t%r.g
	old := cur - r.n*r.g
	prev := big.NewInt(r.admitted(old, old+r.g))
	prev.Mul(prev, big.NewInt(r.g-(t-cur)))
	prev.Quo(prev, big.NewInt(r.g))
	return prev.Int64() + r.admitted(old+r.g, cur+r.g)
}

// firstAt returns the first t ≥ now at which ok(estimate(t)) holds if
// nothing else is admitted. The estimate never grows without admissions
// and is 0 two windows after the last one.
func (r *refCounter) firstAt(now int64, ok func(estimate int64) bool) int64 {
	lo, hi := now, r.horizon(now)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if ok(r.estimate(mid)) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

func ceilDivMS(ns int64) int64 { return (ns + ms - 1) / ms }

// decide answers a request as specified and logs what it admits.
func (r *refCounter) decide(hits, now int64) Decision {
	est := r.estimate(now)
	allowed := est+hits <= r.limit
	if hits == 0 {
		allowed = est < r.limit
	}
	d := Decision{Status: OverLimit, Limit: r.limit - r.headroom}
	add := int64(0)
	if allowed {
		d.Status = UnderLimit
		add = hits
	} else if r.refused && hits > 0 {
		add = r.refusedCount(hits, now)
	}
	if add > 0 {
		r.times = append(r.times, now)
		r.cum = append(r.cum, r.cum[len(r.cum)-1]+add)
		est = r.estimate(now)
	}
	d.Remaining = max(r.limit-est-r.headroom, 0)
	reset := r.firstAt(now, func(e int64) bool { return e == 0 }) - now
	d.ResetAfterMS = ceilDivMS(reset)
	if !allowed {
		need := max(hits, 1)
		if need > r.limit {
			d.RetryAfterMS = ceilDivMS(max(reset, r.windowLen(now))) // never admissible
		} else {
			d.RetryAfterMS = ceilDivMS(r.firstAt(now, func(e int64) bool { return e+need <= r.limit }) - now)
		}
	}
	return d
}

// refusedCount is how many refused hits count with CountRefused: up to
// the limit in the current (sub-)window, or for the log as many as keep
// the newest limit entries deciding as the whole log would.
func (r *refCounter) refusedCount(hits, now int64) int64 {
	switch r.alg {
	case SlidingLog:
		return min(hits, r.limit)
	case FixedWindow:
		start, end := refWindow(r.cal, r.w, now)
		return max(min(hits, r.limit-r.admitted(start, end)), 0)
	}
	cur := now - now%r.g
	return max(min(hits, r.limit-r.admitted(cur, cur+r.g)), 0)
}

// log returns the admission times and the hits admitted at each.
func (r *refCounter) log() (times, hits []int64) {
	hits = make([]int64, len(r.times))
	for i := range hits {
		hits[i] = r.cum[i+1] - r.cum[i]
	}
	return r.times, hits
}

// refBucket is the textbook token bucket in exact rational arithmetic: a
// level that refills at limit/W per ns up to the burst and drains by the
// hits admitted; the reference for the token bucket, GCRA and the leaky
// bucket (whose queue holds burst − level). It logs what it admits.
type refBucket struct {
	real              int64 // the limit as configured
	limit, burst, w   int64
	headroom, shaping int64
	refused           bool
	tokens            *big.Rat
	last              int64
	times, hits       []int64
	released          []int64 // shaping: when each admitted request may go
}

func newRefBucket(lim Limit) *refBucket {
	b := lim.Burst
	if b == 0 {
		b = lim.Limit
	}
	r := &refBucket{real: lim.Limit, limit: lim.Limit, burst: b, w: lim.WindowMS * ms, refused: lim.CountRefused, tokens: new(big.Rat).SetInt64(b)}
	if lim.Mode == ModeSoft {
		r.limit = lim.Limit + lim.Limit*lim.SoftPercent/100
		r.burst = b + b*lim.SoftPercent/100
		r.headroom = r.burst - b
		r.tokens.SetInt64(r.burst)
	}
	if lim.Shaping {
		r.shaping = 1
	}
	return r
}

// nsUntil returns ceil((n − tokens) × W / limit) ns, at least 0.
func (r *refBucket) nsUntil(n int64) int64 {
	x := new(big.Rat).Sub(new(big.Rat).SetInt64(n), r.tokens)
	if x.Sign() <= 0 {
		return 0
	}
	x.Mul(x, new(big.Rat).SetFrac64(r.w, r.limit))
	q, m := new(big.Int).QuoRem(x.Num(), x.Denom(), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

func (r *refBucket) decide(hits, now int64) Decision {
	if now > r.last {
		r.tokens.Add(r.tokens, new(big.Rat).SetFrac(big.NewInt(0).Mul(big.NewInt(now-r.last), big.NewInt(r.limit)), big.NewInt(r.w)))
		if r.tokens.Cmp(new(big.Rat).SetInt64(r.burst)) > 0 {
			r.tokens.SetInt64(r.burst)
		}
		r.last = now
	}
	need := max(hits, 1)
	allowed := r.tokens.Cmp(new(big.Rat).SetInt64(need)) >= 0
	delay := r.nsUntil(r.burst)
	d := Decision{Status: OverLimit, Limit: r.real}
	if allowed {
		d.Status = UnderLimit
		if hits > 0 {
			r.tokens.Sub(r.tokens, new(big.Rat).SetInt64(hits))
			r.times, r.hits = append(r.times, now), append(r.hits, hits)
			r.released = append(r.released, now+ceilDivMS(delay)*ms*r.shaping)
		}
		if r.shaping == 1 {
			d.RetryAfterMS = ceilDivMS(delay)
		}
	} else if r.refused && hits > 0 && r.tokens.Sign() > 0 {
		r.tokens.SetInt64(0)
	}
	floor := new(big.Int).Quo(r.tokens.Num(), r.tokens.Denom())
	d.Remaining = max(floor.Int64()-r.headroom, 0)
	reset := r.nsUntil(r.burst)
	d.ResetAfterMS = ceilDivMS(reset)
	if !allowed {
		if need > r.burst {
			d.RetryAfterMS = max(d.ResetAfterMS, r.w/ms)
		} else {
			d.RetryAfterMS = ceilDivMS(r.nsUntil(need))
		}
	}
	return d
}

func (r *refBucket) log() (times, hits []int64) { return r.times, r.hits }

// refModel is an exact reference: it answers as specified and logs every
// admitted hit.
type refModel interface {
	decide(hits, now int64) Decision
	log() (times, hits []int64)
}

func newRef(lim Limit) refModel {
	switch lim.Algorithm {
	case TokenBucket, GCRA, LeakyBucket:
		return newRefBucket(lim)
	}
	return newRefCounter(lim)
}

// capacity is the most a limit can ever report as remaining.
func capacity(lim Limit) int64 {
	switch lim.Algorithm {
	case TokenBucket, GCRA, LeakyBucket:
		if lim.Burst > 0 {
			return lim.Burst
		}
	}
	return lim.Limit
}

// TestSlidingWindowMatchesReference replays random traffic against Decide
// and the exact reference and checks (a) every decision is the specified
// one, (b) every aligned window admits at most the limit, (c) every
// trailing window admits at most 2 × limit, (d) retry is 0 exactly when
// allowed and the same request passes after it, remaining ∈ [0, limit],
// and a state at or past Expires answers like a fresh one.
func TestSlidingWindowMatchesReference(t *testing.T) {
	t.Parallel()
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			for range 6 {
				// Windows 1 ms .. 1 h, log-uniform; limits 1 .. 1000.
				windowMS := int64(1)
				for range rng.IntN(23) {
					windowMS = min(2*windowMS+rng.Int64N(2), 3_600_000)
				}
				lim := sw(1+rng.Int64N(1000), windowMS)
				checkAgainstReference(t, rng, lim, 2000)
			}
		})
	}
}

func checkAgainstReference(t *testing.T, rng *rand.Rand, lim Limit, n int) {
	t.Helper()
	if err := lim.Validate(); err != nil {
		t.Fatalf("%+v: %v", lim, err)
	}
	ref := newRef(lim)
	next := mixedTraffic(lim)
	var s State
	now := t0 + rng.Int64N(lim.WindowMS*ms)
	for i := range n {
		hits := randomHits(rng, lim.Limit)
		if s.Fresh(now) {
			z, c := State{}, s
			if a, b := Decide(&c, lim, hits, now), Decide(&z, lim, hits, now); a != b {
				t.Fatalf("%+v request %d: state %+v is fresh at %d but answers %+v, a fresh one %+v", lim, i, s, now, a, b)
			}
		}
		before := s
		got := Decide(&s, lim, hits, now)
		want := ref.decide(hits, now)
		if got != want {
			t.Fatalf("%+v request %d (hits %d at t0+%d, state %+v):\n got %+v\nwant %+v", lim, i, hits, now-t0, before, got, want)
		}
		if got.Allowed() != (got.RetryAfterMS == 0) && !lim.Shaping || got.Remaining < 0 || got.Remaining > capacity(lim) {
			t.Fatalf("%+v request %d: inconsistent %+v", lim, i, got)
		}
		if (!got.Allowed() || hits == 0) && !lim.CountRefused && s != before {
			t.Fatalf("%+v request %d: refusal or peek changed the state", lim, i)
		}
		if err := roundTrip(s); err != nil {
			t.Fatalf("%+v request %d: %v", lim, i, err)
		}
		if !got.Allowed() && max(hits, 1) <= capacity(lim) {
			c := before
			if !Decide(&c, lim, hits, now+got.RetryAfterMS*ms).Allowed() {
				t.Fatalf("%+v request %d: not admitted after RetryAfter %d ms", lim, i, got.RetryAfterMS)
			}
		}
		now = next(rng, now)
	}
	times, hits := ref.log()
	if err := checkBound(lim, times, hits); err != nil {
		t.Fatalf("%+v: %v", lim, err)
	}
	if b, ok := ref.(*refBucket); ok && lim.Shaping {
		if err := checkShaped(lim, b.released, hits); err != nil {
			t.Fatalf("%+v: %v", lim, err)
		}
	}
}

// roundTrip checks that s survives encoding.
func roundTrip(s State) error {
	b, err := s.MarshalBinary()
	if err != nil || len(b) != s.EncodedLen() {
		return fmt.Errorf("encoding %+v: %d bytes, %v", s, len(b), err)
	}
	var back State
	if err := back.UnmarshalBinary(b); err != nil || !sameState(back, s) {
		return fmt.Errorf("round trip of %+v: %+v, %v", s, back, err)
	}
	return nil
}

// sameState compares states by value, Ext included.
func sameState(a, b State) bool {
	ea, eb := a.Ext, b.Ext
	a.Ext, b.Ext = nil, nil
	if a != b || (ea == nil) != (eb == nil) {
		return false
	}
	return ea == nil || slices.Equal(ea.vals, eb.vals)
}
