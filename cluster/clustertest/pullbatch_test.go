package clustertest

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/cluster/check"
)

// A batch of keys that a join moved to the new node is settled with one
// Pull per node asked, not one per key: key by key, a 100-item forward
// after a membership change took 100 round trips or more on the owner, ran
// past the sender's forward deadline (the default, 250 ms, against 20 ms a
// call here), and the sender had the batch decided again by a replica —
// every item counted twice.
func TestBatchAfterJoinSettlesInOneRoundOfPulls(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2")
		if err := c.Add("n3"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		keys := OwnedBy(c, "n3", "n3", "k", 100)
		reqs := make([]check.Request, len(keys))
		for i, k := range keys {
			reqs[i] = Request(k, 10, 1)
		}
		c.Delay(20 * time.Millisecond)
		n3 := c.Member("n3")
		before := c.Peers.Pulls(n3.PeerAddr)
		ctx, cancel := context.WithTimeout(context.Background(), CheckTimeout)
		defer cancel()
		out := make([]check.Outcome, len(reqs))
		c.Member("n1").Node.Check(ctx, reqs, out)
		for i, o := range out {
			if o.Err != "" || o.Owner != "n3" || !o.Allowed() || o.Decision.Remaining != 9 {
				t.Fatalf("item %d (%s): %+v, want decided once by n3 (remaining 9)", i, keys[i], o)
			}
		}
		if pulls := c.Peers.Pulls(n3.PeerAddr) - before; pulls > 4 {
			t.Errorf("n3 made %d Pull calls to settle one batch of %d moved keys, want at most 4 (one per node and release flag)", pulls, len(keys))
		}
		if st := c.Member("n1").Node.Status(); st.ForwardErrors != 0 || st.Failovers != 0 {
			t.Errorf("forward errors %d, failovers %d", st.ForwardErrors, st.Failovers)
		}
		if st := n3.Node.Status(); st.Pulls < uint64(len(keys)) {
			t.Errorf("n3 pulled %d keys, want every one of the %d moved keys asked for", st.Pulls, len(keys))
		}
	})
}
