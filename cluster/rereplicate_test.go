package cluster

import (
	"testing"
	"time"

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

// nextRound gives the time to the first moment of the schedule strictly
// after now: a change at a round's moment waits for the next round, not
// none.
func TestNextRound(t *testing.T) {
	t.Parallel()
	start := time.Unix(100, 0)
	const every = 100 * time.Millisecond
	for _, tc := range []struct {
		since, want time.Duration
	}{
		{0, every}, // at the start: the first round
		{time.Millisecond, 99 * time.Millisecond},
		{every, every}, // at a round's moment: the next one
		{every + 30*time.Millisecond, 70 * time.Millisecond},
		{5*every - time.Nanosecond, time.Nanosecond},
		{-time.Second, every}, // a clock before the start: one interval
	} {
		if got := nextRound(start, start.Add(tc.since), every); got != tc.want {
			t.Errorf("nextRound at start%+v = %v, want %v", tc.since, got, tc.want)
		}
	}
}
