package cluster

import (
	"testing"

	"github.com/hashicorp/memberlist"
)

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
