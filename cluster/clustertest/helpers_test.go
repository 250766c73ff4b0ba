package clustertest

import (
	"context"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"

	"github.com/sluicehq/sluice/ring"
)

// peersOf returns an Options.Peers that hands the peer calls of the
// member named member to wrap (a test's fault on that node's calls), and
// every other member's through as they are.
func peersOf(member string, wrap func(cluster.Peers) cluster.Peers) func(string, cluster.Peers) cluster.Peers {
	return func(name string, p cluster.Peers) cluster.Peers {
		if name != member {
			return p
		}
		return wrap(p)
	}
}

// admitted sends n single hits against key (limit per Window) through via
// and returns how many were admitted; an answer with an error fails t.
func admitted(t *testing.T, c *Cluster, via, key string, limit int64, n int) int {
	t.Helper()
	got := 0
	for range n {
		o, err := c.Check(via, key, limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if o.Allowed() {
			got++
		}
	}
	return got
}

// checkVia sends r, a request of the test's own making (another algorithm,
// several limits), through the member via and returns its answer, error
// included; none within CheckTimeout fails t.
func checkVia(t *testing.T, c *Cluster, via string, r check.Request) check.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CheckTimeout)
	defer cancel()
	out := make([]check.Outcome, 1)
	c.Member(via).Node.Check(ctx, []check.Request{r}, out)
	if ctx.Err() != nil {
		t.Fatalf("%s via %s: not answered within %v", r.Key, via, CheckTimeout)
	}
	return out[0]
}

// replicaTakesOver returns n keys "handed:…" that owner owns with replica
// as their replica, and that replica owns once owner is out of the ring:
// the keys a leave of owner hands to the node holding their copies.
func replicaTakesOver(t *testing.T, c *Cluster, owner, replica string, n int) []string {
	t.Helper()
	r := c.Member(replica).Node.Ring()
	tbl := r.Table()
	without, err := ring.BuildTable(r.Config(), slices.DeleteFunc(tbl.Members(), func(m ring.Member) bool { return m.Name == owner }))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, k := range OwnedBy(c, replica, owner, "handed:", 200) {
		h := ring.Hash(LimitName, k)
		row := tbl.Replicas(h, nil)
		if next, _ := without.Owner(h); len(row) > 1 && row[1].Name == replica && next.Name == replica {
			keys = append(keys, k)
		}
	}
	if len(keys) < n {
		t.Fatalf("%d of %s's keys have %s as replica and next owner, want %d", len(keys), owner, replica, n)
	}
	return keys[:n]
}

// crashReplicated sends the member's changes to their replicas, crashes it
// and waits until the others settle: a crash that loses nothing the
// replicas do not hold.
func crashReplicated(t *testing.T, c *Cluster, name string) {
	t.Helper()
	if err := c.Member(name).Node.ReplicateNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Crash(name); err != nil {
		t.Fatal(err)
	}
	if err := c.Settle(); err != nil {
		t.Fatal(err)
	}
}
