package cluster

// ReplicateNow waits for the replication round in flight. That replicas
// hold the owners' counts, and that a replica decides before the owner's
// failure is detected, is tested in simulated time
// (cluster/clustertest/failover_test.go).

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// gatedReplicate holds the first Replicate call once armed until gate
// closes (or the call's context ends).
type gatedReplicate struct {
	Peers
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedReplicate) Replicate(ctx context.Context, addr string, handoff bool, cs []bucket.Counter) (int, int, error) {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		select {
		case <-g.gate:
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
	return g.Peers.Replicate(ctx, addr, handoff, cs)
}

// ReplicateNow called while the periodic round is sending must not report
// success before that round's copies are on the replicas: the round took
// the changes, so ReplicateNow alone finds nothing left to send.
func TestReplicateNowWaitsForTheRoundInFlight(t *testing.T) {
	t.Parallel()
	net := NewMemNetwork()
	g := &gatedReplicate{Peers: net.Peers(memAddr(0)), entered: make(chan struct{}), gate: make(chan struct{})}
	cfgs := make([]Config, 3)
	for i := range cfgs {
		cfgs[i] = NodeConfig(t, fmt.Sprintf("n%d", i), memAddr(i))
		cfgs[i].Now = FixedClock(t0)
	}
	// The periodic round's send outlasts the first ReplicateNow below.
	cfgs[0].ReplicationInterval = 500 * time.Millisecond
	nodes := StartNodes(t, cfgs, func(i int) Peers {
		if i == 0 {
			return g
		}
		return net.Peers(memAddr(i))
	})
	for i, n := range nodes {
		net.Register(memAddr(i), n)
	}
	key := keysOwnedBy(nodes[0], "n0", 1)[0]
	h := ring.Hash("api", key)
	reps := nodes[0].Ring().Replicas(h, nil)
	if len(reps) != 2 {
		t.Fatalf("replicas %v", reps)
	}
	var replica *Node
	for _, n := range nodes {
		if n.Name() == reps[1].Name {
			replica = n
		}
	}
	g.armed.Store(true)
	if got := admit(t, nodes[1], key, 7, 100); got != 7 {
		t.Fatalf("admitted %d", got)
	}
	holds := func() bool {
		rec, ok, err := replica.Cache().Get(h, writeback.Key{Name: "api", Key: key}, t0.UnixNano())
		return err == nil && ok && rec.State.Count == 7
	}
	select {
	case <-g.entered: // the periodic round took the changes and is sending
	case <-time.After(20 * time.Second):
		t.Fatal("no periodic replication round started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := nodes[0].ReplicateNow(ctx)
	cancel()
	if err == nil && !holds() {
		t.Fatal("ReplicateNow reported success while the replica does not hold the count")
	}
	close(g.gate)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := nodes[0].ReplicateNow(ctx); err != nil {
		t.Fatal(err)
	}
	if !holds() {
		t.Fatal("the replica does not hold the count after ReplicateNow")
	}
}
