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

// With Config.Copies, a replica keeps its copies in memory after their
// write, apart from the keys it decides: the owner's next copy of a key is
// installed without a store read, the oldest copy makes room (kept until
// its write when it has an unwritten change), and no copy is lost.
func TestCopiesStayInMemoryAfterTheirWrite(t *testing.T) {
	t.Parallel()
	const held = 4
	c, _ := newTestCache(t, Config{Shards: 1, Size: 2, Copies: held})
	owned := []Key{{Name: "n", Key: "a"}, {Name: "n", Key: "b"}}
	for _, k := range owned {
		decide(t, c, k, lim10, 1, base)
	}
	const copies = 6
	latest := make([]Record, copies)
	copyOf := func(i int, v uint64) Record {
		rec := Record{Key: Key{Name: "n", Key: fmt.Sprintf("copy-%d", i)}, Version: uint64(base) + v,
			State: bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: int64(v), Expires: base + 1e12}}
		latest[i] = rec
		return rec
	}
	merge := func(rec Record) {
		t.Helper()
		if !c.Merge(hashKey(rec.Key), rec) {
			t.Fatalf("copy %s version %d refused", rec.Key.Key, rec.Version)
		}
	}
	for i := range copies {
		merge(copyOf(i, 1))
	}
	if ev := c.Stats().Evictions; ev != 0 {
		t.Errorf("merging %d copies evicted %d owned keys from a cache of 2", copies, ev)
	}
	if n := c.Len(); n != len(owned) {
		t.Errorf("LRU holds %d keys after the copies, want the %d owned", n, len(owned))
	}
	// The two oldest copies made room before their write: they wait in
	// pending for it.
	if n := pendingLen(c); n != copies-held {
		t.Errorf("%d copies wait in pending, want %d", n, copies-held)
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := pendingLen(c); n != 0 {
		t.Errorf("%d entries in pending after the flush", n)
	}
	inMemory := 0
	c.Range(base, func(Record) bool { inMemory++; return true })
	if want := len(owned) + held; inMemory != want {
		t.Errorf("Range after the flush sees %d keys, want %d (the owned and the copies held)", inMemory, want)
	}
	// The next copy of each key held is installed without a store read.
	loads := c.Stats().Loads
	for i := copies - held; i < copies; i++ {
		merge(copyOf(i, 2))
	}
	if got := c.Stats().Loads - loads; got != 0 {
		t.Errorf("the next copy of %d copies held in memory read the store %d times, want 0", held, got)
	}
	// A copy that made room is only in the store: its next copy reads it
	// (an older one is refused against it), and pushes out the oldest
	// held copy, whose change is unwritten.
	if stale := latest[0]; c.Merge(hashKey(stale.Key), Record{Key: stale.Key, Version: stale.Version - 1, State: stale.State}) {
		t.Error("an older copy was installed over the stored one")
	}
	merge(copyOf(0, 3))
	if got := c.Stats().Loads - loads; got < 1 {
		t.Errorf("a copy only the store held was merged without reading it (%d loads)", got)
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i, want := range latest {
		got, ok, err := c.Get(hashKey(want.Key), want.Key, base)
		if err != nil || !ok || got.Version != want.Version || got.State.Count != want.State.Count {
			t.Errorf("copy %d: %+v ok=%v err=%v, want version %d count %d", i, got, ok, err, want.Version, want.State.Count)
		}
	}
	if n := c.Len(); n > 2 {
		t.Errorf("LRU holds %d keys, over its size 2", n)
	}
}

// A replica that decides a key it holds a copy of (after its owner
// failed) decides from that copy, whether the copy waits for its write or
// is only in the store, with and without copies kept in memory.
func TestDecideFromMergedCopy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flushed bool
		copies  int
	}{{false, 0}, {true, 0}, {false, 4}, {true, 4}} {
		flushed := tc.flushed
		t.Run(fmt.Sprintf("flushed=%v,copies=%d", flushed, tc.copies), func(t *testing.T) {
			t.Parallel()
			c, _ := newTestCache(t, Config{Shards: 1, Size: 4, Copies: tc.copies})
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
			seen := 0
			c.Range(base+2, func(Record) bool { seen++; return true })
			if seen != 1 {
				t.Errorf("Range sees the key %d times, want once (moved from the copies, not copied)", seen)
			}
		})
	}
}
