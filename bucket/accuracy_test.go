package bucket

// Traffic shapes, the documented bound of each algorithm checked on a log of
// admissions (checkBound, checkShaped), and TestAccuracy, which measures
// what each algorithm admits against its limit.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

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
		return checkBucketBound(times, hits, limit, burst, w)
	case SlidingLog, FixedWindow:
		return checkWindowBound(lim, times, hits, limit, w)
	}
	return checkSubWindowBound(lim, times, hits, limit, w)
}

// checkBucketBound is checkBound for the buckets, of limit per w ns and
// capacity burst.
func checkBucketBound(times, hits []int64, limit, burst, w int64) error {
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
	return nil
}

// checkWindowBound is checkBound for the sliding log and the fixed window,
// of limit per w ns.
func checkWindowBound(lim Limit, times, hits []int64, limit, w int64) error {
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
	return nil
}

// checkSubWindowBound is checkBound for the sliding window, of limit per w
// ns, in lim.SubWindows sub-windows or the classic two.
func checkSubWindowBound(lim Limit, times, hits []int64, limit, w int64) error {
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
//
// Long on purpose: two tables (limits, traffic shapes) and the loop over both.
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
