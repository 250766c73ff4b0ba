package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// allowAll allows every valid check; it counts the checks it saw and
// remembers the client addresses they came from.
type allowAll struct {
	checks atomic.Int64
	mu     sync.Mutex
	from   map[string]bool
}

func (h *allowAll) Check(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome) {
	h.checks.Add(int64(len(reqs)))
	if p, ok := peer.FromContext(ctx); ok {
		h.mu.Lock()
		h.from[p.Addr.String()] = true
		h.mu.Unlock()
	}
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			out[i] = bucket.Outcome{Err: err.Error()}
			continue
		}
		out[i] = bucket.Outcome{Decision: bucket.Decision{Status: bucket.UnderLimit, Limit: reqs[i].Limit.Limit}, Owner: "n1"}
	}
}

func (h *allowAll) CheckStandIn(ctx context.Context, _ string, reqs []bucket.Request, out []bucket.Outcome) {
	h.Check(ctx, reqs, out)
}

func (h *allowAll) CheckForwarded(ctx context.Context, _ string, reqs []bucket.Request, out []bucket.Outcome) {
	h.Check(ctx, reqs, out)
}

func startBenchServer(t *testing.T, h transport.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := transport.NewServer(transport.ServerConfig{GRPCListener: l, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s.GRPCAddr()
}

// TestBenchSpreadsCallersOverConnections runs a bounded bench (--calls) over
// several connections and checks its summary against what the server saw.
func TestBenchSpreadsCallersOverConnections(t *testing.T) {
	t.Parallel()
	h := &allowAll{from: map[string]bool{}}
	addr := startBenchServer(t, h)
	var out, errOut bytes.Buffer
	err := bench(context.Background(), []string{
		"--addr", addr, "--conns", "3", "--concurrency", "6", "--batch", "4", "--keys", "10",
		"--calls", "60", "--duration", "20s", "--json",
		"--gc-min-heap", "0", // GOGC is the process's: leave it to the other tests

	}, &out, &errOut)
	if err != nil {
		t.Fatalf("bench: %v (%s)", err, errOut.String())
	}
	var res benchResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("summary %q: %v", out.String(), err)
	}
	if res.Calls != 60 || res.Checks != 240 || res.Allowed != 240 || res.CallErrors != 0 || res.ItemErrors != 0 {
		t.Errorf("summary %+v; want 60 calls of 4 allowed checks, no errors", res)
	}
	if got := h.checks.Load(); got != 240 {
		t.Errorf("server saw %d checks, want 240", got)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.from) != 3 {
		t.Errorf("calls came over %d connections %v, want 3", len(h.from), h.from)
	}
}

func TestBenchRefusesBadConns(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"0", "1001"} {
		var out, errOut bytes.Buffer
		err := bench(context.Background(), []string{"--addr", "127.0.0.1:1", "--conns", n}, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), "--conns") {
			t.Errorf("--conns %s: err %v, want a --conns error", n, err)
		}
	}
}
