package ownership

import (
	"testing"

	"github.com/sluicehq/sluice/ring"
)

// TestReplicasGained: a partition counts when self owns it in cur and its
// row there has a member the old row did not; checked against the rows
// themselves for every partition.
func TestReplicasGained(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		old, cur *ring.Table
		want     bool // some partition gains
	}{
		{"same table", table(t, "a", "b", "c"), table(t, "a", "b", "c"), false},
		{"a member back (restart)", table(t, "a", "c"), table(t, "a", "b", "c"), true},
		{"a replica gone for good", table(t, "a", "b", "c"), table(t, "a", "c"), true},
		{"alone", table(t, "a"), table(t, "a"), false},
	} {
		g := ReplicasGained(c.old, c.cur, "a")
		if (g != nil) != c.want {
			t.Errorf("%s: gained %v, want some: %v", c.name, g != nil, c.want)
			continue
		}
		for p := range c.cur.Partitions() {
			own, _ := c.cur.PartitionOwner(p)
			oldRow := c.old.PartitionReplicas(p, nil)
			want := false
			if own.Name == "a" {
				for _, m := range c.cur.PartitionReplicas(p, nil)[1:] {
					want = want || !RowHas(oldRow, m.Name)
				}
			}
			if got := g != nil && g[p]; got != want {
				t.Errorf("%s: partition %d gained %v, want %v", c.name, p, got, want)
			}
		}
	}
}

// A replica's copies follow a partition's new owner: only where self was
// a replica (not the owner) in the old row and the owner changed to
// another node; checked against the rows for every partition.
func TestCopiesFollow(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		old, cur *ring.Table
		some     bool // some partition's copies must go somewhere
	}{
		{"same table", table(t, "a", "b", "c"), table(t, "a", "b", "c"), false},
		{"a join", table(t, "a", "b", "c"), table(t, "a", "b", "c", "d"), true},
		{"joins", table(t, "a", "b", "c"), table(t, "a", "b", "c", "d", "e", "f", "g"), true},
		{"a member gone", table(t, "a", "b", "c", "d"), table(t, "a", "c", "d"), false},
		{"alone", table(t, "a"), table(t, "a"), false},
	} {
		to := CopiesFollow(c.old, c.cur, "a")
		if c.some && to == nil {
			t.Errorf("%s: no copies sent", c.name)
			continue
		}
		displaced := 0
		for p := range c.cur.Partitions() {
			own, _ := c.cur.PartitionOwner(p)
			oldRow := c.old.PartitionReplicas(p, nil)
			curRow := c.cur.PartitionReplicas(p, nil)
			want := ""
			wasReplica := len(oldRow) > 1 && oldRow[0].Name != "a" && RowHas(oldRow[1:], "a")
			switch {
			case !wasReplica || own.Name == "a":
			case oldRow[0].Name != own.Name: // a new owner
				want = own.Addr
			case !RowHas(curRow, "a"): // the same owner, a out of its row
				for _, m := range curRow[1:] {
					if !RowHas(oldRow, m.Name) {
						want = m.Addr
					}
				}
				displaced++
			}
			got := ""
			if to != nil {
				got = to[p]
			}
			if got != want {
				t.Errorf("%s: partition %d copies to %q, want %q", c.name, p, got, want)
			}
		}
		if c.name == "joins" && displaced == 0 {
			t.Errorf("%s: no partition kept its owner and dropped a from its row; the case is not tested", c.name)
		}
	}
}
