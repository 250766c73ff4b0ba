package bucket

import (
	"fmt"
	"math"
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

// trafficShape returns the time of the next request after now.
type trafficShape func(rng *rand.Rand, now int64) int64

// mixedTraffic is the property test's traffic: Poisson-like gaps around
// the limit's rate, simultaneous requests, requests on, just before and
// just after window edges, long gaps.
func mixedTraffic(lim Limit) trafficShape {
	w := lim.WindowMS * ms
	return func(rng *rand.Rand, now int64) int64 {
		switch rng.IntN(10) {
		case 0, 1, 2, 3:
			return now + int64(rng.ExpFloat64()*float64(w)/float64(lim.Limit)/2)
		case 4:
			return now
		case 5, 6:
			edge := now - now%w + w
			jitter := []int64{-1, 0, 1, -2, 2}[rng.IntN(5)]
			if rng.IntN(2) == 0 {
				jitter = rng.Int64N(w/50+1) - w/100
			}
			return max(now, edge+jitter)
		case 7:
			return now + rng.Int64N(3*w)
		default:
			return now + rng.Int64N(w/10+1)
		}
	}
}

func randomHits(rng *rand.Rand, limit int64) int64 {
	switch rng.IntN(10) {
	case 0:
		return 0
	case 1, 2, 3, 4, 5:
		return 1
	default:
		return rng.Int64N(limit + 3)
	}
}

// windowLoad returns, for a log of admissions, the largest number of hits
// admitted in one aligned window, and the worst and mean over every
// trailing window (t−W, t] ending at an admission of the hits admitted in
// it.
func windowLoad(times, hits []int64, w int64) (aligned, worst int64, mean float64) {
	var inWindow, cur, sum int64
	cur = -1
	j := 0
	var total float64
	for i, t := range times {
		if t-t%w != cur {
			cur, inWindow = t-t%w, 0
		}
		inWindow += hits[i]
		aligned = max(aligned, inWindow)
		sum += hits[i]
		for times[j] <= t-w {
			sum -= hits[j]
			j++
		}
		worst = max(worst, sum)
		total += float64(sum)
	}
	if len(times) > 0 {
		mean = total / float64(len(times))
	}
	return aligned, worst, mean
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

// checkBound checks the documented bound of lim's algorithm on a log of
// admissions (times non-decreasing, hits[i] admitted at times[i]), with
// the limit in force (soft headroom included).
func checkBound(lim Limit, times, hits []int64) error {
	limit, burst := lim.Limit, capacity(lim)
	if lim.Mode == ModeSoft {
		limit, burst = softLimit(limit, lim.SoftPercent), softLimit(burst, lim.SoftPercent)
	}
	w := lim.WindowMS * ms
	if lim.CountRefused && lim.Algorithm != TokenBucket && lim.Algorithm != GCRA && lim.Algorithm != LeakyBucket {
		return nil // the log holds refused hits too
	}
	switch lim.Algorithm {
	case TokenBucket, GCRA, LeakyBucket:
		// Any closed interval [s, t] admits at most burst + limit × (t − s) / W:
		// every interval for short logs, those up to 4 windows for long ones.
		span := int64(math.MaxInt64)
		if len(times) > 5000 {
			span = 4 * w
		}
		for j := range times {
			var sum int64
			for i := j; i >= 0 && times[j]-times[i] <= span; i-- {
				sum += hits[i]
				if mul128(sum, w).cmp(mul128(burst, w).add128(mul128(limit, times[j]-times[i]))) > 0 {
					return fmt.Errorf("%d hits admitted in [%d, %d], more than %d + %d × %d / %d", sum, times[i], times[j], burst, limit, times[j]-times[i], w)
				}
			}
		}
	case SlidingLog, FixedWindow:
		// Every trailing window (t − W, t] for the log, every (calendar)
		// window for the fixed window, admits at most the limit.
		j := 0
		var sum int64
		for i, t := range times {
			sum += hits[i]
			for {
				from := t - w
				if lim.Algorithm == FixedWindow {
					start, _ := refWindow(lim.Calendar, w, t)
					from = start - 1
				}
				if times[j] > from {
					break
				}
				sum -= hits[j]
				j++
			}
			if sum > limit {
				return fmt.Errorf("%d hits admitted in the window ending at %d, more than %d", sum, t, limit)
			}
		}
	default:
		n, g := int64(1), w
		if lim.SubWindows > 1 {
			n, g = lim.SubWindows, (w+lim.SubWindows-1)/lim.SubWindows
		}
		// Any n consecutive aligned sub-windows admit at most the limit;
		// any trailing window of n × g ≥ W at most the limit plus the
		// hits of the sub-window holding its start.
		inSub := func(from int64) int64 { // hits admitted in the sub-window holding from
			start := from - from%g
			i := sort.Search(len(times), func(k int) bool { return times[k] >= start })
			var c int64
			for ; i < len(times) && times[i] < start+g; i++ {
				c += hits[i]
			}
			return c
		}
		j, k := 0, 0
		var trailing, aligned int64
		for i, t := range times {
			trailing += hits[i]
			aligned += hits[i]
			for times[j] <= t-n*g {
				trailing -= hits[j]
				j++
			}
			cur := t - t%g
			for times[k] < cur-(n-1)*g {
				aligned -= hits[k]
				k++
			}
			if aligned > limit {
				return fmt.Errorf("%d hits admitted in the %d sub-windows up to %d, more than %d", aligned, n, t, limit)
			}
			if extra := inSub(t - n*g); trailing > limit+extra {
				return fmt.Errorf("%d hits admitted in (%d, %d], more than %d + %d", trailing, t-n*g, t, limit, extra)
			}
		}
	}
	return nil
}

// checkShaped checks the output of a shaping leaky bucket: the requests,
// each sent when its delay has passed, carry in any interval [s, t] at
// most one request's hits plus limit × (t − s + 1 ms) / W (the delays are
// rounded up to whole ms).
func checkShaped(lim Limit, released, hits []int64) error {
	limit, w := lim.Limit, lim.WindowMS*ms
	if lim.Mode == ModeSoft {
		limit = softLimit(limit, lim.SoftPercent)
	}
	idx := make([]int, len(released))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return released[idx[a]] < released[idx[b]] })
	var maxHits int64
	for _, h := range hits {
		maxHits = max(maxHits, h)
	}
	for b := range idx {
		var sum int64
		for a := b; a >= 0; a-- {
			sum += hits[idx[a]]
			span := released[idx[b]] - released[idx[a]] + ms
			if sum > maxHits && mul128(sum-maxHits, w).cmp(mul128(limit, span)) > 0 {
				return fmt.Errorf("%d hits released in %d ns", sum, span-ms)
			}
		}
	}
	return nil
}

// TestAccuracy measures, for every algorithm, how many hits it admits in a
// trailing window of length W compared with the limit, for several
// traffic shapes, each offered well over the limit, and checks each
// algorithm's bound on what it admitted. It prints the table of
// docs/algorithms.md:
//
//	go test ./bucket/ -run TestAccuracy -v
func TestAccuracy(t *testing.T) {
	t.Parallel()
	const (
		limit   = 100
		windows = 400
		seeds   = 5
	)
	lims := []struct {
		name string
		lim  Limit
	}{
		{"sliding_window", sw(limit, 1000)},
		{"sliding_window, 10 sub-windows", Limit{Algorithm: SlidingWindow, Limit: limit, WindowMS: 1000, SubWindows: 10}},
		{"sliding_log", Limit{Algorithm: SlidingLog, Limit: limit, WindowMS: 1000}},
		{"token_bucket (burst = limit)", Limit{Algorithm: TokenBucket, Limit: limit, WindowMS: 1000}},
		{"gcra (burst = limit)", Limit{Algorithm: GCRA, Limit: limit, WindowMS: 1000}},
		{"leaky_bucket (burst = limit)", Limit{Algorithm: LeakyBucket, Limit: limit, WindowMS: 1000}},
		{"fixed_window", Limit{Algorithm: FixedWindow, Limit: limit, WindowMS: 1000}},
	}
	w := int64(1000) * ms
	shapes := []struct {
		name string
		gen  func(rng *rand.Rand, emit func(at int64))
	}{{
		// Exponential gaps at 3 × the limit's rate.
		name: "Poisson, 3 × limit",
		gen: func(rng *rand.Rand, emit func(int64)) {
			for at := t0; at < t0+windows*w; at += int64(rng.ExpFloat64() * float64(w) / (3 * limit)) {
				emit(at)
			}
		},
	}, {
		// On for 0.05–0.5 W at 20 × the rate, then off for 0.5–3 W.
		name: "bursty on/off",
		gen: func(rng *rand.Rand, emit func(int64)) {
			for at := t0; at < t0+windows*w; {
				end := at + w/20 + rng.Int64N(w*9/20)
				for ; at < end; at += int64(rng.ExpFloat64() * float64(w) / (20 * limit)) {
					emit(at)
				}
				at += w/2 + rng.Int64N(5*w/2)
			}
		},
	}, {
		// 1.5 × limit spread over the last 1% of each window and as many
		// over the first 1% of the next.
		name: "bursts on both sides of every edge",
		gen: func(rng *rand.Rand, emit func(int64)) {
			for edge := t0 + w; edge < t0+windows*w; edge += w {
				for _, from := range []int64{edge - w/100, edge} {
					for range 3 * limit / 2 {
						emit(from + rng.Int64N(w/100))
					}
				}
			}
		},
	}, {
		// The sliding window's worst case: a burst at the end of an idle
		// window, then steady traffic at 5 × the rate through the next one.
		name: "edge burst, then steady (adversarial)",
		gen: func(rng *rand.Rand, emit func(int64)) {
			for start := t0; start < t0+windows*w; start += 2 * w {
				for range limit {
					emit(start + w - 1 - rng.Int64N(w/1000))
				}
				for at := start + w; at < start+2*w; at += w / (5 * limit) {
					emit(at)
				}
			}
		},
	}}
	t.Logf("limit %d per %d ms, %d windows × %d seeds per shape, 1 hit per request", limit, w/ms, windows, seeds)
	t.Logf("| algorithm | %s | %s | %s | %s |", shapes[0].name, shapes[1].name, shapes[2].name, shapes[3].name)
	t.Logf("|---|---|---|---|---|")
	for _, l := range lims {
		row := "| " + l.name + " |"
		for _, shape := range shapes {
			var worst int64
			var meanSum float64
			for seed := range uint64(seeds) {
				rng := rand.New(rand.NewPCG(seed, 42))
				var at []int64
				shape.gen(rng, func(t int64) { at = append(at, t) })
				sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
				var s State
				var times, hits []int64
				for _, now := range at {
					if Decide(&s, l.lim, 1, now).Allowed() {
						times, hits = append(times, now), append(hits, 1)
					}
				}
				_, wst, mean := windowLoad(times, hits, w)
				if err := checkBound(l.lim, times, hits); err != nil || wst > 2*limit {
					t.Fatalf("%s, %s seed %d: trailing window %d, %v", l.name, shape.name, seed, wst, err)
				}
				worst = max(worst, wst)
				meanSum += mean
			}
			row += fmt.Sprintf(" %.2f / %.3f |", float64(worst)/limit, meanSum/seeds/limit)
		}
		t.Log(row)
	}
}
