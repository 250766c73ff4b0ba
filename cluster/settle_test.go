package cluster_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/clustertest"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// TestDrainingNodePullsNothing: a draining node settles nothing: a pull
// releases the key at its holder, which then sends the key's checks to
// the leaving node, after it has handed its counters on.
func TestDrainingNodePullsNothing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := clustertest.Formed(t, clustertest.Options{}, "n0", "n1", "n2")
		x := c.Member("n2")
		// The keys the join of n2 (the last to start) brought it: not
		// settled yet.
		keys := clustertest.OwnedBy(c, "n2", "n2", "k", 10)
		reqs := make([]check.Request, len(keys))
		for i, k := range keys {
			reqs[i] = clustertest.Request(k, 10, 1)
		}
		// Draining began after the batch's table was read (that table
		// still has n2 own the keys): the batch settle must see it.
		for _, p := range []ownership.Phase{ownership.Leaving, ownership.Draining} {
			if from, ok := x.Node.ToPhase(p); !ok {
				t.Fatalf("n2 cannot go from %s to %s", from, p)
			}
		}
		before := c.Peers.Pulls(x.PeerAddr)
		now := time.Now().UnixNano()
		x.Node.Presettle(context.Background(), reqs, false, true, now, func(uint64) bool { return true })
		if pulls := c.Peers.Pulls(x.PeerAddr) - before; pulls != 0 {
			t.Fatalf("a draining node made %d Pull calls", pulls)
		}
		for _, k := range keys {
			for _, n := range nodesOf(c, "n0", "n1") {
				if n.Cache().Fenced(ring.Hash(clustertest.LimitName, k), writeback.Key{Name: clustertest.LimitName, Key: k}, now) {
					t.Fatalf("%s released %s to a draining node", n.Name(), k)
				}
			}
		}
	})
}

// TestSettleNeedsAnAnswerThatTellsSomething: a settle for a check this
// node decides as the key's owner leaves the key unsettled when no node
// asked told it anything of the key while one that did not answer is
// still a member: an empty answer from a node asked without release (a
// replica of the key that may not hold it yet) tells nothing, while the
// previous owner's (asked with release) tells that there is nothing. In a
// 100-node deploy a new owner settled a key on such an empty answer while
// the previous owner's replica, holding a count of 17, answered too late:
// it decided the key from nothing.
func TestSettleNeedsAnAnswerThatTellsSomething(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := clustertest.Formed(t, clustertest.Options{}, "n0", "n1", "n2")
		x, a1, a2 := c.Member("n0"), c.Member("n1").PeerAddr, c.Member("n2").PeerAddr
		c.Peers.Cut(x.PeerAddr, a1, cluster.SlowPulls) // n1's pulls fail as past their deadline
		k := writeback.Key{Name: "api", Key: "settle"}
		h := ring.Hash(k.Name, k.Key)
		for _, tc := range []struct {
			name     string
			asked    []keymove.Holder
			deferred bool
		}{
			{"a member asked with release did not answer; an empty answer without release", []keymove.Holder{{Addr: a1, Release: true}, {Addr: a2}}, true},
			{"a member asked without release did not answer; an empty answer without release", []keymove.Holder{{Addr: a1}, {Addr: a2}}, true},
			{"a member did not answer; the empty answer of one asked with release", []keymove.Holder{{Addr: a1}, {Addr: a2, Release: true}}, false},
		} {
			s := ownership.NewSettle(x.PeerAddr, true)
			s.Add(h, k, tc.asked...)
			deferred := x.Node.SettleBatch(context.Background(), s, time.Now().UnixNano())
			if got := len(deferred) > 0; got != tc.deferred {
				t.Errorf("%s: deferred %v, want %v", tc.name, got, tc.deferred)
			}
			// A stand-in's or a failover's settle never defers.
			s = ownership.NewSettle(x.PeerAddr, false)
			s.Add(h, k, tc.asked...)
			if deferred := x.Node.SettleBatch(context.Background(), s, time.Now().UnixNano()); len(deferred) > 0 {
				t.Errorf("%s, not as the owner: deferred", tc.name)
			}
		}
		// Once the member answers, nothing is deferred.
		c.Peers.Heal()
		s := ownership.NewSettle(x.PeerAddr, true)
		s.Add(h, k, keymove.Holder{Addr: a1, Release: true}, keymove.Holder{Addr: a2})
		if deferred := x.Node.SettleBatch(context.Background(), s, time.Now().UnixNano()); len(deferred) > 0 {
			t.Error("every node answered: deferred")
		}
	})
}
