package cluster

import (
	"testing"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
)

func table(t *testing.T, names ...string) *ring.Table {
	t.Helper()
	var ms []ring.Member
	for _, n := range names {
		ms = append(ms, ring.Member{Name: n, Addr: n + ":1"})
	}
	cfg := ring.DefaultConfig()
	cfg.Partitions = 127
	tb, err := ring.BuildTable(cfg, ms)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

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
		g := ownership.ReplicasGained(c.old, c.cur, "a")
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
					want = want || !ownership.RowHas(oldRow, m.Name)
				}
			}
			if got := g != nil && g[p]; got != want {
				t.Errorf("%s: partition %d gained %v, want %v", c.name, p, got, want)
			}
		}
	}
}

// TestRosterSeesARestartByItsBootID: a member whose metadata comes with
// another boot id restarted, whether memberlist reports it as a join or
// as an update; the same boot id, or a first sighting, is no restart.
func TestRosterSeesARestartByItsBootID(t *testing.T) {
	t.Parallel()
	var r roster
	node := func(boot uint64, ready bool) *memberlist.Node {
		return &memberlist.Node{Name: "x", Meta: encodeMeta(meta{grpcAddr: "x:1", boot: boot, ready: ready})}
	}
	if _, restarted := r.joined(node(1, false)); restarted {
		t.Error("first join seen as a restart")
	}
	if r.updated(node(1, true)) {
		t.Error("an update of the same process seen as a restart")
	}
	if !r.updated(node(2, true)) {
		t.Error("an update with a new boot id not seen as a restart")
	}
	if _, restarted := r.joined(node(3, false)); !restarted {
		t.Error("a join with a new boot id not seen as a restart")
	}
	if r.updated(&memberlist.Node{Name: "x", Meta: []byte{1, 2, 3}}) {
		t.Error("undecodable metadata seen as a restart")
	}
}
