package transport

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// trivialHandler allows everything; it counts forwarded RPCs.
type trivialHandler struct{ forwards atomic.Int64 }

func (h *trivialHandler) Check(_ context.Context, reqs []bucket.Request, out []bucket.Outcome) {
	for i := range reqs {
		out[i] = bucket.Outcome{Decision: bucket.Decision{Status: bucket.UnderLimit, Limit: reqs[i].Limit.Limit, Remaining: 1}, Owner: "n1"}
	}
}

func (h *trivialHandler) CheckStandIn(ctx context.Context, from string, reqs []bucket.Request, out []bucket.Outcome) {
	h.CheckForwarded(ctx, from, reqs, out)
}

func (h *trivialHandler) CheckForwarded(ctx context.Context, _ string, reqs []bucket.Request, out []bucket.Outcome) {
	h.forwards.Add(1)
	h.Check(ctx, reqs, out)
}

func benchCheck(b *testing.B, n int) {
	s := startServer(b, &trivialHandler{})
	c := dial(b, s.GRPCAddr())
	m := protoReqs(keys("k", n))
	ctx := context.Background()
	if _, err := c.Check(ctx, m); err != nil { // connect
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := c.Check(ctx, m)
		if err != nil || len(resp.Responses) != n {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckUnary is one client call of one item over loopback gRPC,
// client and server in one process (allocations of both are counted).
func BenchmarkCheckUnary(b *testing.B) { benchCheck(b, 1) }

// BenchmarkCheckBatch100 is one call of 100 items.
func BenchmarkCheckBatch100(b *testing.B) { benchCheck(b, 100) }

// BenchmarkForwardParallel forwards one item per call from GOMAXPROCS×4
// goroutines through one PeerClient to a loopback peer; rpcs/op shows the
// batching.
func BenchmarkForwardParallel(b *testing.B) {
	for _, inflight := range []int{1, 2, 4} {
		b.Run("inflight="+strconv.Itoa(inflight), func(b *testing.B) {
			h := &trivialHandler{}
			s := startServer(b, h)
			pc := NewPeerClient(PeerConfig{NodeName: "a", MaxInFlight: inflight})
			b.Cleanup(func() { pc.Close() })
			addr := s.GRPCAddr()
			if err := pc.Forward(context.Background(), addr, keys("k", 1), make([]bucket.Outcome, 1)); err != nil {
				b.Fatal(err)
			}
			h.forwards.Store(0)
			var id atomic.Int64
			b.SetParallelism(4)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rs := []bucket.Request{req("w"+strconv.FormatInt(id.Add(1), 10), 1)}
				out := make([]bucket.Outcome, 1)
				ctx := context.Background()
				for pb.Next() {
					if err := pc.Forward(ctx, addr, rs, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(h.forwards.Load())/float64(b.N), "rpcs/op")
		})
	}
}

// BenchmarkForwardSerial is one caller: the latency of an unbatched forward.
func BenchmarkForwardSerial(b *testing.B) {
	s := startServer(b, &trivialHandler{})
	pc := NewPeerClient(PeerConfig{NodeName: "a"})
	b.Cleanup(func() { pc.Close() })
	rs, out := keys("k", 1), make([]bucket.Outcome, 1)
	ctx := context.Background()
	if err := pc.Forward(ctx, s.GRPCAddr(), rs, out); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := pc.Forward(ctx, s.GRPCAddr(), rs, out); err != nil {
			b.Fatal(err)
		}
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
		if resp := s.decide(context.Background(), m.Requests, false, ""); len(resp.Responses) != 100 {
			b.Fatal(len(resp.Responses))
		}
	}
}
