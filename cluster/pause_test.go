package cluster

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// TestPausedOwnerPullsBeforeDeciding models a short pause of a key's owner
// (shorter than failure detection: its membership never changes): its
// peers get no answer from it (a stopped process accepts connections but
// answers nothing), so the key's replica stands in; then the owner runs
// again, its clock showing the time it did not run. It must take the
// stand-in's count before it decides: with an exact algorithm, never more
// than the limit in all (everything it admitted was replicated).
func TestPausedOwnerPullsBeforeDeciding(t *testing.T) {
	t.Parallel()
	const forwardTimeout = 200 * time.Millisecond
	var ahead atomic.Int64 // how far n0's clock is ahead of t0 (ns)
	nodes, net := memCluster(t, 3, func(c *Config) {
		c.ForwardTimeout = forwardTimeout
		if c.Name == "n0" {
			c.Now = func() time.Time { return t0.Add(time.Duration(ahead.Load())) }
		}
	})
	x := nodes[0]
	key := keysOwnedBy(x, "n0", 1)[0]
	const limit, before, during = 10, 4, 6
	admitted := 0
	check := func(n *Node) bucket.Outcome {
		t.Helper()
		o := check1(n, bucket.Request{Name: "api", Key: key, Hits: 1,
			Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Limit: limit, WindowMS: 3_600_000}})
		if o.Err != "" {
			t.Fatalf("check at %s: %+v", n.Name(), o)
		}
		if o.Allowed() {
			admitted++
		}
		return o
	}
	for i := range before {
		check(nodes[1+i%2])
	}
	if err := x.ReplicateNow(context.Background()); err != nil {
		t.Fatal(err)
	}

	// The pause: nobody reaches n0, so the replica stands in.
	net.Cut(memAddr(1), memAddr(0), Blackhole)
	net.Cut(memAddr(2), memAddr(0), Blackhole)
	for i := range during {
		if o := check(nodes[1+i%2]); o.Owner == x.Name() {
			t.Fatalf("the paused owner decided: %+v", o)
		}
	}
	// The resume: n0 runs again, its clock past its last heartbeat by more
	// than the forward timeout.
	ahead.Store(int64(3 * forwardTimeout))
	net.Heal()
	for i := range limit {
		if o := check(nodes[i%3]); o.Owner != x.Name() {
			t.Fatalf("after the resume %s decided, want the owner %s", o.Owner, x.Name())
		}
	}
	t.Logf("limit %d: %d admitted before the pause, %d during (stand-in), %d in all after %d more checks; pauses noticed by %s: %d",
		limit, before, during, admitted, limit, x.Name(), x.Status().Pauses)
	if admitted > limit {
		t.Fatalf("%d admitted for a limit of %d: the owner decided from its count of before the pause", admitted, limit)
	}
	if x.Status().Pauses != 1 {
		t.Fatalf("%s noticed %d pauses, want 1", x.Name(), x.Status().Pauses)
	}
}
