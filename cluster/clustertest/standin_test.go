package clustertest

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/ring"
)

// An owner that gave up on a forwarded check (it reached the owner after
// the sender's deadline, as on a loaded machine) pulls the key from its
// replica before it decides the key again: the sender failed the check
// over to that replica, which decided it as a stand-in. Before, the owner
// decided from its own count, with a newer version, and its replication
// overwrote the stand-in's count: the hit was lost.
func TestOwnerPullsWhatAStandInDecidedForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(New(t, Options{}))
		r.Limit = 1000
		c := r.C
		for _, name := range []string{"n1", "n2", "n3"} {
			if err := c.Add(name); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		// Keys that n2 owns and n3 replicates, checked through n1.
		tbl := c.Member("n1").Node.Ring().Table()
		var keys []string
		for i := 0; len(keys) < 10; i++ {
			k := fmt.Sprint("k", i)
			if reps := tbl.Replicas(ring.Hash(LimitName, k), nil); reps[0].Name == "n2" && reps[1].Name == "n3" {
				keys = append(keys, k)
			}
		}
		const before = 3
		for _, k := range keys {
			if _, err := c.Check("n1", k, r.Limit, before); err != nil {
				t.Fatal(err)
			}
		}
		// Past the move windows of the cluster's formation (a key moved
		// then is pulled on first touch, which would hide the loss), with
		// checks on every node meanwhile so that no heartbeat stops.
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		// Every call from n1 reaches n2 only after its deadline: each
		// check fails over to the key's replica, n3.
		c.Peers.Cut(c.Member("n1").PeerAddr, c.Member("n2").PeerAddr, cluster.Late)
		for _, k := range keys {
			o, err := c.Check("n1", k, r.Limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			if o.Owner != "n3" {
				t.Fatalf("%s: decided by %s, want the replica n3 standing in", k, o.Owner)
			}
		}
		c.Heal()
		for _, k := range keys {
			if _, err := c.Check("n1", k, r.Limit, 1); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range keys {
			got, err := r.Held(k)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(before + 2); got != want {
				t.Errorf("%s holds %d, want %d", k, got, want)
			}
		}
	})
}

// A stand-in forward reaching a node that had released the key to
// another node X decides only after pulling the key from X: X took the
// node's state and decided more since. Before 2026-11-25 the node decided
// from its own, older copy, and X's decisions were lost (a hit in about
// one run of five of TestScaleOutThenInUnderLoad).
func TestStandInAtAReleasedKeyPullsWhereItWent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{Configure: func(cfg *cluster.Config) { cfg.HotKeyThreshold = 0 }}, "n1", "n2", "n3")
		const key, limit = "moved", 100
		owner, _ := c.Member("n1").Node.Ring().Table().Owner(ring.Hash(LimitName, key))
		var a, b, x *Member // the owner, and two members that do not own the key
		for _, name := range []string{"n1", "n2", "n3"} {
			switch m := c.Member(name); {
			case name == owner.Name:
				a = m
			case b == nil:
				b = m
			default:
				x = m
			}
		}
		for i := range 3 {
			if o, err := c.Check(a.Name, key, limit, 1); err != nil || !o.Allowed() || o.Owner != a.Name {
				t.Fatalf("check %d at the owner: %+v, %v", i, o, err)
			}
		}
		out, moved := make([]check.Outcome, 1), make([]string, 1)
		standIn := func(n, pullFrom *Member, want int64) {
			t.Helper()
			var pf []string
			if pullFrom != nil {
				pf = []string{pullFrom.PeerAddr}
			}
			n.Node.CheckStandIn(context.Background(), "sender", []check.Request{Request(key, limit, 1)}, pf, out, moved)
			if !out[0].Allowed() || moved[0] != "" || out[0].Decision.Remaining != limit-want {
				t.Fatalf("stand-in at %s: %+v, moved to %q; want allowed with %d counted (remaining %d)", n.Name, out[0], moved[0], want, limit-want)
			}
		}
		// B stands in, pulling the key from A (A releases it to B): 4.
		standIn(b, a, 4)
		// X stands in, pulling it from B (B releases it to X): 5, 6.
		standIn(x, b, 5)
		standIn(x, nil, 6)
		// A stand-in at B, which does not own the key and released it to
		// X: it must pull X's 6 before deciding (from its own copy it
		// would say 5).
		standIn(b, nil, 7)
	})
}
