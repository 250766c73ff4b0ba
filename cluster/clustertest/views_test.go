package clustertest

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// joinUnseenBy checks one hit of 300 keys (limit) through via, so that
// their owners hold records, then has n4 join while deaf hears no gossip:
// once the three others see four members and deaf still three, it returns
// the keys.
func joinUnseenBy(t *testing.T, c *Cluster, deaf, via string, limit int64) []string {
	t.Helper()
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		if _, err := c.Check(via, keys[i], limit, 1); err != nil {
			t.Fatal(err)
		}
	}
	c.Gossip.Deafen(c.Member(deaf).GossipAddr)
	if err := c.Add("n4"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	for _, name := range []string{"n1", "n2", "n3", "n4"} {
		if name == deaf {
			continue
		}
		for c.Member(name).Node.Ring().Table().Len() != 4 {
			if time.Now().After(deadline) {
				t.Fatalf("%s does not see n4 within a second", name)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if got := c.Member(deaf).Node.Ring().Table().Len(); got != 3 {
		t.Fatalf("%s sees %d members, want 3 (it hears no gossip)", deaf, got)
	}
	return keys
}

// While views differ, a key can move between two old members: a join
// rebalances partitions, and the member that sees the join hands the key
// to the one that does not see it yet, whose table still names the first.
// The receiver decides the key from then on (docs/ownership.md, "Handed
// here"); the two do not point its checks at each other and pull it back
// and forth, one pull per check, where two pulls that cross each other end
// in an abandoned check. Checks through both are decided at the receiver,
// exactly, with no pull.
func TestHandedKeyIsDecidedWhereItWasHanded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		const limit = 100
		// n1 hears no gossip: it does not see n4 join.
		keys := joinUnseenBy(t, c, "n1", "n2", limit)

		// A key the join moved from n2 or n3 to n1 in their view, which
		// n1's view still gives them.
		old := c.Member("n1").Node.Ring().Table()
		key, from := "", ""
		for _, k := range keys {
			h := ring.Hash(LimitName, k)
			was, _ := old.Owner(h)
			if was.Name == "n1" {
				continue
			}
			if now, _ := c.Member(was.Name).Node.Ring().Table().Owner(h); now.Name == "n1" {
				key, from = k, was.Name
				break
			}
		}
		if key == "" {
			t.Fatalf("no key of %d moved from n2 or n3 to n1 when n4 joined", len(keys))
		}
		// The handoff is asynchronous: wait until its sender has released
		// the key.
		h, wk := ring.Hash(LimitName, key), writeback.Key{Name: LimitName, Key: key}
		for deadline := time.Now().Add(time.Second); !c.Member(from).Node.Cache().Fenced(h, wk, time.Now().UnixNano()); {
			if time.Now().After(deadline) {
				t.Fatalf("%s does not hand %s to n1 within a second", from, key)
			}
			time.Sleep(5 * time.Millisecond)
		}
		pulls1, pullsFrom := c.Peers.Pulls(c.Member("n1").PeerAddr), c.Peers.Pulls(c.Member(from).PeerAddr)
		want := int64(limit - 1)
		for i := range 6 {
			via := []string{"n1", from}[i%2]
			o, err := c.Check(via, key, limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			want--
			if !o.Allowed() || o.Decision.Remaining != want || o.Owner != "n1" {
				t.Fatalf("check %d via %s: %+v, want admitted by n1 with %d remaining", i, via, o, want)
			}
		}
		if p1, pf := c.Peers.Pulls(c.Member("n1").PeerAddr)-pulls1, c.Peers.Pulls(c.Member(from).PeerAddr)-pullsFrom; p1+pf != 0 {
			t.Errorf("6 checks of %s made n1 pull %d times and %s %d times, want none", key, p1, from, pf)
		}
		c.Gossip.Heal()
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		o, err := c.Check("n3", key, limit, 0)
		if err != nil {
			t.Fatal(err)
		}
		if o.Decision.Remaining != want {
			t.Errorf("once the views agree, %s has %d remaining, want %d", key, o.Decision.Remaining, want)
		}
	})
}

// A joiner pulls the keys the join gives it from their owners, releasing
// them there; an owner that has not seen the join yet still owns those
// keys in its table. It points their checks at the joiner (docs/
// ownership.md, "Released to a node not in the table") instead of pulling
// each key back on its next check, which the joiner would answer by
// pulling it back again: the same pull-for-every-check ping-pong, whose
// crossings ended in abandoned checks and lost counts under load.
func TestOwnerThatHasNotSeenAJoinDefersToTheJoiner(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		const limit = 100
		keys := joinUnseenBy(t, c, "n2", "n1", limit)
		old, cur := c.Member("n2").Node.Ring().Table(), c.Member("n4").Node.Ring().Table()
		key := ""
		for _, k := range keys {
			h := ring.Hash(LimitName, k)
			was, _ := old.Owner(h)
			now, _ := cur.Owner(h)
			if was.Name == "n2" && now.Name == "n4" {
				key = k
				break
			}
		}
		if key == "" {
			t.Fatalf("no key of %d moved from n2 to n4 when n4 joined", len(keys))
		}
		// n4's first check of the key pulls it from n2.
		want := int64(limit - 1)
		o, err := c.Check("n4", key, limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want--; !o.Allowed() || o.Decision.Remaining != want || o.Owner != "n4" {
			t.Fatalf("first check via n4: %+v, want admitted by n4 with %d remaining", o, want)
		}
		pulls2, pulls4 := c.Peers.Pulls(c.Member("n2").PeerAddr), c.Peers.Pulls(c.Member("n4").PeerAddr)
		for i := range 6 {
			via := []string{"n2", "n4"}[i%2]
			o, err := c.Check(via, key, limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			if want--; !o.Allowed() || o.Decision.Remaining != want || o.Owner != "n4" {
				t.Fatalf("check %d via %s: %+v, want admitted by n4 with %d remaining", i, via, o, want)
			}
		}
		if p2, p4 := c.Peers.Pulls(c.Member("n2").PeerAddr)-pulls2, c.Peers.Pulls(c.Member("n4").PeerAddr)-pulls4; p2+p4 != 0 {
			t.Errorf("6 checks of %s made n2 pull %d times and n4 %d times, want none", key, p2, p4)
		}
		c.Gossip.Heal()
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		if o, err := c.Check("n3", key, limit, 0); err != nil {
			t.Fatal(err)
		} else if o.Decision.Remaining != want {
			t.Errorf("once the views agree, %s has %d remaining, want %d", key, o.Decision.Remaining, want)
		}
	})
}
