package writeback

import (
	"fmt"
	"testing"
	"time"
)

// DropExpiredFences forgets the releases that ended, though nothing
// looks their keys up again, and keeps those in force.
func TestDropExpiredFences(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 4, Size: 64})
	const keys = 50
	for i := range keys {
		k := Key{Name: "n", Key: fmt.Sprint("k", i)}
		if _, _, err := c.Fence(hashKey(k), k, base, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	live := Key{Name: "n", Key: "live"}
	if _, _, err := c.Fence(hashKey(live), live, base, time.Hour); err != nil {
		t.Fatal(err)
	}
	held := func() int {
		n := 0
		for _, s := range c.shards {
			s.mu.Lock()
			n += len(s.fences)
			s.mu.Unlock()
		}
		return n
	}
	if n := c.DropExpiredFences(base + int64(time.Second) - 1); n != 0 || held() != keys+1 {
		t.Fatalf("before any release ended: dropped %d, %d held, want 0 and %d", n, held(), keys+1)
	}
	if n := c.DropExpiredFences(base + int64(time.Second)); n != keys || held() != 1 {
		t.Fatalf("after the 1 s releases ended: dropped %d, %d held, want %d and 1", n, held(), keys)
	}
	if !c.Fenced(hashKey(live), live, base+int64(time.Minute)) {
		t.Fatal("the release in force was dropped")
	}
}
