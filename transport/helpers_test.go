package transport

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster/check"
)

// fakeHandler decides like a limiter with no memory: a valid request is over
// its limit when Hits > Limit. Owner echoes the key (prefixed with the sender
// for forwarded calls), so tests can check each answer belongs to its item.
// (Package peer's tests have their own, which records more of the forwards.)
type fakeHandler struct {
	calls     atomic.Int64 // Check calls
	forwards  atomic.Int64 // CheckForwarded and CheckStandIn calls (= Forward RPCs)
	mu        sync.Mutex
	last      []check.Request // copy of the last Check's requests
	block     chan struct{}   // when set, CheckForwarded waits on it or ctx
	panicking bool
}

var _ Handler = (*fakeHandler)(nil)

func (h *fakeHandler) Check(ctx context.Context, reqs []check.Request, out []check.Outcome) {
	h.calls.Add(1)
	if h.panicking {
		panic("fake handler panics")
	}
	h.mu.Lock()
	h.last = append(h.last[:0], reqs...)
	h.mu.Unlock()
	decide(reqs, out, "")
}

// CheckStandIn answers like CheckForwarded.
func (h *fakeHandler) CheckStandIn(ctx context.Context, from string, reqs []check.Request, _ []string, out []check.Outcome, movedTo []string) {
	h.CheckForwarded(ctx, from, reqs, out, movedTo)
}

func (h *fakeHandler) CheckForwarded(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, _ []string) {
	h.forwards.Add(1)
	h.mu.Lock()
	block := h.block
	h.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
		}
	}
	decide(reqs, out, from+"/")
}

func decide(reqs []check.Request, out []check.Outcome, prefix string) {
	for i := range reqs {
		r := &reqs[i]
		if err := r.Validate(); err != nil {
			out[i] = check.Outcome{Err: err.Error(), Owner: prefix + r.Key}
			continue
		}
		if len(r.More) == 0 {
			out[i] = check.Outcome{Decision: fakeDecide(r.Limit, r.Hits), Owner: prefix + r.Key}
			continue
		}
		var ds []bucket.Decision
		if r.Limit != (bucket.Limit{}) {
			ds = append(ds, fakeDecide(r.Limit, r.Hits))
		}
		for _, l := range r.More {
			ds = append(ds, fakeDecide(l, r.Hits))
		}
		out[i] = check.Outcome{Decision: bucket.Combine(ds), Owner: prefix + r.Key}
	}
}

// fakeDecide is over the limit when hits > l.Limit.
func fakeDecide(l bucket.Limit, hits int64) bucket.Decision {
	if hits > l.Limit {
		return bucket.Decision{Status: bucket.OverLimit, Limit: l.Limit, ResetAfterMS: 11_200, RetryAfterMS: 1_500}
	}
	return bucket.Decision{Status: bucket.UnderLimit, Limit: l.Limit, Remaining: l.Limit - hits, ResetAfterMS: l.WindowMS}
}

// req is a valid request for key k with the given hits against a limit of 10
// per minute.
func req(k string, hits int64) check.Request {
	return check.Request{Name: "api", Key: k, Hits: hits, Limit: bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 10, WindowMS: 60_000}}
}

func keys(prefix string, n int) []check.Request {
	rs := make([]check.Request, n)
	for i := range rs {
		rs[i] = req(prefix+strconv.Itoa(i), 1)
	}
	return rs
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// startServer starts a Server with gRPC and HTTP on loopback ports chosen by
// the kernel and shuts it down when the test ends.
func startServer(t testing.TB, h Handler, edit ...func(*ServerConfig)) *Server {
	t.Helper()
	cfg := ServerConfig{GRPCListener: listen(t), HTTPListener: listen(t), Handler: h}
	for _, e := range edit {
		e(&cfg)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return s
}

func dial(t testing.TB, addr string) *client.Node {
	t.Helper()
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(time.Millisecond) // polling interval, not synchronisation
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
