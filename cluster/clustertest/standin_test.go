package clustertest

import (
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/sluicehq/sluice/cluster"
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
