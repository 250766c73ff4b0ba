package cluster_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/clustertest"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// TestSweepForgetsWhatAMoveLeftBehind: after a membership change's window,
// the sweeper forgets what the change left behind: the moves (with their
// settled keys) and the records of released keys, though no further
// change or release comes to trigger it; a release still in force is
// kept.
func TestSweepForgetsWhatAMoveLeftBehind(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const window = 100 * time.Millisecond
		// The nodes' clock stands still until the test moves it: the
		// moves of the join stay in their window until then.
		var clock atomic.Int64
		clock.Store(time.Now().UnixNano())
		c := clustertest.Formed(t, clustertest.Options{Configure: func(cfg *cluster.Config) {
			cfg.Now = func() time.Time { return time.Unix(0, clock.Load()) }
			cfg.MoveWindow = window
		}}, "n0", "n1")
		nodes := nodesOf(c, "n0", "n1")
		n, puller := nodes[0], c.Member("n1")
		live := []bucket.Counter{{Name: "api", Key: "still-moving"}}
		n.Pull(context.Background(), puller.Name, puller.PeerAddr, live, true, 24*time.Hour, make([]keymove.PullAnswer, 1))
		const keys = 100 // fewer than ownership.MinReleasedSweep: NoteReleased never prunes
		for i := range keys {
			n.Pull(context.Background(), puller.Name, puller.PeerAddr, []bucket.Counter{{Name: "api", Key: fmt.Sprint("k", i)}}, true, window, make([]keymove.PullAnswer, 1))
		}
		records := n.Book().ReleasedRecords
		if got := records(); got != keys+1 {
			t.Fatalf("%d records of released keys, want %d", got, keys+1)
		}
		joined := 0
		for _, nd := range nodes {
			joined += len(nd.Book().Moves())
		}
		if joined == 0 {
			t.Fatal("the join left no move: nothing to sweep")
		}
		// Every window and release above ends, but the one of 24 h. The
		// clock moves with the bubble's, in steps the nodes' heartbeats
		// follow: a jump would look to them like a pause, whose move no
		// sweep drops while the clock stands still. Then one sweep more
		// (every quarter window).
		for range 2 * window / time.Millisecond {
			clock.Add(int64(time.Millisecond))
			time.Sleep(time.Millisecond)
		}
		time.Sleep(window / 4)
		synctest.Wait()
		for _, nd := range nodes {
			if m := len(nd.Book().Moves()); m > 0 {
				t.Errorf("%s holds %d moves two windows after the join", nd.Name(), m)
			}
		}
		if got := records(); got != 1 {
			t.Errorf("%d records of released keys two windows on, want 1 (the release still in force)", got)
		}
		k := writeback.Key{Name: "api", Key: "still-moving"}
		if to, _ := n.Book().ReleasedTo(k); to != puller.PeerAddr {
			t.Errorf("the release still in force points to %q, want %q", to, puller.PeerAddr)
		}
		if !n.Cache().Fenced(ring.Hash(k.Name, k.Key), k, clock.Load()) {
			t.Error("the release still in force was dropped")
		}
	})
}
