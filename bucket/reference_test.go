package bucket

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"sort"
	"testing"
)

// refCounter is the exact reference: the log of every admitted hit, from
// which it computes what the sliding-window counter is specified to
// answer, by definition and by search rather than by formula.
type refCounter struct {
	limit int64
	w     int64   // window in ns
	times []int64 // admission times, non-decreasing
	cum   []int64 // cum[i] = hits admitted in times[:i]
}

func newRefCounter(lim Limit) *refCounter {
	return &refCounter{limit: lim.Limit, w: lim.WindowMS * ms, cum: []int64{0}}
}

// admitted returns the hits admitted in [from, to).
func (r *refCounter) admitted(from, to int64) int64 {
	i := sort.Search(len(r.times), func(k int) bool { return r.times[k] >= from })
	j := sort.Search(len(r.times), func(k int) bool { return r.times[k] >= to })
	return r.cum[j] - r.cum[i]
}

// estimate is floor(Prev × (W − elapsed)/W) + Count at t, where Prev and
// Count are the hits admitted in the aligned window before t's and in t's.
func (r *refCounter) estimate(t int64) int64 {
	cur := t - t%r.w
	prev := big.NewInt(r.admitted(cur-r.w, cur))
	prev.Mul(prev, big.NewInt(r.w-(t-cur)))
	prev.Quo(prev, big.NewInt(r.w))
	return prev.Int64() + r.admitted(cur, cur+r.w)
}

// firstAt returns the first t ≥ now at which ok(estimate(t)) holds if
// nothing else is admitted. The estimate never grows without admissions
// and is 0 two windows after the last one.
func (r *refCounter) firstAt(now int64, ok func(estimate int64) bool) int64 {
	lo, hi := now, now+2*r.w
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
	d := Decision{Status: OverLimit, Limit: r.limit}
	if allowed {
		d.Status = UnderLimit
		if hits > 0 {
			r.times = append(r.times, now)
			r.cum = append(r.cum, r.cum[len(r.cum)-1]+hits)
			est += hits
		}
	}
	d.Remaining = max(r.limit-est, 0)
	reset := r.firstAt(now, func(e int64) bool { return e == 0 }) - now
	d.ResetAfterMS = ceilDivMS(reset)
	if !allowed {
		need := max(hits, 1)
		if need > r.limit {
			d.RetryAfterMS = ceilDivMS(max(reset, r.w)) // never admissible
		} else {
			d.RetryAfterMS = ceilDivMS(r.firstAt(now, func(e int64) bool { return e+need <= r.limit }) - now)
		}
	}
	return d
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
	ref := newRefCounter(lim)
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
		if got.Allowed() != (got.RetryAfterMS == 0) || got.Remaining < 0 || got.Remaining > lim.Limit {
			t.Fatalf("%+v request %d: inconsistent %+v", lim, i, got)
		}
		if !got.Allowed() && max(hits, 1) <= lim.Limit {
			c := before
			if !Decide(&c, lim, hits, now+got.RetryAfterMS*ms).Allowed() {
				t.Fatalf("%+v request %d: not admitted after RetryAfter %d ms", lim, i, got.RetryAfterMS)
			}
		}
		now = next(rng, now)
	}
	hits := make([]int64, len(ref.times))
	for i := range hits {
		hits[i] = ref.cum[i+1] - ref.cum[i]
	}
	aligned, worst, _ := windowLoad(ref.times, hits, ref.w)
	if aligned > lim.Limit {
		t.Fatalf("%+v: an aligned window admitted %d", lim, aligned)
	}
	if worst > 2*lim.Limit {
		t.Fatalf("%+v: a trailing window admitted %d, more than 2 × limit", lim, worst)
	}
}

// TestAccuracy measures how far the sliding-window counter lets the hits
// admitted in a trailing window of length W exceed the limit, for several
// traffic shapes, each offered well over the limit. It prints the table
// of docs/algorithms.md:
//
//	go test ./bucket/ -run TestAccuracy -v
func TestAccuracy(t *testing.T) {
	t.Parallel()
	const (
		limit   = 100
		windows = 400
		seeds   = 5
	)
	lim := sw(limit, 1000)
	w := lim.WindowMS * ms
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
		// The worst case: a burst at the end of an idle window, then
		// steady traffic at 5 × the rate through the next one.
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
	t.Logf("limit %d per %d ms, %d windows × %d seeds per shape", limit, lim.WindowMS, windows, seeds)
	t.Logf("%-38s %12s %12s %12s", "traffic", "offered/lim", "worst/limit", "mean/limit")
	for _, shape := range shapes {
		var worst int64
		var meanSum, offered float64
		for seed := range uint64(seeds) {
			rng := rand.New(rand.NewPCG(seed, 42))
			var at []int64
			shape.gen(rng, func(t int64) { at = append(at, t) })
			sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
			var s State
			var times, hits []int64
			for _, now := range at {
				if Decide(&s, lim, 1, now).Allowed() {
					times, hits = append(times, now), append(hits, 1)
				}
			}
			aligned, wst, mean := windowLoad(times, hits, w)
			if aligned > limit || wst > 2*limit {
				t.Fatalf("%s seed %d: aligned window %d, trailing window %d", shape.name, seed, aligned, wst)
			}
			worst = max(worst, wst)
			meanSum += mean
			offered += float64(len(at)) / windows / limit
		}
		t.Logf("%-38s %12.2f %12.2f %12.3f", shape.name, offered/seeds, float64(worst)/limit, meanSum/seeds/limit)
	}
}
