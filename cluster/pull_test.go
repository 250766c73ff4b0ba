package cluster

// Tests of pulls: merged copies, pruned releases. (Not while draining:
// settle_test.go. A new owner taking a key's counter from its old holder,
// a leaving node that does not take a pulled key back, crossed pulls, a
// check right after the table changes, and batched pulls after a join:
// cluster/clustertest's pull_test.go and pullbatch_test.go.)

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/writeback"
)

// TestMergeCopiesOfAPull: a pull that gets several copies of a key (the
// sides of a healed partition each decided it) keeps their merge where the
// algorithm has a rule — the larger fixed-window count even when it has
// the older version — with the larger version; the newer version
// otherwise; and a missing copy (version 0) never wins.
func TestMergeCopiesOfAPull(t *testing.T) {
	t.Parallel()
	fw := func(count int64, v uint64) bucket.Counter {
		return bucket.Counter{Name: "n", Key: "k", Version: v,
			State: bucket.State{Algorithm: bucket.FixedWindow, Start: 1000, Count: count, Expires: 2000}}
	}
	tb := func(count int64, v uint64) bucket.Counter {
		return bucket.Counter{Name: "n", Key: "k", Version: v,
			State: bucket.State{Algorithm: bucket.TokenBucket, Start: 1000, Count: count, Expires: 2000}}
	}
	none := bucket.Counter{Name: "n", Key: "k"}
	for _, tc := range []struct {
		name      string
		a, b      bucket.Counter
		wantCount int64
		wantV     uint64
	}{
		{"larger count, older version, first", fw(9, 5), fw(3, 8), 9, 8},
		{"larger count, older version, second", fw(3, 8), fw(9, 5), 9, 8},
		{"no rule: the newer version", tb(9, 5), tb(3, 8), 3, 8},
		{"no rule, newer first", tb(3, 8), tb(9, 5), 3, 8},
		{"a missing copy never wins", fw(4, 2), none, 4, 2},
		{"a missing copy first", none, fw(4, 2), 4, 2},
	} {
		got := mergeCopies(tc.a, tc.b)
		if got.State.Count != tc.wantCount || got.Version != tc.wantV {
			t.Errorf("%s: count %d version %d, want %d and %d", tc.name, got.State.Count, got.Version, tc.wantCount, tc.wantV)
		}
	}
}

// TestReleasedToIsPruned: every key another node pulls with release is
// recorded with where it went (ownership.Book.NoteReleased), but the record matters only
// while the release is in force. Releasing many keys one after another,
// each release over before the next, must keep the records within the
// sweep threshold plus twice the releases in force, not one per key ever
// moved; a release still in force keeps its record. The node answering
// the pulls is made but not started: answering a pull needs no network.
func TestReleasedToIsPruned(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(t0.UnixNano())
	cfg := NodeConfig(t, "n0", memAddr(0))
	cfg.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.cache.Close(context.Background()) })
	n.life.alone()
	ctx := context.Background()
	puller, pullerAddr := "n1", memAddr(1)
	live := []bucket.Counter{{Name: "api", Key: "still-moving"}}
	n.Pull(ctx, puller, pullerAddr, live, true, time.Hour, make([]keymove.PullAnswer, 1))
	const keys = 5 * ownership.MinReleasedSweep
	for i := range keys {
		clock.Add(int64(2 * time.Millisecond)) // the previous release is over
		n.Pull(ctx, puller, pullerAddr, []bucket.Counter{{Name: "api", Key: fmt.Sprint("k", i)}}, true, time.Millisecond, make([]keymove.PullAnswer, 1))
	}
	records := n.book.ReleasedRecords()
	bound := ownership.MinReleasedSweep + 2*2 // the threshold, and twice the two releases in force
	t.Logf("%d keys released one after another: %d records kept (bound %d)", keys, records, bound)
	if records > bound {
		t.Errorf("%d records of released keys kept, want at most %d", records, bound)
	}
	k := writeback.Key{Name: "api", Key: "still-moving"}
	if to, _ := n.book.ReleasedTo(k); to != pullerAddr {
		t.Errorf("the release still in force points to %q, want %q", to, pullerAddr)
	}
}
