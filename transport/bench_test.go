package transport

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

// trivialHandler allows everything; it counts forwarded RPCs.
type trivialHandler struct{ forwards atomic.Int64 }

func (h *trivialHandler) Check(_ context.Context, reqs []check.Request, out []check.Outcome) {
	for i := range reqs {
		out[i] = check.Outcome{Decision: bucket.Decision{Status: bucket.UnderLimit, Limit: reqs[i].Limit.Limit, Remaining: 1}, Owner: "n1"}
	}
}

func (h *trivialHandler) CheckStandIn(ctx context.Context, from string, reqs []check.Request, _ []string, out []check.Outcome, movedTo []string) {
	h.CheckForwarded(ctx, from, reqs, out, movedTo)
}

func (h *trivialHandler) CheckForwarded(ctx context.Context, _ string, reqs []check.Request, out []check.Outcome, _ []string) {
	h.forwards.Add(1)
	h.Check(ctx, reqs, out)
}

func benchCheck(b *testing.B, n int, tr *Tracing) {
	s := startServer(b, &trivialHandler{}, func(c *ServerConfig) { c.Tracing = tr })
	c := dial(b, s.GRPCAddr())
	m := protoReqs(keys("k", n))
	ctx := context.Background()
	if _, err := c.Check(ctx, m); err != nil { // connect
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	done := cpuMeter(b)
	for b.Loop() {
		resp, err := c.Check(ctx, m)
		if err != nil || len(resp.Responses) != n {
			b.Fatal(err)
		}
	}
	done()
}

// BenchmarkCheckUnary is one client call of one item over loopback gRPC,
// client and server in one process (allocations of both are counted).
func BenchmarkCheckUnary(b *testing.B) { benchCheck(b, 1, nil) }

// BenchmarkCheckUnaryTraced is BenchmarkCheckUnary with tracing on: every
// call sampled, its span recorded and handed to a batching processor
// whose exporter drops it (benchTracing).
func BenchmarkCheckUnaryTraced(b *testing.B) { benchCheck(b, 1, benchTracing(b)) }

// benchTracing is tracing on at its most expensive, without the export
// itself: every span sampled and recorded, a batch span processor (as
// sluice serve uses) feeding an exporter that drops the spans.
func benchTracing(b *testing.B) *Tracing {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	return &Tracing{Provider: tp}
}

// BenchmarkCheckBatch100 is one call of 100 items.
func BenchmarkCheckBatch100(b *testing.B) { benchCheck(b, 100, nil) }

// forwardModes are the two ways a forward travels: on the Peer/Forwards
// stream (the default) and as a unary Peer/Forward call.
var forwardModes = []struct {
	name  string
	unary bool
}{{"stream", false}, {"unary", true}}

// BenchmarkForwardParallel forwards one item per call from GOMAXPROCS×4
// goroutines through one PeerClient to a loopback peer, on the stream and
// as unary calls; rpcs/op shows the batching.
func BenchmarkForwardParallel(b *testing.B) {
	for _, inflight := range []int{1, 2, 4} {
		for _, m := range forwardModes {
			b.Run("inflight="+strconv.Itoa(inflight)+"/"+m.name, func(b *testing.B) {
				h := &trivialHandler{}
				s := startServer(b, h)
				pc := peer.NewPeerClient(peer.PeerConfig{NodeName: "a", MaxInFlight: inflight, UnaryForwards: m.unary})
				b.Cleanup(func() { pc.Close() })
				addr := s.GRPCAddr()
				if err := pc.Forward(context.Background(), addr, keys("k", 1), make([]check.Outcome, 1), make([]string, 1)); err != nil {
					b.Fatal(err)
				}
				h.forwards.Store(0)
				var id atomic.Int64
				b.SetParallelism(4)
				b.ReportAllocs()
				b.ResetTimer()
				done := cpuMeter(b)
				b.RunParallel(func(pb *testing.PB) {
					rs := []check.Request{req("w"+strconv.FormatInt(id.Add(1), 10), 1)}
					out := make([]check.Outcome, 1)
					ctx := context.Background()
					for pb.Next() {
						if err := pc.Forward(ctx, addr, rs, out, make([]string, len(out))); err != nil {
							b.Error(err)
							return
						}
					}
				})
				done()
				b.ReportMetric(float64(h.forwards.Load())/float64(b.N), "rpcs/op")
			})
		}
	}
}

// BenchmarkForwardSerial is one caller: the latency of an unbatched
// forward, on the stream and as a unary call.
func BenchmarkForwardSerial(b *testing.B) {
	for _, m := range forwardModes {
		b.Run(m.name, func(b *testing.B) {
			s := startServer(b, &trivialHandler{})
			pc := peer.NewPeerClient(peer.PeerConfig{NodeName: "a", UnaryForwards: m.unary})
			b.Cleanup(func() { pc.Close() })
			rs, out := keys("k", 1), make([]check.Outcome, 1)
			ctx := context.Background()
			if err := pc.Forward(ctx, s.GRPCAddr(), rs, out, make([]string, len(out))); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			done := cpuMeter(b)
			for b.Loop() {
				if err := pc.Forward(ctx, s.GRPCAddr(), rs, out, make([]string, len(out))); err != nil {
					b.Fatal(err)
				}
			}
			done()
		})
	}
}

// BenchmarkServerDecide is the server's part of a 100-item check without the
// network: conversion, handler, response building.
func BenchmarkServerDecide(b *testing.B) {
	s, err := NewServer(ServerConfig{GRPCAddr: "127.0.0.1:0", Handler: &trivialHandler{}})
	if err != nil {
		b.Fatal(err)
	}
	m := protoReqs(keys("k", 100))
	b.ReportAllocs()
	for b.Loop() {
		if resp := s.decide(context.Background(), m.Requests); len(resp.Responses) != 100 {
			b.Fatal(len(resp.Responses))
		}
	}
}

// BenchmarkCheckUnaryParallel is single-item calls from 25×GOMAXPROCS
// goroutines over one connection, client and server in one process: the
// CPU cost per call under load (the shape of `sluice bench --batch 1`).
func BenchmarkCheckUnaryParallel(b *testing.B) {
	s := startServer(b, &trivialHandler{})
	c := dial(b, s.GRPCAddr())
	if _, err := c.Check(context.Background(), protoReqs(keys("k", 1))); err != nil { // connect
		b.Fatal(err)
	}
	b.SetParallelism(25)
	b.ReportAllocs()
	b.ResetTimer()
	done := cpuMeter(b)
	b.RunParallel(func(pb *testing.PB) {
		m := protoReqs(keys("k", 1))
		ctx := context.Background()
		for pb.Next() {
			resp, err := c.Check(ctx, m)
			if err != nil || len(resp.Responses) != 1 {
				b.Error(err)
				return
			}
		}
	})
	done()
}

// forwardingHandler is the entry node of a three-node cluster in miniature:
// it decides the items whose key hashes to it and forwards each other item
// to the peer that owns it, like cluster.Node (without its cache).
type forwardingHandler struct {
	trivialHandler
	peers *peer.PeerClient
	addrs [2]string // the other two owners
}

func (h *forwardingHandler) Check(ctx context.Context, reqs []check.Request, out []check.Outcome) {
	for i := range reqs {
		owner := len(reqs[i].Key) % 3 // keys of three lengths spread evenly
		if owner == 0 {
			h.trivialHandler.Check(ctx, reqs[i:i+1], out[i:i+1])
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, peer.DefaultForwardTimeout)
		if err := h.peers.Forward(fctx, h.addrs[owner-1], reqs[i:i+1], out[i:i+1], make([]string, 1)); err != nil {
			out[i] = check.Outcome{Err: err.Error()}
		}
		cancel()
	}
}

// BenchmarkClusterShape is the load test's shape in one process: 50
// callers send single-item calls to an entry server that forwards two
// thirds of them over the batching PeerClient to two other servers. It
// counts every transport cost of a check: client call, entry server,
// forward, owner's server.
func BenchmarkClusterShape(b *testing.B) { benchClusterShape(b, nil) }

// BenchmarkClusterShapeTraced is BenchmarkClusterShape with tracing on in
// all three servers and the peer client (benchTracing): a forwarded check
// makes three spans (entry server, forward client, owner server), a local
// one a single span.
func BenchmarkClusterShapeTraced(b *testing.B) { benchClusterShape(b, benchTracing(b)) }

func benchClusterShape(b *testing.B, tr *Tracing) {
	traced := func(c *ServerConfig) { c.Tracing = tr }
	owners := [2]*Server{startServer(b, &trivialHandler{}, traced), startServer(b, &trivialHandler{}, traced)}
	pc := peer.NewPeerClient(peer.PeerConfig{NodeName: "entry", Tracing: tr})
	b.Cleanup(func() { pc.Close() })
	h := &forwardingHandler{peers: pc, addrs: [2]string{owners[0].GRPCAddr(), owners[1].GRPCAddr()}}
	entry := startServer(b, h, traced)
	c := dial(b, entry.GRPCAddr())
	keyOf := []string{"k00", "k0001", "k01"} // lengths 3, 5, 4: owners 0, 2, 1
	for _, k := range keyOf {
		if _, err := c.Check(context.Background(), protoReqs([]check.Request{req(k, 1)})); err != nil {
			b.Fatal(err)
		}
	}
	var id atomic.Int64
	b.SetParallelism(25)
	b.ReportAllocs()
	b.ResetTimer()
	done := cpuMeter(b)
	b.RunParallel(func(pb *testing.PB) {
		ms := make([]*sluicev1.CheckRequest, len(keyOf))
		for i, k := range keyOf {
			ms[i] = protoReqs([]check.Request{req(k, 1)})
		}
		n := int(id.Add(1))
		ctx := context.Background()
		for pb.Next() {
			n++
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := c.Check(cctx, ms[n%len(ms)])
			cancel()
			if err != nil || len(resp.Responses) != 1 || resp.Responses[0].Error != "" {
				b.Error(err, resp)
				return
			}
		}
	})
	done()
}
