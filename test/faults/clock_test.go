//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// clockAnswer is one check of the clock scenario, with wall-clock times
// (the test and the nodes share the machine's clock; only the nodes'
// decisions are shifted).
type clockAnswer struct {
	Start, End time.Time
	Entry      string // the host called
	Alg        int    // index in clockAlgs
	Key        int
	Admitted   bool
	Owner      string
	Remaining  int64
	ResetMS    int64
	RetryMS    int64
	Err        string
}

var clockAlgs = []struct {
	name string
	alg  sluicev1.Algorithm
}{
	{"clock.fixed", sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW},
	{"clock.sliding", sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW},
}

// TestClockStep is the clock fault scenario: of three hosts, n1 decides
// with its clock 2 s ahead (SLUICE_TEST_CLOCK_OFFSET=2s), is stopped
// gracefully under load and started again 2 s behind (-2s), so each of its
// keys moves from a clock 2 s ahead to the others' and back to one 2 s
// behind. Keys of an exact fixed window and of the sliding-window counter,
// window clockWindow, are checked through every host all along.
//
// Promises checked (derivations in the comments below, printed):
//   - fixed window: every window admits at most the limit. The window of an
//     admission is found from its answer: the decider's clock at the
//     decision (wall time + its offset) + reset_after_ms is the end of the
//     window the decider counted in, a multiple of the window.
//   - sliding window: any trailing wall-clock interval of one window admits
//     at most 2 × limit with one clock (each aligned window admits at most
//     the limit, and an interval of length W meets two of them); a step of
//     the deciding clock by Δ < W can shorten one aligned window by Δ in
//     wall time, so an interval of length W meets at most three: the bound
//     checked is 3 × limit, and how far above 2 × limit a key went is
//     printed.
//   - every answer sane: remaining in 0..limit, reset and retry ≥ 0 and at
//     most what the window allows plus the clock difference.
//   - afterwards every host answers the same remaining and owner per key.
//
// Long on purpose: one story (skew, stop, restart skewed back), then each promise.
func TestClockStep(t *testing.T) {
	const (
		clockWindow = 4 * time.Second
		limit       = 10
		keys        = 12 // per algorithm
		phase       = 15 * time.Second
		skew        = 2 * time.Second
		// 3 workers × 40 calls/s over 24 keys: 5 per key per second, 20
		// per window for a limit of 10, so every window is used up.
		workers, perWorker = 3, 40
		maxCalls           = 3 * workers * perWorker * 60 // 3 min at the rate: the run's upper bound
	)
	c := New(t, 3)
	n1 := c.Hosts[1]
	n1.Env = []string{"SLUICE_TEST_CLOCK_OFFSET=" + skew.String()}
	c.StartAll()
	if !strings.Contains(n1.log.String(), "test-only clock offset in effect") {
		t.Fatalf("n1 did not log the clock offset warning:\n%s", n1.log.String())
	}

	// n1's offset over time: +skew until it stopped, -skew after its restart.
	var (
		omu                sync.Mutex
		n1Stopped, n1Again time.Time
		n1Down, n1Up       time.Time // SIGTERM sent; back in every view
	)
	offsetOf := func(owner string, at time.Time) (time.Duration, bool) {
		if owner != n1.Name {
			return 0, true
		}
		omu.Lock()
		defer omu.Unlock()
		switch {
		case n1Stopped.IsZero() || at.Before(n1Stopped):
			return skew, true
		case !n1Again.IsZero() && at.After(n1Again):
			return -skew, true
		}
		return 0, false // decided by n1 while it was not running: impossible
	}

	var (
		hmu     sync.Mutex
		history []clockAnswer
	)
	req := func(alg, key int, hits int64) *sluicev1.CheckRequest {
		return &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{
			Name: clockAlgs[alg].name, Key: fmt.Sprint("k:", key), Hits: proto.Int64(hits),
			Limit: limit, WindowMs: clockWindow.Milliseconds(), Algorithm: clockAlgs[alg].alg,
		}}}
	}
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	paced(ctx, &wg, workers, perWorker, maxCalls, timeSeeded, func(rng *rand.Rand) {
		alg, key := rng.IntN(len(clockAlgs)), rng.IntN(keys)
		h := c.Hosts[rng.IntN(len(c.Hosts))]
		cctx, cancel := context.WithTimeout(context.Background(), callDeadline)
		a := clockAnswer{Start: time.Now(), Entry: h.Name, Alg: alg, Key: key}
		resp, err := h.Client().Check(cctx, req(alg, key, 1))
		cancel()
		a.End = time.Now()
		switch {
		case err != nil:
			a.Err = err.Error()
		case resp.Responses[0].Error != "":
			a.Err = resp.Responses[0].Error
		default:
			r := resp.Responses[0]
			a.Admitted = r.Status == sluicev1.Status_STATUS_UNDER_LIMIT
			a.Owner, a.Remaining, a.ResetMS, a.RetryMS = r.Owner, r.Remaining, r.ResetAfterMs, r.RetryAfterMs
		}
		hmu.Lock()
		history = append(history, a)
		hmu.Unlock()
	})
	stop := sync.OnceFunc(func() { stopLoad(); wg.Wait() })
	t.Cleanup(stop)

	hold := func(d time.Duration) {
		select {
		case <-time.After(d): // the phase's length (not a synchronisation)
		case <-t.Context().Done():
		}
	}
	hold(phase)
	// Graceful stop of n1 (SIGTERM: it hands its keys to the others), then
	// a start 2 s behind.
	omu.Lock()
	n1Down = time.Now()
	omu.Unlock()
	if err := syscall.Kill(n1.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "n1 exits after SIGTERM", n1.Exited)
	n1.mu.Lock()
	exitErr := n1.err
	n1.mu.Unlock()
	if exitErr != nil {
		t.Errorf("n1's graceful stop: %v", exitErr)
	}
	omu.Lock()
	n1Stopped = time.Now()
	omu.Unlock()
	c.WaitViews(30*time.Second, []*Host{c.Hosts[0], c.Hosts[2]})
	n1.Env = []string{"SLUICE_TEST_CLOCK_OFFSET=" + (-skew).String()}
	omu.Lock()
	n1Again = time.Now()
	omu.Unlock()
	n1.Restart()
	c.WaitViews(30*time.Second, c.Hosts)
	omu.Lock()
	n1Up = time.Now()
	omu.Unlock()
	t.Logf("n1 (+%v) stopped at %v, started again at -%v; all three alive", skew, n1Stopped.Format("15:04:05.000"), skew)
	hold(phase)
	stop()

	hmu.Lock()
	h := slices.Clone(history)
	hmu.Unlock()
	stats := map[string]int{}
	errs, entryDown := 0, 0
	for _, a := range h {
		if a.Err != "" && a.Entry == n1.Name && !a.End.Before(n1Down) && !a.Start.After(n1Up) {
			// Called n1 while it was stopping, stopped or starting: its
			// clients see it down, which is not the cluster's answer.
			entryDown++
			continue
		}
		if a.Err != "" {
			errs++
			if errs <= 5 {
				t.Logf("failed call at %v: %s", a.Start.Format("15:04:05.000"), a.Err)
			}
			continue
		}
		stats[a.Owner]++
	}
	t.Logf("%d checks, %d failed through the three hosts while they ran, %d sent to n1 while it was down; decided by: %v", len(h), errs, entryDown, stats)
	if errs > 0 {
		t.Errorf("%d of %d checks got an error through a running host (a graceful stop and start answers every check)", errs, len(h))
	}

	// Sanity of every answer. A state may be ahead of its decider's clock
	// by the largest difference of two clocks (2 × skew): a fixed window's
	// reset is then at most W + 2·skew, the sliding window's (until both
	// of its windows are empty) at most 2W + 2·skew.
	maxReset := map[int]time.Duration{0: clockWindow + 2*skew, 1: 2*clockWindow + 2*skew}
	insane := 0
	for _, a := range h {
		if a.Err != "" {
			continue
		}
		if _, ok := offsetOf(a.Owner, a.Start); !ok {
			insane++
			t.Errorf("decided by %s at %v, while it was not running", a.Owner, a.Start.Format("15:04:05.000"))
		}
		reset := time.Duration(a.ResetMS) * time.Millisecond
		retry := time.Duration(a.RetryMS) * time.Millisecond
		if a.Remaining < 0 || a.Remaining > limit || reset < 0 || reset > maxReset[a.Alg] || retry < 0 || retry > maxReset[a.Alg] {
			insane++
			if insane <= 10 {
				t.Errorf("%s k:%d by %s: remaining %d of %d, reset %v, retry %v (reset and retry bound %v)",
					clockAlgs[a.Alg].name, a.Key, a.Owner, a.Remaining, limit, reset, retry, maxReset[a.Alg])
			}
		}
	}

	// Fixed window: admissions per window the decider counted in.
	type win struct{ key, end int64 }
	perWindow := map[win]int{}
	w := clockWindow.Nanoseconds()
	for _, a := range h {
		if a.Err != "" || !a.Admitted || a.Alg != 0 {
			continue
		}
		mid := a.Start.Add(a.End.Sub(a.Start) / 2)
		off, _ := offsetOf(a.Owner, mid)
		end := mid.Add(off).UnixNano() + a.ResetMS*int64(time.Millisecond)
		// end is a multiple of w, give or take the call's latency (≪ w/2).
		perWindow[win{int64(a.Key), (end + w/2) / w}]++
	}
	fixedOver, fixedMax := 0, 0
	for k, n := range perWindow {
		fixedMax = max(fixedMax, n)
		if n > limit {
			fixedOver++
			t.Errorf("fixed window k:%d, window ending %v (decider's clock): %d admitted, limit %d; its admissions: %s",
				k.key, time.Unix(0, k.end*w).Format("15:04:05.000"), n, limit, clockTrace(h, 0, int(k.key), offsetOf))
		}
	}
	t.Logf("fixed window: %d windows of %d keys, most admitted in one window %d (limit %d), windows over the limit: %d",
		len(perWindow), keys, fixedMax, limit, fixedOver)

	// Sliding window: the most admitted in any trailing interval of one
	// window of wall-clock time, per key.
	bound := 3 * limit
	slideMax, over2, over3 := 0, 0, 0
	for k := range keys {
		var ends []time.Time
		for _, a := range h {
			if a.Err == "" && a.Admitted && a.Alg == 1 && a.Key == k {
				ends = append(ends, a.Start)
			}
		}
		slices.SortFunc(ends, func(x, y time.Time) int { return x.Compare(y) })
		most, j := 0, 0
		for i := range ends {
			for ends[i].Sub(ends[j]) >= clockWindow {
				j++
			}
			most = max(most, i-j+1)
		}
		slideMax = max(slideMax, most)
		if most > 2*limit {
			over2++
		}
		if most > bound {
			over3++
			t.Errorf("sliding window k:%d: %d admitted in %v of wall time, bound %d (3 × limit); its admissions: %s",
				k, most, clockWindow, bound, clockTrace(h, 1, k, offsetOf))
		}
	}
	t.Logf("sliding window: most admitted in %v of wall time on one key %d; bound with one clock 2 × limit = %d (keys above it: %d), with a clock step 3 × limit = %d (keys above it: %d)",
		clockWindow, slideMax, 2*limit, over2, bound, over3)

	// Afterwards every host answers alike (peeks, forwarded to the owner).
	// A peek round that straddles a window's edge sees the count change
	// under it: a key counts as disagreeing only when three rounds do.
	disagree := 0
	for alg := range clockAlgs {
		for k := range keys {
			var last string
			ok := false
			for range 3 {
				var seen []string
				for _, hst := range c.Hosts {
					cctx, cancel := context.WithTimeout(context.Background(), callDeadline)
					resp, err := hst.Client().Check(cctx, req(alg, k, 0))
					cancel()
					if err != nil {
						t.Fatalf("peek %s k:%d through %s: %v", clockAlgs[alg].name, k, hst.Name, err)
					}
					r := resp.Responses[0]
					seen = append(seen, fmt.Sprintf("%d by %s", r.Remaining, r.Owner))
				}
				last = strings.Join(seen, ", ")
				if seen[0] == seen[1] && seen[1] == seen[2] {
					ok = true
					break
				}
			}
			if !ok {
				disagree++
				t.Errorf("%s k:%d: hosts disagree after the clock steps: %s", clockAlgs[alg].name, k, last)
			}
		}
	}
	t.Logf("afterwards: %d of %d keys answered alike through all three hosts", 2*keys-disagree, 2*keys)
}

// clockTrace lists the admissions of one key: wall time, decider and the
// decider's clock offset.
func clockTrace(h []clockAnswer, alg, key int, offsetOf func(string, time.Time) (time.Duration, bool)) string {
	var b strings.Builder
	for _, a := range h {
		if a.Err == "" && a.Admitted && a.Alg == alg && a.Key == key {
			off, _ := offsetOf(a.Owner, a.Start)
			fmt.Fprintf(&b, "%s %s(%+v) rem %d reset %dms; ", a.Start.Format("05.000"), a.Owner, off, a.Remaining, a.ResetMS)
		}
	}
	return b.String()
}
