package peer_test

// The tracing of forwards: transport.Tracing traces a PeerClient's RPCs
// (PeerConfig.Tracing) and the server's calls. Package peer does not import
// transport, which serves it, so these tests, which need both ends, are
// outside it.

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/internal/wiretest"
	"github.com/sluicehq/sluice/transport/peer"
)

// blockingHandler allows every check, answering with the key as owner; a
// forwarded check waits until block is closed or its context ends.
type blockingHandler struct {
	block    chan struct{}
	forwards atomic.Int64 // CheckForwarded calls
}

func (h *blockingHandler) Check(_ context.Context, reqs []check.Request, out []check.Outcome) {
	for i := range reqs {
		out[i] = check.Outcome{Decision: bucket.Decision{Status: bucket.UnderLimit, Limit: reqs[i].Limit.Limit}, Owner: reqs[i].Key}
	}
}

func (h *blockingHandler) CheckStandIn(ctx context.Context, from string, reqs []check.Request, _ []string, out []check.Outcome, movedTo []string) {
	h.CheckForwarded(ctx, from, reqs, out, movedTo)
}

func (h *blockingHandler) CheckForwarded(ctx context.Context, _ string, reqs []check.Request, out []check.Outcome, _ []string) {
	h.forwards.Add(1)
	select {
	case <-h.block:
	case <-ctx.Done():
	}
	h.Check(ctx, reqs, out)
}

// startServer starts a transport.Server for h, traced by tr, on a loopback
// port and shuts it down when the test ends; it returns its gRPC address.
func startServer(t *testing.T, h transport.Handler, tr *transport.Tracing) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := transport.NewServer(transport.ServerConfig{GRPCListener: lis, Handler: h, Tracing: tr})
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
	return s.GRPCAddr()
}

func memTracing(t *testing.T) (*transport.Tracing, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return &transport.Tracing{Provider: tp}, exp
}

// serverSpans returns the trace ids of the exported server spans named name.
func serverSpans(exp *tracetest.InMemoryExporter, name string) []trace.TraceID {
	var ids []trace.TraceID
	for _, s := range exp.GetSpans() {
		if s.Name == name && s.SpanKind == trace.SpanKindServer {
			ids = append(ids, s.SpanContext.TraceID())
		}
	}
	return ids
}

// The shared helpers of the transport tests (wiretest), by their short
// names here.
var (
	req     = wiretest.Req
	testCtx = wiretest.Ctx
	waitFor = wiretest.WaitFor
)

// A forward that waits in the batch queue rides in an RPC whose span
// continues its caller's trace (the first waiting caller's); a forward
// from an untraced context starts no span at either end.
func TestTracingQueuedForwardKeepsItsTrace(t *testing.T) {
	t.Parallel()
	tr, exp := memTracing(t)
	h := &blockingHandler{block: make(chan struct{})}
	addr := startServer(t, h, tr)
	pc := peer.NewPeerClient(peer.PeerConfig{NodeName: "a", MaxInFlight: 1, Timeout: time.Minute, Tracing: tr})
	defer pc.Close()
	tracer := tr.Provider.Tracer("test")

	ctxA, spanA := tracer.Start(testCtx(t), "caller A")
	ctxB, spanB := tracer.Start(testCtx(t), "caller B")
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	forward := func(ctx context.Context, key string) {
		out := make([]check.Outcome, 1)
		errs <- pc.Forward(ctx, addr, []check.Request{req(key, 1)}, out, make([]string, len(out)))
	}
	wg.Go(func() { forward(ctxA, "a") })
	waitFor(t, 10*time.Second, "A's RPC in flight", func() bool { in, _ := peer.PeerState(pc, addr); return in == 1 && h.forwards.Load() == 1 })
	wg.Go(func() { forward(ctxB, "b") })
	waitFor(t, 10*time.Second, "B queued", func() bool { _, q := peer.PeerState(pc, addr); return q == 1 })
	close(h.block)
	wg.Wait()
	spanA.End()
	spanB.End()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "two Forward server spans", func() bool { return len(serverSpans(exp, "sluice.v1.Peer/Forward")) == 2 })
	got := map[trace.TraceID]bool{}
	for _, id := range serverSpans(exp, "sluice.v1.Peer/Forward") {
		got[id] = true
	}
	if !got[spanA.SpanContext().TraceID()] || !got[spanB.SpanContext().TraceID()] {
		t.Errorf("server spans in traces %v; want A's %s (sent at once) and B's %s (queued)", got, spanA.SpanContext().TraceID(), spanB.SpanContext().TraceID())
	}

	// Untraced: no span anywhere.
	exp.Reset()
	out := make([]check.Outcome, 1)
	if err := pc.Forward(testCtx(t), addr, []check.Request{req("c", 1)}, out, make([]string, len(out))); err != nil {
		t.Fatal(err)
	}
	if ss := exp.GetSpans(); len(ss) != 0 {
		t.Errorf("an untraced forward made %d spans (%s...)", len(ss), ss[0].Name)
	}
}
