package writeback

import (
	"fmt"
	"testing"
	"time"
)

// TestExpiredReleasesAreDropped: a release is dropped when its key is
// looked up after it expired, but most released keys are never looked up
// again on this node. Releasing many keys, each expired before the next
// one is released, must keep every shard's record of releases within
// twice the releases in force plus the sweep threshold, not grow with
// every key ever released; releases still in force survive the sweeps.
func TestExpiredReleasesAreDropped(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Size: 1024, Shards: 4})
	const n = 20_000
	ttl := time.Millisecond
	now := int64(1_000_000_000)
	live := Key{Name: "api", Key: "still-moving"}
	c.Fence(hashKey(live), live, now, time.Hour)
	for i := range n {
		k := Key{Name: "api", Key: fmt.Sprint("k", i)}
		now += int64(2 * ttl) // the previous release has expired
		if _, _, err := c.Fence(hashKey(k), k, now, ttl); err != nil {
			t.Fatal(err)
		}
	}
	total, most := 0, 0
	for _, s := range c.shards {
		s.mu.Lock()
		total += len(s.fences)
		most = max(most, len(s.fences))
		s.mu.Unlock()
	}
	// In force at the end: the hour-long release and the last one. A
	// shard sweeps when it reaches max(2 × its size after the last sweep,
	// minFenceSweep), so it never holds more than minFenceSweep + 2 × 2.
	bound := minFenceSweep + 4
	t.Logf("%d keys released one after another: %d releases recorded in all, at most %d in one shard (bound %d)", n, total, most, bound)
	if most > bound {
		t.Errorf("a shard records %d releases, want at most %d", most, bound)
	}
	if !c.Fenced(hashKey(live), live, now) {
		t.Error("a release still in force was dropped by a sweep")
	}
}
