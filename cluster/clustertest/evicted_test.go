package clustertest

// A node with more keys than its cache holds keeps the rest only in its
// store. Such keys must move and be replicated as the keys in memory are.

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
)

// smallCache holds 8 keys and 8 replica copies in memory: the keys of the
// tests below live mostly in the stores.
func smallCache(cfg *cluster.Config) {
	cfg.Cache.Shards, cfg.Cache.Size, cfg.Cache.Copies = 1, 8, 8
}

// A key its owner holds only in its store moves with a join like any
// other: the new owner decides it from its count even when its first check
// comes after the move window. (Only the keys in memory were handed off,
// and a key first checked after the window started from nothing.)
func TestEvictedKeyMovesWithAJoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{Configure: smallCache}, "n1", "n2", "n3")
		r := NewRunner(c)
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		const limit, hits = 5, 3
		keys := OwnedBy(c, "n1", "n1", "idle:", 120)
		for _, k := range keys {
			if got := admitted(t, c, "n1", k, limit, hits); got != hits {
				t.Fatalf("key %s: %d of %d admitted", k, got, hits)
			}
		}
		if held := c.Member("n1").Node.Cache().Len(); held >= len(keys) {
			t.Fatalf("n1 holds %d keys in memory: the test wants most of its %d only in its store", held, len(keys))
		}
		if err := c.Add("n4"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		tbl := c.Member("n1").Node.Ring().Table()
		var moved []string
		for _, k := range keys {
			if o, _ := tbl.Owner(ring.Hash(LimitName, k)); o.Name == "n4" {
				moved = append(moved, k)
			}
		}
		if len(moved) < 5 {
			t.Fatalf("%d of n1's keys moved to n4, want 5", len(moved))
		}
		for _, k := range moved {
			if got := admitted(t, c, "n2", k, limit, limit); got != limit-hits {
				t.Errorf("key %s: %d admitted after it moved to n4 and its move window ended, want %d (%d of %d admitted before)", k, got, limit-hits, hits, limit)
			}
		}
	})
}

// A key its owner holds only in its store reaches the replica its row gains
// when its replica crashes: the owner's crash after that loses nothing
// more than its last replication interval. (Only the keys in memory went
// to the new replica, and the owner's crash lost the others' counts.)
func TestEvictedKeyReachesANewReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{Configure: smallCache}, "n1", "n2", "n3")
		const limit, hits = 5, 3
		tbl := c.Member("n1").Node.Ring().Table()
		// n1's keys with one replica, which crashes; the other member
		// becomes their replica.
		byReplica := map[string][]string{}
		for _, k := range OwnedBy(c, "n1", "n1", "idle:", 200) {
			if row := tbl.Replicas(ring.Hash(LimitName, k), nil); len(row) == 2 {
				byReplica[row[1].Name] = append(byReplica[row[1].Name], k)
			}
		}
		replica, next := "n2", "n3"
		if len(byReplica["n3"]) > len(byReplica["n2"]) {
			replica, next = "n3", "n2"
		}
		keys := byReplica[replica]
		t.Logf("%d keys", len(keys))
		if len(keys) < 20 {
			t.Fatalf("%d of n1's keys have %s as replica, want 20", len(keys), replica)
		}
		for _, k := range keys {
			if got := admitted(t, c, "n1", k, limit, hits); got != hits {
				t.Fatalf("key %s: %d of %d admitted", k, got, hits)
			}
		}
		if err := c.Member("n1").Node.ReplicateNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := c.Crash(replica); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // n1 has sent its keys to their new replica
		crashReplicated(t, c, "n1")
		for _, k := range keys {
			if got := admitted(t, c, next, k, limit, limit); got != limit-hits {
				t.Errorf("key %s: %d admitted after %s's crash, then n1's, want %d (%d of %d admitted before, none since n1's last replication)", k, got, replica, limit-hits, hits, limit)
			}
		}
	})
}

// A node that restarts after a crash holds its store from before, not the
// keys' counts: others decided them while it was down. Until it is in the
// ring again it owned nothing in the cluster's ring, so it hands nothing
// off and sends no copies, however its first tables, built before it
// knows every member, place the keys. (Once the handoff read the store, a
// restarted node pushed its old records as handoffs to the keys' owners in
// its first table, which then decided those keys while every other node
// routed them to it: TestFullDiskOnRealHosts, two nodes answering one
// key.)
func TestRestartedNodeHandsOffNothingBeforeItIsInTheRing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		const limit, hits = 10, 3
		keys := OwnedBy(c, "n1", "n2", "stale:", 20)
		for _, k := range keys {
			if got := admitted(t, c, "n1", k, limit, hits); got != hits {
				t.Fatalf("key %s: %d of %d admitted", k, got, hits)
			}
		}
		n2 := c.Member("n2").Node
		if err := n2.ReplicateNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := n2.Cache().Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := c.Crash("n2"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys { // decided by the keys' replicas meanwhile
			if got := admitted(t, c, "n1", k, limit, 1); got != 1 {
				t.Fatalf("key %s: %d of 1 admitted while n2 is down", k, got)
			}
		}
		if err := c.Restart("n2"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		if st := c.Member("n2").Node.Status(); st.HandedOff != 0 {
			t.Errorf("n2 handed off %d counters after its restart, want none", st.HandedOff)
		}
		for _, k := range keys {
			owners := map[string]bool{}
			for _, via := range c.Up() {
				o, err := c.Check(via, k, limit, 0)
				if err != nil {
					t.Fatal(err)
				}
				owners[o.Owner] = true
			}
			if len(owners) != 1 {
				t.Errorf("key %s: decided by %v, want one node", k, owners)
			}
			if got := admitted(t, c, "n3", k, limit, limit); got != limit-hits-1 {
				t.Errorf("key %s: %d admitted after n2's restart, want %d", k, got, limit-hits-1)
			}
		}
	})
}
