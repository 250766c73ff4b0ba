package cluster_test

// Helpers of the tests that run on the simulated cluster of
// cluster/clustertest: real memberlist over an in-memory transport, in a
// testing/synctest bubble. They are in package cluster_test because
// clustertest imports cluster; the internals they reach are in
// export_test.go.

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/clustertest"
)

// check1 sends r through n and returns its answer.
func check1(n *cluster.Node, r check.Request) check.Outcome {
	out := make([]check.Outcome, 1)
	n.Check(context.Background(), []check.Request{r}, out)
	return out[0]
}

// nodesOf returns the running nodes of the members named names.
func nodesOf(c *clustertest.Cluster, names ...string) []*cluster.Node {
	nodes := make([]*cluster.Node, len(names))
	for i, name := range names {
		nodes[i] = c.Member(name).Node
	}
	return nodes
}

// limitedKey checks one key of an exact limit (a fixed window of an hour)
// and counts what was admitted; a check that errs fails the test.
type limitedKey struct {
	t        *testing.T
	key      string
	limit    int64
	admitted int
}

func (k *limitedKey) check(n *cluster.Node) check.Outcome {
	k.t.Helper()
	o := check1(n, check.Request{Name: clustertest.LimitName, Key: k.key, Hits: 1,
		Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Limit: k.limit, WindowMS: 3_600_000}})
	if o.Err != "" {
		k.t.Fatalf("check at %s: %+v", n.Name(), o)
	}
	if o.Allowed() {
		k.admitted++
	}
	return o
}

// cutOffOwner checks k before times through n1 and n2, has k's owner n0
// replicate, then blackholes both links to it and checks k during times
// more, which the replica decides as a stand-in.
func cutOffOwner(t *testing.T, c *clustertest.Cluster, k *limitedKey, before, during int) {
	t.Helper()
	nodes := nodesOf(c, "n0", "n1", "n2")
	for i := range before {
		k.check(nodes[1+i%2])
	}
	if err := nodes[0].ReplicateNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	to := c.Member("n0").PeerAddr
	c.Peers.Cut(c.Member("n1").PeerAddr, to, cluster.Blackhole)
	c.Peers.Cut(c.Member("n2").PeerAddr, to, cluster.Blackhole)
	for i := range during {
		if o := k.check(nodes[1+i%2]); o.Owner == nodes[0].Name() {
			t.Fatalf("the cut-off owner decided: %+v", o)
		}
	}
}
