package cluster

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/writeback"
)

// After a membership change's window, the sweeper forgets what the change
// left behind: the moves (with their settled keys) and the records of
// released keys, though no further change or release comes to trigger it;
// a release still in force is kept.
func TestSweepForgetsWhatAMoveLeftBehind(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(t0.UnixNano())
	const window = 100 * time.Millisecond
	nodes, _ := memCluster(t, 2, func(c *Config) {
		c.Now = func() time.Time { return time.Unix(0, clock.Load()) }
		c.MoveWindow = window
	})
	n := nodes[0]
	live := []bucket.Counter{{Name: "api", Key: "still-moving"}}
	n.Pull(context.Background(), nodes[1].Name(), memAddr(1), live, true, 24*time.Hour, make([]keymove.PullAnswer, 1))
	const keys = 100 // fewer than ownership.MinReleasedSweep: NoteReleased never prunes
	for i := range keys {
		n.Pull(context.Background(), nodes[1].Name(), memAddr(1), []bucket.Counter{{Name: "api", Key: fmt.Sprint("k", i)}}, true, window, make([]keymove.PullAnswer, 1))
	}
	records := n.book.ReleasedRecords
	if got := records(); got != keys+1 {
		t.Fatalf("%d records of released keys, want %d", got, keys+1)
	}
	joined := 0
	for _, nd := range nodes {
		joined += len(nd.book.Moves())
	}
	if joined == 0 {
		t.Fatal("the join left no move: nothing to sweep")
	}
	// Every window and release above ends, but the one of 24 h. The clock
	// gets there in steps the nodes' heartbeats follow: a jump would look
	// to them like a pause, whose move no sweep drops while the clock
	// stands still.
	StepClock(t, &clock, nodes, clock.Load()+int64(2*window))
	WaitFor(t, 10*time.Second, "the sweeper drops the moves and the ended releases", func() bool {
		for _, nd := range nodes {
			if len(nd.book.Moves()) > 0 {
				return false
			}
		}
		return records() == 1
	})
	k := writeback.Key{Name: "api", Key: "still-moving"}
	if to, _ := n.book.ReleasedTo(k); to != nodes[1].cfg.GRPCAddr {
		t.Errorf("the release still in force points to %q, want %q", to, nodes[1].cfg.GRPCAddr)
	}
	if !n.Cache().Fenced(keyHash(k), k, clock.Load()) {
		t.Error("the release still in force was dropped")
	}
}
