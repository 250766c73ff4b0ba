package cluster

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
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
	const limit, before, during = 10, 4, 6
	k := &limitedKey{t: t, key: keysOwnedBy(x, "n0", 1)[0], limit: limit}
	cutOffOwner(t, nodes, net, k, before, during) // a pause, as its peers see it
	// The resume: n0 runs again, its clock past its last heartbeat by more
	// than the forward timeout.
	ahead.Store(int64(3 * forwardTimeout))
	net.Heal()
	for i := range limit {
		if o := k.check(nodes[i%3]); o.Owner != x.Name() {
			t.Fatalf("after the resume %s decided, want the owner %s", o.Owner, x.Name())
		}
	}
	t.Logf("limit %d: %d admitted before the pause, %d during (stand-in), %d in all after %d more checks; pauses noticed by %s: %d",
		limit, before, during, k.admitted, limit, x.Name(), x.Status().Pauses)
	if k.admitted > limit {
		t.Fatalf("%d admitted for a limit of %d: the owner decided from its count of before the pause", k.admitted, limit)
	}
	if x.Status().Pauses != 1 {
		t.Fatalf("%s noticed %d pauses, want 1", x.Name(), x.Status().Pauses)
	}
}

// limitedKey checks one key of an exact limit (a fixed window of an hour)
// and counts what was admitted; a check that errs fails the test.
type limitedKey struct {
	t        *testing.T
	key      string
	limit    int64
	admitted int
}

func (k *limitedKey) check(n *Node) check.Outcome {
	k.t.Helper()
	o := check1(n, check.Request{Name: "api", Key: k.key, Hits: 1,
		Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Limit: k.limit, WindowMS: 3_600_000}})
	if o.Err != "" {
		k.t.Fatalf("check at %s: %+v", n.Name(), o)
	}
	if o.Allowed() {
		k.admitted++
	}
	return o
}

// cutOffOwner checks k before times through nodes[1] and nodes[2], has
// k's owner nodes[0] replicate, then blackholes both links to it and
// checks k during times more, which the replica decides as a stand-in.
func cutOffOwner(t *testing.T, nodes []*Node, net *MemNetwork, k *limitedKey, before, during int) {
	t.Helper()
	for i := range before {
		k.check(nodes[1+i%2])
	}
	if err := nodes[0].ReplicateNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	net.Cut(memAddr(1), memAddr(0), Blackhole)
	net.Cut(memAddr(2), memAddr(0), Blackhole)
	for i := range during {
		if o := k.check(nodes[1+i%2]); o.Owner == nodes[0].Name() {
			t.Fatalf("the cut-off owner decided: %+v", o)
		}
	}
}
