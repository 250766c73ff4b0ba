package clustertest

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// gatedReplicate holds the first Replicate call once armed until gate
// closes (or the call's context ends).
type gatedReplicate struct {
	cluster.Peers
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
	synctest.Test(t, func(t *testing.T) {
		g := &gatedReplicate{entered: make(chan struct{}), gate: make(chan struct{})}
		c := formed(t, Options{
			Configure: func(cfg *cluster.Config) {
				if cfg.Config.Name == "n0" {
					// The periodic round's send outlasts the first
					// ReplicateNow below.
					cfg.ReplicationInterval = 500 * time.Millisecond
				}
			},
			Peers: peersOf("n0", func(p cluster.Peers) cluster.Peers { g.Peers = p; return g }),
		}, "n0", "n1", "n2")
		n0 := c.Member("n0").Node
		key := ownedBy(c, "n0", "n0", "replicated:", 1)[0]
		h := ring.Hash(LimitName, key)
		reps := n0.Ring().Replicas(h, nil)
		if len(reps) != 2 {
			t.Fatalf("replicas %v", reps)
		}
		replica := c.Member(reps[1].Name).Node
		g.armed.Store(true)
		if got := admitted(t, c, "n1", key, 100, 7); got != 7 {
			t.Fatalf("admitted %d", got)
		}
		holds := func() bool {
			rec, ok, err := replica.Cache().Get(h, writeback.Key{Name: LimitName, Key: key}, time.Now().UnixNano())
			return err == nil && ok && rec.State.Count == 7
		}
		select {
		case <-g.entered: // the periodic round took the changes and is sending
		case <-time.After(20 * time.Second):
			t.Fatal("no periodic replication round started within 20 s of the bubble's time")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := n0.ReplicateNow(ctx)
		cancel()
		if err == nil && !holds() {
			t.Fatal("ReplicateNow reported success while the replica does not hold the count")
		}
		close(g.gate)
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n0.ReplicateNow(ctx); err != nil {
			t.Fatal(err)
		}
		if !holds() {
			t.Fatal("the replica does not hold the count after ReplicateNow")
		}
	})
}
