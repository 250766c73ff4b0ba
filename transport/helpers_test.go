package transport

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/transport/internal/wiretest"
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

// The shared helpers of the transport tests (wiretest), by their short
// names here.
var (
	decide  = wiretest.Decide
	req     = wiretest.Req
	keys    = wiretest.Keys
	listen  = wiretest.Listen
	waitFor = wiretest.WaitFor
	testCtx = wiretest.Ctx
	dial    = wiretest.Dial
)
