//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// callDeadline is every check's deadline: an answer later than this is an
// error, and the promise is that there is none.
const callDeadline = 5 * time.Second

// Answer is one check of the history.
type Answer struct {
	Start, End time.Duration // since the load began
	Entry      int           // index of the host called
	Key        int
	Admitted   bool
	Remaining  int64  // the key's remaining after the check, as the decider saw it
	Decider    string // the node that decided ("" on error)
	Err        string
}

// Load sends single-hit checks of an exact algorithm (a fixed window longer
// than any test, so the model is: admitted per key over the whole run ≤
// limit) on Keys keys, spread over the hosts, and records every answer.
type Load struct {
	c     *Cluster
	Name  string
	Keys  int
	Limit int64

	mu       sync.Mutex
	begin    time.Time
	answers  []Answer
	entries  []int   // the hosts calls go to; all when nil
	inflight []int64 // calls in flight, by host
}

func NewLoad(c *Cluster, keys int, limit int64) *Load {
	return &Load{c: c, Name: "faults", Keys: keys, Limit: limit, inflight: make([]int64, len(c.Hosts))}
}

// SetEntries makes the calls from now on go to these hosts only (all when
// none are given): clients moving away from a host that does not answer.
// A call already on its way to another host finishes; InFlight counts them.
func (l *Load) SetEntries(hosts ...*Host) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = nil
	for _, h := range hosts {
		l.entries = append(l.entries, h.Index)
	}
}

// InFlight is the number of calls to h not answered yet.
func (l *Load) InFlight(h *Host) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight[h.Index]
}

// pick chooses a host for the next call and counts the call in flight.
func (l *Load) pick(rng *rand.Rand) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := rng.IntN(len(l.c.Hosts))
	if len(l.entries) > 0 {
		e = l.entries[rng.IntN(len(l.entries))]
	}
	l.inflight[e]++
	return e
}

func (l *Load) key(k int) string { return fmt.Sprint("acct:", k) }

func (l *Load) req(k int, hits int64) *sluicev1.CheckRequest {
	return &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{
		Name: l.Name, Key: l.key(k), Hits: proto.Int64(hits), Limit: l.Limit,
		WindowMs: bucket.MaxWindowMS, Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW,
	}}}
}

// Since is the time since the load began.
func (l *Load) Since() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Since(l.begin)
}

// Run sends checks from workers, each at most perSecond, to random hosts
// and keys until ctx is done, at most maxCalls in all. It returns when
// every call has its answer.
func (l *Load) Run(ctx context.Context, workers int, perSecond float64, maxCalls int) {
	l.mu.Lock()
	if l.begin.IsZero() {
		l.begin = time.Now()
	}
	l.mu.Unlock()
	var wg sync.WaitGroup
	paced(ctx, &wg, workers, perSecond, int64(maxCalls), timeSeeded, func(rng *rand.Rand) {
		l.check(l.pick(rng), rng.IntN(l.Keys))
	})
	wg.Wait()
}

// paced starts workers on wg, each calling call at most perWorker times a
// second, with its own rng (rngFor(w) for worker w), until ctx is done or
// maxCalls calls were made in all: every load of these tests is bounded in
// count and time.
func paced(ctx context.Context, wg *sync.WaitGroup, workers int, perWorker float64, maxCalls int64,
	rngFor func(w int) *rand.Rand, call func(rng *rand.Rand)) {
	budget := new(atomic.Int64)
	budget.Store(maxCalls)
	for w := range workers {
		wg.Go(func() {
			rng := rngFor(w)
			tick := time.NewTicker(time.Duration(float64(time.Second) / perWorker))
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if budget.Add(-1) < 0 {
					return
				}
				call(rng)
			}
		})
	}
}

// timeSeeded seeds worker w's rng from the clock.
func timeSeeded(w int) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
}

func (l *Load) check(entry, k int) {
	ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
	defer cancel()
	start := l.Since()
	resp, err := l.c.Hosts[entry].Client().Check(ctx, l.req(k, 1))
	a := Answer{Start: start, End: l.Since(), Entry: entry, Key: k}
	switch {
	case err != nil:
		a.Err = err.Error()
	case resp.Responses[0].Error != "":
		a.Err = resp.Responses[0].Error
	default:
		r := resp.Responses[0]
		a.Decider = r.Owner
		a.Admitted = r.Status == sluicev1.Status_STATUS_UNDER_LIMIT
		a.Remaining = r.Remaining
	}
	l.mu.Lock()
	l.answers = append(l.answers, a)
	l.inflight[entry]--
	l.mu.Unlock()
}

// Calls is the number of answers so far.
func (l *Load) Calls() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.answers)
}

// History is a copy of every answer so far.
func (l *Load) History() []Answer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.answers)
}

// Peek asks host h for key k's remaining without consuming.
func (l *Load) Peek(h *Host, k int) (remaining int64, decider string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
	defer cancel()
	resp, err := h.Client().Check(ctx, l.req(k, 0))
	if err != nil {
		return 0, "", err
	}
	if e := resp.Responses[0].Error; e != "" {
		return 0, "", fmt.Errorf("%s", e)
	}
	return resp.Responses[0].Remaining, resp.Responses[0].Owner, nil
}

// Stats are the figures of a history.
type Stats struct {
	Calls, Errors, Admitted int
	P50, P99, Max           time.Duration
}

func statsOf(h []Answer) Stats {
	var s Stats
	lat := make([]time.Duration, 0, len(h))
	for _, a := range h {
		s.Calls++
		if a.Err != "" {
			s.Errors++
		}
		if a.Admitted {
			s.Admitted++
		}
		lat = append(lat, a.End-a.Start)
	}
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		s.P50, s.P99, s.Max = lat[n/2], lat[(n*99)/100], lat[n-1]
	}
	return s
}

func (s Stats) String() string {
	return fmt.Sprintf("%d calls, %d admitted, %d errors; latency p50 %v, p99 %v, max %v",
		s.Calls, s.Admitted, s.Errors, s.P50.Round(10*time.Microsecond), s.P99.Round(10*time.Microsecond), s.Max.Round(time.Millisecond))
}

// logErrors prints the first few failed calls.
func logErrors(t *testing.T, h []Answer) {
	t.Helper()
	n := 0
	for _, a := range h {
		if a.Err != "" && n < 5 {
			t.Logf("failed call at %v through n%d on key %d: %s", a.Start.Round(time.Millisecond), a.Entry, a.Key, a.Err)
			n++
		}
	}
}
