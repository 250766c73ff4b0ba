package bucket

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// randomWindowMS returns a window of 1 ms .. 1 h, log-uniform.
func randomWindowMS(rng *rand.Rand) int64 {
	windowMS := int64(1)
	for range rng.IntN(23) {
		windowMS = min(2*windowMS+rng.Int64N(2), 3_600_000)
	}
	return windowMS
}

// randomAlgorithmLimit returns a random valid limit of kind.
func randomAlgorithmLimit(rng *rand.Rand, kind string) Limit {
	lim := Limit{Limit: 1 + rng.Int64N(1000), WindowMS: randomWindowMS(rng)}
	burst := func() int64 {
		if rng.IntN(3) == 0 {
			return 0
		}
		return 1 + rng.Int64N(2*lim.Limit)
	}
	switch kind {
	case "sliding_window":
		lim.Algorithm = SlidingWindow
	case "sub_window":
		lim.Algorithm = SlidingWindow
		lim.SubWindows = []int64{2, 3, 4, 7, 10, 60, 1000}[rng.IntN(7)]
	case "sliding_log":
		lim.Algorithm = SlidingLog
	case "token_bucket":
		lim.Algorithm, lim.Burst = TokenBucket, burst()
	case "gcra":
		lim.Algorithm, lim.Burst = GCRA, burst()
	case "leaky_bucket":
		lim.Algorithm, lim.Burst = LeakyBucket, burst()
	case "leaky_bucket_shaping":
		lim.Algorithm, lim.Burst, lim.Shaping = LeakyBucket, burst(), true
	case "fixed_window":
		lim.Algorithm = FixedWindow
	case "fixed_window_day":
		lim.Algorithm, lim.Calendar, lim.WindowMS = FixedWindow, CalendarDay, 24*3600*1000
	case "fixed_window_week":
		lim.Algorithm, lim.Calendar, lim.WindowMS = FixedWindow, CalendarWeek, 7*24*3600*1000
	case "fixed_window_month":
		lim.Algorithm, lim.Calendar, lim.WindowMS = FixedWindow, CalendarMonth, 30*24*3600*1000
	default:
		panic(kind)
	}
	return lim
}

var algorithmKinds = []string{
	"sliding_window", "sub_window", "sliding_log", "token_bucket", "gcra", "leaky_bucket",
	"leaky_bucket_shaping", "fixed_window", "fixed_window_day", "fixed_window_week", "fixed_window_month",
}

// TestAlgorithmsMatchReference replays random traffic against Decide and
// the exact reference of each algorithm, in hard and soft mode, with and
// without CountRefused, and checks every decision, the algorithm's bound
// on the log of admissions, that refusals and peeks change nothing, that
// the same request passes after RetryAfterMS, that fresh states answer
// like zero ones and that every state survives encoding.
func TestAlgorithmsMatchReference(t *testing.T) {
	t.Parallel()
	for _, kind := range algorithmKinds {
		for _, mode := range []string{"hard", "soft", "count_refused"} {
			t.Run(kind+"/"+mode, func(t *testing.T) {
				t.Parallel()
				for seed := range uint64(4) {
					rng := rand.New(rand.NewPCG(seed, uint64(len(kind)*7+len(mode))))
					for range 3 {
						lim := randomAlgorithmLimit(rng, kind)
						switch mode {
						case "soft":
							lim.Mode, lim.SoftPercent = ModeSoft, 1+rng.Int64N(100)
						case "count_refused":
							lim.CountRefused = true
						}
						t.Run(fmt.Sprint(lim), func(t *testing.T) { checkAgainstReference(t, rng, lim, 1500) })
					}
				}
			})
		}
	}
}
