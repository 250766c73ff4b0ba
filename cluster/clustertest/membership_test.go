package clustertest

import (
	"testing"
	"testing/synctest"

	"github.com/sluicehq/sluice/cluster"
)

// A graceful leave takes the node out of every other node's ring, and their
// status lists it as left, not dead.
func TestLeaveShrinksEveryRing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, Options{})
		if err := c.AddMany("n1", "n2", "n3"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
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
