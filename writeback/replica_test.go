package writeback

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// Replica copies (Merge of keys the cache does not hold) take no place in
// the LRU: the keys this node decides stay in memory however many copies
// arrive, each copy waits in memory only until a flush writes it, and a
// read of a copy (a replica standing in, a pull) finds it before and after
// that flush.
func TestMergeKeepsCopiesOutOfTheLRU(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 2})
	owned := []Key{{Name: "n", Key: "a"}, {Name: "n", Key: "b"}}
	for _, k := range owned {
		decide(t, c, k, lim10, 1, base)
	}
	const copies = 10
	copyOf := func(i int) Record {
		return Record{Key: Key{Name: "n", Key: fmt.Sprintf("copy-%d", i)}, Version: uint64(base) + uint64(i),
			State: bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: int64(i + 1), Expires: base + 1e12}}
	}
	for i := range copies {
		rec := copyOf(i)
		if !c.Merge(hashKey(rec.Key), rec) {
			t.Fatalf("copy %d refused", i)
		}
	}
	if ev := c.Stats().Evictions; ev != 0 {
		t.Errorf("merging %d copies evicted %d owned keys from a cache of 2", copies, ev)
	}
	if n := c.Len(); n != len(owned) {
		t.Errorf("LRU holds %d keys after the copies, want the %d owned", n, len(owned))
	}
	if n := pendingLen(c); n != copies {
		t.Errorf("%d copies wait for their write, want %d", n, copies)
	}
	// A newer copy of a waiting one replaces it in place; an older one not.
	again := copyOf(3)
	again.Version++
	again.State.Count = 9
	if !c.Merge(hashKey(again.Key), again) {
		t.Fatal("newer copy of a waiting copy refused")
	}
	if stale := copyOf(3); c.Merge(hashKey(stale.Key), stale) {
		t.Fatal("older copy of a waiting copy installed")
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := pendingLen(c); n != 0 {
		t.Errorf("%d copies still in memory after the flush that wrote them", n)
	}
	if n := c.Len(); n != len(owned) {
		t.Errorf("LRU holds %d keys after the flush, want %d", n, len(owned))
	}
	for i := range copies {
		want := copyOf(i)
		if i == 3 {
			want = again
		}
		got, ok, err := c.Get(hashKey(want.Key), want.Key, base)
		if err != nil || !ok || got.Version != want.Version || got.State.Count != want.State.Count {
			t.Errorf("copy %d after the flush: %+v ok=%v err=%v, want version %d count %d",
				i, got, ok, err, want.Version, want.State.Count)
		}
	}
	// After the flush, a copy only the store holds still refuses an older
	// version and takes a newer one.
	older, newer := copyOf(0), copyOf(0)
	older.Version--
	if c.Merge(hashKey(older.Key), older) {
		t.Error("older copy installed over the stored one")
	}
	newer.Version++
	newer.State.Count = 5
	if !c.Merge(hashKey(newer.Key), newer) {
		t.Error("newer copy refused over the stored one")
	}
	if got, _, _ := c.Get(hashKey(newer.Key), newer.Key, base); got.Version != newer.Version || got.State.Count != 5 {
		t.Errorf("after a newer copy over the stored one: %+v", got)
	}
}

// A replica that decides a key it holds a copy of (after its owner
// failed) decides from that copy, whether the copy waits for its write or
// is only in the store.
func TestDecideFromMergedCopy(t *testing.T) {
	t.Parallel()
	for _, flushed := range []bool{false, true} {
		t.Run(fmt.Sprintf("flushed=%v", flushed), func(t *testing.T) {
			t.Parallel()
			c, _ := newTestCache(t, Config{Shards: 1, Size: 4})
			k := Key{Name: "n", Key: "k"}
			rec := Record{Key: k, Version: uint64(base),
				State: bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 9, Expires: base + 1e12}}
			if !c.Merge(hashKey(k), rec) {
				t.Fatal("copy refused")
			}
			if flushed {
				if err := c.Flush(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			// lim10 allows 10 a minute: the copy's 9 leave one.
			if d := decide(t, c, k, lim10, 1, base+1); d.Status != bucket.UnderLimit {
				t.Fatalf("10th hit: %+v", d)
			}
			if d := decide(t, c, k, lim10, 1, base+2); d.Status != bucket.OverLimit {
				t.Fatalf("11th hit admitted: the copy's count was not used: %+v", d)
			}
			if n := c.Len(); n != 1 {
				t.Errorf("a decided key is in the LRU: Len %d, want 1", n)
			}
		})
	}
}
