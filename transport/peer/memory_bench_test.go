package peer

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster/check"
)

// BenchmarkPeerMemory is a microbenchmark of what one peer costs a node
// in memory once both have forwarded to each other: the node's connection
// to the peer (a PeerClient's, with its Forwards stream) and the peer's
// connection to the node (the server's side). Both sides run in this
// process, so each of the peers pairs here is what a node of a cluster
// of peers+1 members holds per member under a load spread over all of
// them, at rest between calls (a loaded node holds more: messages in
// flight, and stacks grown by the calls being decided). It reports heap
// and goroutine stack bytes per peer after a collection, and goroutines
// per peer.
func BenchmarkPeerMemory(b *testing.B) {
	const peers = 50
	for b.Loop() {
		heap, stack, gor := peerMemory(b, peers)
		b.ReportMetric(heap, "heap-B/peer")
		b.ReportMetric(stack, "stack-B/peer")
		b.ReportMetric(gor, "goroutines/peer")
	}
}

// peerMemory connects peers PeerClients to one server, each forwarding a
// batch of 100 checks, and returns the growth of heap in use, goroutine
// stacks and goroutines, per peer.
func peerMemory(b *testing.B, peers int) (heap, stack, goroutines float64) {
	srv := startServer(b, &fakeHandler{})
	reqs := keys("k", 100)
	out := make([]check.Outcome, len(reqs))
	moved := make([]string, len(reqs))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// One client first: what every connection shares (the server's
	// goroutines, gRPC's pools) is then in the baseline.
	warm := NewPeerClient(PeerConfig{NodeName: "warm"})
	defer warm.Close()
	if err := warm.Forward(ctx, srv.GRPCAddr(), reqs, out, moved); err != nil {
		b.Fatal(err)
	}
	h0, s0, g0 := memNow()
	clients := make([]*PeerClient, peers)
	for i := range clients {
		clients[i] = NewPeerClient(PeerConfig{NodeName: fmt.Sprint("p", i)})
		if err := clients[i].Forward(ctx, srv.GRPCAddr(), reqs, out, moved); err != nil {
			b.Fatal(err)
		}
	}
	h1, s1, g1 := memNow()
	for _, c := range clients {
		c.Close()
	}
	n := float64(peers)
	return float64(h1-h0) / n, float64(s1-s0) / n, float64(g1-g0) / n
}

// memNow collects garbage and returns the heap in use, the goroutine
// stacks in use and the number of goroutines.
func memNow() (heap, stack uint64, goroutines int) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.StackInuse, runtime.NumGoroutine()
}
