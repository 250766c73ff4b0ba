package clustertest

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
)

// A partition that splits a 4-node cluster in two halves: once each side
// sees only itself, each keeps answering and enforces the limit on its own
// (sides × limit in all); healed, the rings merge, the rejoin is counted,
// and the key's newest version wins: it is at its limit everywhere.
func TestPartitionEachSideEnforcesThenMerges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3", "n4")
		sides := [][]string{{"n1", "n2"}, {"n3", "n4"}}
		if err := c.Partition(sides...); err != nil {
			t.Fatal(err)
		}
		start := time.Now() // the bubble's clock
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		t.Logf("partition: each side saw only itself after %v (simulated)", time.Since(start))
		const limit = 10
		total := 0
		for _, side := range sides {
			for i := range 15 {
				o, err := c.Check(side[i%2], "split", limit, 1)
				if err != nil {
					t.Fatalf("check during the partition: %v", err)
				}
				if o.Allowed() {
					total++
				}
			}
		}
		if total != len(sides)*limit {
			t.Fatalf("two sides admitted %d with limit %d, want %d each", total, limit, limit)
		}
		c.Heal()
		start = time.Now()
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		t.Logf("healed: every node saw all four after %v (simulated)", time.Since(start))
		var rejoins uint64
		for _, name := range c.Up() {
			rejoins += c.Member(name).Node.Status().Rejoins
		}
		if rejoins == 0 {
			t.Fatal("no rejoin counted after the heal")
		}
		for _, name := range c.Up() {
			o, err := c.Check(name, "split", limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			if o.Allowed() {
				t.Fatalf("after the heal, %s admitted a hit: %+v, want over the limit", name, o)
			}
		}
	})
}

// Under the serve policy, a check whose owner and replicas cannot be
// reached is decided on the caller's side of a partition, before the
// partition is detected too. Checks of one key entering through both
// nodes of a side then reach one stand-in, and when the partition is
// detected and a node of that side becomes the key's owner, it pulls that
// count before deciding. So the side admits at most the limit in all.
// (Before, each entry node decided from its own cache and the new owner
// started from nothing: 16 admitted for a limit of 10.)
func TestServeDecisionsBeforeDetectionCountOnTheirSide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{Configure: func(cfg *cluster.Config) {
			// No replication within the test: the decisions must reach
			// the new owner through its settle, not through a replication
			// that may come after it has decided (and the fixed window's
			// merge keeps the larger count, not the sum).
			cfg.ReplicationInterval = time.Hour
		}}, "n1", "n2", "n3", "n4")
		left, right := []string{"n1", "n2"}, []string{"n3", "n4"}
		onRight := func(name string) bool { return name == "n3" || name == "n4" }
		// Keys whose owner and replicas are all on the right.
		const limit, early = 10, 3 // early hits through each left node
		tbl := c.Member("n1").Node.Ring().Table()
		var keys []string
		var reps []ring.Member
		for i := 0; len(keys) < 40 && i < 10_000; i++ {
			k := fmt.Sprint("k", i)
			reps = tbl.Replicas(ring.Hash(LimitName, k), reps[:0])
			all := len(reps) > 0
			for _, r := range reps {
				all = all && onRight(r.Name)
			}
			if all {
				keys = append(keys, k)
			}
		}
		if len(keys) < 40 {
			t.Fatalf("found %d keys held only on the right, want 40", len(keys))
		}
		// Peer calls cut, gossip not yet: the left still sees the owners
		// alive; each key gets early hits through each left node.
		peerAddrs := func(names []string) []string {
			var as []string
			for _, n := range names {
				as = append(as, c.Member(n).PeerAddr)
			}
			return as
		}
		c.Peers.Partition(cluster.Refuse, peerAddrs(left), peerAddrs(right))
		decidedBy := map[string]string{}
		for _, k := range keys {
			for _, entry := range left {
				o, err := c.Check(entry, k, limit, early)
				if err != nil || !o.Allowed() || onRight(o.Owner) {
					t.Fatalf("key %s through %s before detection: %+v, %v; want decided on the left", k, entry, o, err)
				}
				if d, ok := decidedBy[k]; ok && d != o.Owner {
					t.Errorf("key %s decided by %s and by %s before detection: one stand-in per side", k, d, o.Owner)
				}
				decidedBy[k] = o.Owner
			}
		}
		// Gossip cut too: each side sees only itself, and each key has an
		// owner on the left.
		if err := c.Partition(left, right); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		// Through n1, single hits until refused: the left side admits at
		// most limit in all, whichever of its nodes owns the key now.
		moved := 0
		for _, k := range keys {
			owner, _ := c.Member("n1").Node.Ring().Table().Owner(ring.Hash(LimitName, k))
			if owner.Name != decidedBy[k] {
				moved++
			}
			admitted := 2 * early
			for range limit {
				o, err := c.Check("n1", k, limit, 1)
				if err != nil {
					t.Fatalf("key %s after detection: %v", k, err)
				}
				if o.Allowed() {
					admitted++
				}
			}
			if admitted > limit {
				t.Errorf("key %s (decided by %s before detection, owned by %s after): the left side admitted %d, limit %d",
					k, decidedBy[k], owner.Name, admitted, limit)
			}
		}
		t.Logf("%d keys, %d of them owned after detection by the node that had not decided them", len(keys), moved)
		if moved == 0 {
			t.Fatal("no key moved to the other node of the side: the test checks nothing")
		}
	})
}
