package cluster

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/ring"
)

// A stand-in forward reaching a node that had released the key to
// another node X decides only after pulling the key from X: X took the
// node's state and decided more since. Before 2026-11-25 the node decided
// from its own, older copy, and X's decisions were lost (a hit in about
// one run of five of TestScaleOutThenInUnderLoad).
func TestStandInAtAReleasedKeyPullsWhereItWent(t *testing.T) {
	t.Parallel()
	nodes, _ := memCluster(t, 3, func(c *Config) { c.HotKeyThreshold = 0 })
	r := req("api", "moved", 1, 100)
	ownerM, _ := nodes[0].Ring().Owner(ring.Hash(r.Name, r.Key))
	var a, b, x *Node // the owner, and two nodes that do not own the key
	for _, n := range nodes {
		switch {
		case n.Name() == ownerM.Name:
			a = n
		case b == nil:
			b = n
		default:
			x = n
		}
	}
	for i := range 3 {
		if o := check1(a, r); !o.Allowed() || o.Owner != a.Name() {
			t.Fatalf("check %d at the owner: %+v", i, o)
		}
	}
	ctx := context.Background()
	out, moved := make([]check.Outcome, 1), make([]string, 1)
	standIn := func(n *Node, pullFrom *Node, want int64) {
		t.Helper()
		var pf []string
		if pullFrom != nil {
			pf = []string{pullFrom.cfg.GRPCAddr}
		}
		n.CheckStandIn(ctx, "sender", []check.Request{r}, pf, out, moved)
		if !out[0].Allowed() || moved[0] != "" || out[0].Remaining != 100-want {
			t.Fatalf("stand-in at %s: %+v, moved to %q; want allowed with %d counted (remaining %d)", n.Name(), out[0], moved[0], want, 100-want)
		}
	}
	// B stands in, pulling the key from A (A releases it to B): 4.
	standIn(b, a, 4)
	// X stands in, pulling it from B (B releases it to X): 5, 6.
	standIn(x, b, 5)
	standIn(x, nil, 6)
	// A stand-in at B, which does not own the key and released it to X:
	// it must pull X's 6 before deciding (from its own copy it would say 5).
	standIn(b, nil, 7)
}
