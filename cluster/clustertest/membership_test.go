package clustertest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
)

// A graceful leave takes the node out of every other node's ring, and their
// status lists it as left, not dead.
func TestLeaveShrinksEveryRing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		if err := c.Leave("n3"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"n1", "n2"} {
			n := c.Member(name).Node
			if got := n.Ring().Table().Len(); got != 2 {
				t.Errorf("%s's ring holds %d members, want 2", name, got)
			}
			state := "absent"
			for _, m := range n.Status().Members {
				if m.Name == "n3" {
					state = m.State
				}
			}
			if state != cluster.StateLeft {
				t.Errorf("%s's status lists n3 as %s, want %s", name, state, cluster.StateLeft)
			}
		}
	})
}

// A join moves keys to the new node, and their counts with them: every key
// loaded into two nodes admits exactly what is left of its limit after a
// third joins, whichever node the checks go through.
func TestJoinMovesCountersToTheNewOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2")
		const keys, limit, before = 200, 10, 6
		for k := range keys {
			key := fmt.Sprint("user:", k)
			if got := admitted(t, c, []string{"n1", "n2"}[k%2], key, limit, before); got != before {
				t.Fatalf("%s: admitted %d of %d", key, got, before)
			}
		}
		if err := c.Add("n3"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		tbl := c.Member("n3").Node.Ring().Table()
		moved := 0
		for k := range keys {
			key := fmt.Sprint("user:", k)
			if o, _ := tbl.Owner(ring.Hash(LimitName, key)); o.Name == "n3" {
				moved++
			}
			if got := admitted(t, c, []string{"n1", "n2", "n3"}[k%3], key, limit, limit); got != limit-before {
				t.Fatalf("%s: %d admitted after n3 joined, want %d", key, got, limit-before)
			}
		}
		if moved == 0 {
			t.Fatal("no key moved to the new node")
		}
		t.Logf("%d of %d keys moved to n3; n3 pulled %d, n1 and n2 handed off %d", moved, keys,
			c.Member("n3").Node.Status().Pulls, c.Member("n1").Node.Status().HandedOff+c.Member("n2").Node.Status().HandedOff)
	})
}

// A graceful leave hands every counter the node owns to the keys' next
// owners: each is counted as handed off, and each key admits exactly what
// is left of its limit afterwards.
func TestGracefulLeaveHandsEveryCounterOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		// Past the move windows of the formation: keys moved then are
		// pulled on first touch, and a leave hands off only settled keys.
		r := NewRunner(c)
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		tbl := c.Member("n1").Node.Ring().Table()
		keys := OwnedBy(c, "n1", "n3", "user:", 50)
		const limit, before = 10, 6
		for _, k := range keys {
			if o, err := c.Check("n1", k, limit, before); err != nil || o.Owner != "n3" || o.Decision.Remaining != limit-before {
				t.Fatalf("%s: %+v, %v", k, o, err)
			}
		}
		leaver := c.Member("n3").Node
		if err := c.Leave("n3"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		// n3's keys, and the key pastMoveWindow checks when n3 owns it.
		want := uint64(len(keys))
		if o, _ := tbl.Owner(ring.Hash(LimitName, "other")); o.Name == "n3" {
			want++
		}
		if h := leaver.Status().HandedOff; h != want {
			t.Fatalf("n3 handed off %d counters, want %d", h, want)
		}
		for i, k := range keys {
			if got := admitted(t, c, []string{"n1", "n2"}[i%2], k, limit, limit); got != limit-before {
				t.Fatalf("%s: %d admitted after n3 left, want %d", k, got, limit-before)
			}
		}
	})
}

// A graceful leave hands on the counters of multi-limit checks too: the
// drain reads them back from the store, and before the limit index was
// typed their store keys decoded as other keys ("api" + "0\x00key"), so
// the next owner got them under the wrong keys and admitted the limit
// again.
func TestGracefulLeaveHandsMultiLimitCountersOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		r := NewRunner(c)
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		const limit = 6
		keys := OwnedBy(c, "n1", "n3", "multi:", 20)
		multi := func(via, k string, times int) int {
			got := 0
			for range times {
				req := Request(k, limit, 1)
				req.More = []bucket.Limit{{Algorithm: bucket.FixedWindow, Limit: 100, WindowMS: Window.Milliseconds()}}
				o := checkVia(t, c, via, req)
				if o.Err != "" {
					t.Fatalf("key %s via %s: %s", k, via, o.Err)
				}
				if o.Allowed() {
					got++
				}
			}
			return got
		}
		for _, k := range keys {
			if got := multi("n1", k, limit); got != limit {
				t.Fatalf("key %s: %d admitted, want %d", k, got, limit)
			}
		}
		leaver := c.Member("n3").Node
		if err := c.Leave("n3"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		// Each key's two counters (one per limit) went to the next owner.
		if h := leaver.Status().HandedOff; h < uint64(2*len(keys)) {
			t.Fatalf("n3 handed off %d counters, want at least %d (two limits of %d keys)", h, 2*len(keys), len(keys))
		}
		for i, k := range keys {
			if got := multi([]string{"n1", "n2"}[i%2], k, 3); got != 0 {
				t.Fatalf("key %s: %d admitted after n3 left with its count at the limit, want 0", k, got)
			}
		}
	})
}

// A check that asks another algorithm for a key than the one counting it
// gets an error naming both, on whichever node it arrives, and the count
// goes on: before, the owner started the key afresh under the new
// algorithm and admitted the limit again.
func TestAnotherAlgorithmIsRefusedAcrossTheCluster(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		const key = "user:7"
		owner, _ := c.Member("n1").Node.Ring().Owner(ring.Hash(LimitName, key))
		via := "n1" // a node that forwards to the owner
		if owner.Name == via {
			via = "n2"
		}
		sw := check.Request{Name: LimitName, Key: key, Hits: 1,
			Limit: bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 5, WindowMS: Window.Milliseconds()}}
		for i := range 5 {
			if o := checkVia(t, c, via, sw); o.Err != "" || !o.Allowed() {
				t.Fatalf("hit %d: %+v", i, o)
			}
		}
		tb := sw
		tb.Limit.Algorithm = bucket.TokenBucket
		for _, n := range c.Up() {
			o := checkVia(t, c, n, tb)
			if o.Allowed() || !strings.Contains(o.Err, "counted by sliding_window") || !strings.Contains(o.Err, "asks token_bucket") {
				t.Fatalf("token_bucket via %s: %+v, want refused with an error naming both algorithms", n, o)
			}
		}
		if o := checkVia(t, c, via, sw); o.Err != "" || o.Allowed() {
			t.Fatalf("sliding_window after the refusals: %+v, want over the limit (5 of 5 admitted)", o)
		}
	})
}

// Checks of one key through every node of three admit exactly the limit:
// the owner decides, or the node asked decides from a lease the owner
// granted it, and what the holders have not spent yet is all that is
// missing from the limit.
func TestThreeNodesAdmitExactlyTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		const key, limit = "user:42", 100
		owner, _ := c.Member("n1").Node.Ring().Table().Owner(ring.Hash(LimitName, key))
		nodes := c.Up()
		calls := c.Peers.Calls()
		admitted := int64(0)
		for i := range 3 * limit {
			via := nodes[i%len(nodes)]
			o, err := c.Check(via, key, limit, 1)
			if err != nil {
				t.Fatalf("check %d: %v", i, err)
			}
			if o.Owner != owner.Name && o.Owner != via {
				t.Fatalf("check %d through %s decided by %s, owner is %s", i, via, o.Owner, owner.Name)
			}
			if o.Allowed() {
				admitted++
			}
		}
		var unspent int64
		for _, name := range nodes {
			st := c.Member(name).Node.Status()
			unspent += int64(st.LeaseTokens - st.LeaseSpent)
		}
		if admitted != limit-unspent {
			t.Fatalf("admitted %d of %d with limit %d and %d leased hits unspent, want exactly %d", admitted, 3*limit, limit, unspent, limit-unspent)
		}
		if c.Peers.Calls() == calls {
			t.Fatal("no check was forwarded")
		}
	})
}

// Once the cluster has settled, every node names the same owner for every
// key, and each node's status lists every member alive, at its address,
// with shares of the keys that add up to the whole.
func TestEveryNodeAgreesOnOwnersAndMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		names := c.Up()
		first := c.Member(names[0]).Node.Ring().Table()
		for k := range 1000 {
			h := ring.Hash(LimitName, fmt.Sprint("k", k))
			want, _ := first.Owner(h)
			for _, name := range names[1:] {
				if got, _ := c.Member(name).Node.Ring().Table().Owner(h); got != want {
					t.Fatalf("key %d: %s says the owner is %v, %s says %v", k, name, got, names[0], want)
				}
			}
		}
		for _, name := range names {
			st := c.Member(name).Node.Status()
			if len(st.Members) != len(names) {
				t.Fatalf("%s's status lists %d members: %+v", name, len(st.Members), st.Members)
			}
			sum := 0.0
			for _, m := range st.Members {
				want := c.Member(m.Name)
				if want == nil || m.GRPCAddr != want.PeerAddr || m.State != cluster.StateAlive {
					t.Fatalf("%s's status lists %+v", name, m)
				}
				sum += m.Share
			}
			// The shares are fractions of the partitions: they add up to 1
			// within float64 rounding.
			if sum < 1-1e-9 || sum > 1+1e-9 {
				t.Fatalf("%s's shares add up to %v", name, sum)
			}
		}
	})
}

// A leaving owner hands each key on to its next owner, which often held it
// already, as the key's replica, with the same record. Such a handoff
// installs nothing new, yet it still tells the receiver that it holds the
// key's current count: the receiver decides the key from then on with no
// pull. (It took a push that installed nothing for a stale one, left the
// key unsettled and pulled it at its first check.)
func TestHandoffToTheReplicaSettlesTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		r := NewRunner(c)
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		const limit = 10
		keys := replicaTakesOver(t, c, "n3", "n1", 5)
		for _, k := range keys {
			if got := admitted(t, c, "n2", k, limit, 4); got != 4 {
				t.Fatalf("key %s: %d of 4 admitted", k, got)
			}
		}
		if err := c.Member("n3").Node.ReplicateNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := c.Leave("n3"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		before := c.Peers.Pulls(c.Member("n1").PeerAddr)
		for _, k := range keys {
			if got := admitted(t, c, "n1", k, limit, limit); got != limit-4 {
				t.Fatalf("key %s: %d admitted after the handoff, want %d", k, got, limit-4)
			}
		}
		if pulls := c.Peers.Pulls(c.Member("n1").PeerAddr) - before; pulls != 0 {
			t.Errorf("n1 made %d pulls to decide %d keys handed to it, want none", pulls, len(keys))
		}
	})
}
