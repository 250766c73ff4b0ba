package clustertest

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
)

// A node that gets a key by a ring change and cannot pull it from the
// node that held it, still a member (a pull past PullTimeout on a loaded
// machine), while that node's handoff has not reached it either, does not
// decide the key from what it holds (nothing): the check fails over to the
// key's replica, and the key is pulled again on its next touch. Before,
// the new owner marked the key settled and decided it from nothing, with
// a version newer than the holder's count: every hit admitted before the
// change was lost (a rolling deploy of 100 nodes lost 8 to 20 this way).
func TestUnansweredPullDoesNotSettleTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(New(t, Options{}))
		r.Limit = 1000
		c := r.C
		for _, name := range []string{"n1", "n2", "n3", "n4"} {
			if err := c.Add(name); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		const keys, hits = 200, 3
		key := func(i int) string { return fmt.Sprintf("k%d", i) }
		for i := range keys {
			if _, err := c.Check("n1", key(i), r.Limit, hits); err != nil {
				t.Fatal(err)
			}
		}
		owners := map[string]string{}
		tbl := c.Member("n1").Node.Ring().Table()
		for i := range keys {
			o, _ := tbl.Owner(ring.Hash(LimitName, key(i)))
			owners[key(i)] = o.Name
		}
		// n5 joins. Its pulls fail, and so does every handoff to it: the
		// keys that move to it stay with their previous owners, members
		// still, and n5 holds nothing of them.
		const n5 = "peer-n5" // n5's Member.PeerAddr
		for _, name := range c.Up() {
			a := c.Member(name).PeerAddr
			c.Peers.Cut(n5, a, cluster.SlowPulls)
			c.Peers.Cut(a, n5, cluster.Refuse)
		}
		if err := c.Add("n5"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		tbl = c.Member("n5").Node.Ring().Table()
		var moved []string
		for i := range keys {
			if o, _ := tbl.Owner(ring.Hash(LimitName, key(i))); o.Name == "n5" {
				moved = append(moved, key(i))
			}
		}
		if len(moved) == 0 {
			t.Fatalf("no key of %d moved to n5", keys)
		}
		t.Logf("%d of %d keys moved to n5", len(moved), keys)
		check := func(k string, want int64) {
			t.Helper()
			o, err := c.Check("n5", k, r.Limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Limit - o.Remaining; got != want {
				t.Errorf("%s (held by %s before n5 joined): answered by %s with %d hits, want %d", k, owners[k], o.Owner, got, want)
			}
		}
		for _, k := range moved {
			check(k, hits+1)
		}
		c.Heal()
		// Past the move window, with checks on every node meanwhile (no
		// heartbeat stops): the key is no longer unsettled, and n5 must
		// still take what the stand-ins decided.
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		for _, k := range moved {
			check(k, hits+2)
		}
		for _, k := range moved {
			got, err := r.Held(k)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(hits + 2); got != want {
				t.Errorf("%s holds %d, want %d", k, got, want)
			}
		}
	})
}

// pastMoveWindow lets the bubble's clock run past the default move window,
// checking a key named "other" through every member up every 5 s, so that
// no node's heartbeat stops for want of checks (an idle resume would
// register a pause's move and hide what a test looks for).
func (r *Runner) pastMoveWindow() error {
	window := cluster.DefaultConfig().MoveWindow
	for elapsed := time.Duration(0); elapsed <= window; elapsed += 5 * time.Second {
		time.Sleep(5 * time.Second)
		for _, name := range r.C.Up() {
			if _, err := r.C.Check(name, "other", r.Limit, 1); err != nil {
				return err
			}
		}
	}
	return nil
}
