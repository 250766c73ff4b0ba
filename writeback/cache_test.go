package writeback

// Tests of the cache in memory: config, Merge, concurrency and allocations,
// interned names, hash collisions, the model check, slot reuse, Adopt and
// Install.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/bucket"
)

func pendingLen(c *Cache) int {
	n := 0
	for _, s := range c.shards {
		s.mu.Lock()
		n += len(s.pending)
		s.mu.Unlock()
	}
	return n
}

func mustLoad(t *testing.T, st Store, k Key) Record {
	t.Helper()
	rec, ok, err := st.Load(k)
	if err != nil || !ok {
		t.Fatalf("load %v: ok=%v err=%v", k, ok, err)
	}
	return rec
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config (all defaults): %v", err)
	}
	for _, c := range []Config{
		{Shards: 3}, {Shards: 1 << 20}, {Shards: 64, Size: 10},
		{FlushInterval: -1}, {ExpiryInterval: -time.Second}, {ExpiryBatch: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
		if _, err := New(c, nopStore{}); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

// TestMerge: a newer version is installed and written, an older one is not,
// also when the newer one is only in the store.
func TestMerge(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 1})
	k, other := Key{Name: "n", Key: "k"}, Key{Name: "n", Key: "other"}
	st := bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 4, Expires: base + 1e12}
	if !c.Merge(hashKey(k), Record{Key: k, State: st, Version: 10}) {
		t.Fatal("first merge refused")
	}
	if c.Merge(hashKey(k), Record{Key: k, State: bucket.State{}, Version: 10}) {
		t.Fatal("same version installed")
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	decide(t, c, other, lim10, 1, base) // evicts k (clean): now only in the store
	if c.Merge(hashKey(k), Record{Key: k, State: bucket.State{}, Version: 9}) {
		t.Fatal("older version installed over the stored one")
	}
	st.Count = 6
	if !c.Merge(hashKey(k), Record{Key: k, State: st, Version: 11}) {
		t.Fatal("newer version refused")
	}
	if rec, ok, _ := c.Get(hashKey(k), k, base); !ok || rec.Version != 11 || rec.State.Count != 6 {
		t.Fatalf("after merge: %+v", rec)
	}
}

// TestConcurrentNeverOverAdmits: many goroutines on overlapping keys, with
// a cache small enough to evict and reload all the time and flushes running
// concurrently: per key, exactly the limit is admitted.
func TestConcurrentNeverOverAdmits(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 2, Size: 4})
	const keys, workers, perWorker, limit = 12, 8, 400, 100
	lim := bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: limit, WindowMS: 3_600_000}
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var flushErr error
	var fwg sync.WaitGroup
	fwg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := c.Flush(t.Context()); err != nil {
				flushErr = err
				return
			}
		}
	})
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				ki := (w + i) % keys
				k := Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", ki)}
				d, err := c.Decide(hashKey(k), k, lim, 1, base+int64(i))
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed() {
					admitted[ki].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	fwg.Wait()
	if flushErr != nil {
		t.Fatal(flushErr)
	}
	for ki := range admitted {
		if got := admitted[ki].Load(); got != limit {
			t.Errorf("key %d: admitted %d, want exactly %d", ki, got, limit)
		}
	}
	if st := c.Stats(); st.Evictions == 0 || st.Loads == 0 {
		t.Errorf("test did not exercise eviction and reload: %+v", st)
	}
}

// TestDecideHitAllocs: a check that hits allocates nothing, whether it
// changes the state or not. Not parallel: testing.AllocsPerRun counts the
// whole process's allocations and panics in a parallel test.
func TestDecideHitAllocs(t *testing.T) {
	c, err := New(Config{Logger: quietLogger()}, nopStore{})
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Name: "api.create_url", Key: "user:1234567"}
	h := hashKey(k)
	lim := bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: bucket.MaxLimit, WindowMS: 60_000}
	decide(t, c, k, lim, 1, base)
	now := base
	if n := testing.AllocsPerRun(1000, func() {
		now++
		if _, err := c.Decide(h, k, lim, 1, now); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("admitting hit: %v allocs", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if _, err := c.Decide(h, k, lim10, 1, now); err != nil { // refused
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("refused hit: %v allocs", n)
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() {
		now++
		if _, err := c.Decide(h, k, lim, 1, now); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("hit after a flush: %v allocs", n)
	}
}

// TestNameInterned: entries of one name share one copy of the name.
func TestNameInterned(t *testing.T) {
	t.Parallel()
	c, err := New(Config{Shards: 1, Size: 10, Logger: quietLogger()}, nopStore{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		name := strings.Clone("api.create_url")
		decide(t, c, Key{Name: name, Key: fmt.Sprint(i)}, lim10, 1, base)
	}
	s := c.shards[0]
	slots := s.lru.Values()
	if len(s.nameIdx) != 1 || len(slots) != 3 {
		t.Fatalf("names %d keys %d", len(s.nameIdx), len(slots))
	}
	first := s.keyOf(s.slots.at(slots[0]))
	for _, i := range slots[1:] {
		if k := s.keyOf(s.slots.at(i)); unsafe.StringData(k.Name) != unsafe.StringData(first.Name) {
			t.Fatal("name not shared")
		}
	}
}

// TestHashCollision: keys whose 64-bit hashes collide (the caller's hash is
// not collision-free; xxhash collisions can be made on purpose) keep
// separate counters, in memory, through eviction and through the store.
func TestHashCollision(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 2})
	const h = 0x5eed
	keys := []Key{{Name: "api", Key: "a"}, {Name: "api", Key: "b"}, {Name: "api", Key: "c"}, {Name: "other", Key: "a"}}
	lim := bucket.Limit{Limit: 100, WindowMS: 60_000}
	want := map[Key]int64{}
	for round := range 3 {
		for i, k := range keys {
			hits := int64(i + 1)
			if _, err := c.Decide(h, k, lim, hits, base); err != nil {
				t.Fatal(err)
			}
			want[k] += hits
		}
		if round == 1 {
			if err := c.Flush(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, k := range keys {
		rec, ok, err := c.Get(h, k, base)
		if err != nil || !ok || rec.State.Count != want[k] {
			t.Fatalf("%v: count %d ok %v err %v, want %d", k, rec.State.Count, ok, err, want[k])
		}
	}
	seen := map[Key]int64{}
	c.Range(base, func(r Record) bool { seen[r.Key] = r.State.Count; return true })
	if len(seen) != len(keys) {
		t.Fatalf("Range saw %v", seen)
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	n := 0
	c.RangeStored(base, func(r Record) bool {
		n++
		if r.State.Count != want[r.Key] {
			t.Errorf("stored %v count %d, want %d", r.Key, r.State.Count, want[r.Key])
		}
		return true
	})
	if n != len(keys) {
		t.Fatalf("store holds %d records, want %d", n, len(keys))
	}
}

// TestCacheAgainstModel runs random decisions, flushes, takes of changes
// and reads through a tiny cache (constant eviction, pending entries,
// slots reused, hash collisions on purpose) and checks every count against
// a plain map, and that every change is reported with its own key's hash.
func TestCacheAgainstModel(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 99))
			st := newMemStore()
			c, err := New(Config{Shards: 2, Size: 8, TrackChanges: true, Logger: quietLogger()}, st)
			if err != nil {
				t.Fatal(err)
			}
			var keys []Key
			hashes := map[Key]uint64{}
			for i := range 40 {
				k := Key{Name: []string{"a", "b"}[i%2], Key: fmt.Sprint("k", i)}
				keys = append(keys, k)
				// Real top bits (the shard), and low bits that collide.
				hashes[k] = hashKey(k)&^0xffffffff | uint64(i%3)
			}
			lim := bucket.Limit{Limit: bucket.MaxLimit, WindowMS: 60_000}
			model := map[Key]int64{}
			get := func(k Key) int64 {
				rec, ok, err := c.Get(hashes[k], k, base)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					return 0
				}
				return rec.State.Count
			}
			for op := range 20_000 {
				k := keys[rng.IntN(len(keys))]
				switch r := rng.IntN(100); {
				case r < 75:
					hits := int64(1 + rng.IntN(3))
					if _, err := c.Decide(hashes[k], k, lim, hits, base); err != nil {
						t.Fatal(err)
					}
					model[k] += hits
				case r < 90:
					if err := c.Flush(t.Context()); err != nil {
						t.Fatal(err)
					}
				case r < 93:
					c.TakeChanged(base, func(h uint64, rec Record) {
						if h != hashes[rec.Key] {
							t.Fatalf("op %d: %v reported with hash %x, its own is %x", op, rec.Key, h, hashes[rec.Key])
						}
						if rec.State.Count != model[rec.Key] {
							t.Fatalf("op %d: %v reported count %d, model %d", op, rec.Key, rec.State.Count, model[rec.Key])
						}
					})
				case r < 95:
					c.MarkChanged(hashes[k], k)
				default:
					if got := get(k); got != model[k] {
						t.Fatalf("op %d: %v count %d, model %d", op, k, got, model[k])
					}
				}
			}
			if err := c.Close(t.Context()); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				rec, ok, _ := st.Load(k)
				if model[k] != 0 && (!ok || rec.State.Count != model[k]) {
					t.Fatalf("stored %v: %+v %v, model %d", k, rec, ok, model[k])
				}
			}
		})
	}
}

// TestSlotReuseWaitsForTakeChanged: the slot of a key evicted with a
// change not yet taken is not given to another key before TakeChanged has
// run, or the other key would be reported under the first key's hash.
func TestSlotReuseWaitsForTakeChanged(t *testing.T) {
	t.Parallel()
	c, err := New(Config{Shards: 1, Size: 1, TrackChanges: true, Logger: quietLogger()}, newMemStore())
	if err != nil {
		t.Fatal(err)
	}
	lim := bucket.Limit{Limit: bucket.MaxLimit, WindowMS: 60_000}
	keys := []Key{{Name: "x", Key: "a"}, {Name: "x", Key: "b"}, {Name: "x", Key: "c"}}
	c.Decide(1, keys[0], lim, 1, base)
	if err := c.Flush(t.Context()); err != nil { // a is clean: evicted, it is dropped
		t.Fatal(err)
	}
	c.Decide(2, keys[1], lim, 1, base) // evicts a
	c.Decide(3, keys[2], lim, 1, base) // evicts b, takes a fresh slot
	got := map[Key]uint64{}
	c.TakeChanged(base, func(h uint64, r Record) { got[r.Key] = h })
	for i, k := range keys {
		if h, ok := got[k]; !ok || h != uint64(i+1) {
			t.Fatalf("changes taken %v, want each key with its own hash", got)
		}
	}
}

// TestSlabIndices: slab indices skip 0 and each chunk's missing last
// offset, address distinct slots, and are reused after release.
func TestSlabIndices(t *testing.T) {
	t.Parallel()
	var b slab
	seen := map[*slot]uint32{}
	for range 3 * chunkSlots {
		i, sl := b.alloc()
		if i == 0 || i&chunkMask == chunkSlots || b.at(i) != sl {
			t.Fatalf("index %d (slot %p, at %p)", i, sl, b.at(i))
		}
		if j, dup := seen[sl]; dup {
			t.Fatalf("indices %d and %d share a slot", i, j)
		}
		seen[sl] = i
	}
	if len(b.chunks) != 4 { // 3×255 slots, index 0 skipped
		t.Fatalf("%d chunks", len(b.chunks))
	}
	b.at(7).version = 42
	b.release(7)
	if i, sl := b.alloc(); i != 7 || sl.version != 0 {
		t.Fatalf("after release: index %d version %d", i, sl.version)
	}
}

// A key released after a pull began stays released: InstallUnlessFencedSince
// neither installs the pulled record nor ends the release. One released
// before keeps Adopt's behaviour.
func TestInstallUnlessFencedSince(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 8})
	k := Key{Name: "n", Key: "k"}
	h := hashKey(k)
	decide(t, c, k, lim10, 3, base)
	// Released at base+10; a pull that began at base+5 comes back.
	if _, _, err := c.Fence(h, k, base+10, time.Minute); err != nil {
		t.Fatal(err)
	}
	rec := Record{Key: k, State: bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 1, Expires: base + int64(time.Hour)}, Version: uint64(base + 20)}
	if c.InstallUnlessFencedSince(h, rec, base+5) {
		t.Fatal("adopted a record over a release made after the pull began")
	}
	if !c.Fenced(h, k, base+30) {
		t.Fatal("the release made after the pull began was ended")
	}
	// A pull that began after the release: the usual adoption.
	if !c.InstallUnlessFencedSince(h, rec, base+15) {
		t.Fatal("did not adopt over a release made before the pull began")
	}
	if c.Fenced(h, k, base+30) {
		t.Fatal("the adoption did not end the older release")
	}
	if got, ok, _ := c.Get(h, k, base+30); !ok || got.State.Count != 1 || got.Version != rec.Version {
		t.Fatalf("held %+v", got)
	}
}

// A fence set after a mark outlives the taking back that the mark was for,
// whatever the clock said when each fence was set: the node that pulled the
// key meanwhile holds this cache's state and decides it. A fence set
// before the mark is lifted as Unfence would.
func TestFenceMarkOrdersFencesNotTimes(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 8})
	k := Key{Name: "n", Key: "k"}
	h := hashKey(k)
	decide(t, c, k, lim10, 3, base)
	// Released at base+10 (to a node this one will take it back from).
	if _, _, err := c.Fence(h, k, base+10, time.Minute); err != nil {
		t.Fatal(err)
	}
	mark := c.FenceMark()
	// Released again while the pull is out, stamped with an earlier clock.
	if _, _, err := c.Fence(h, k, base+5, time.Minute); err != nil {
		t.Fatal(err)
	}
	rec := Record{Key: k, State: bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 1, Expires: base + int64(time.Hour)}, Version: uint64(base + 20)}
	if c.InstallUnlessFencedAfter(h, rec, mark) {
		t.Fatal("adopted a record over a release made after the mark")
	}
	if c.UnfenceUnlessFencedAfter(h, k, mark) {
		t.Fatal("lifted a release made after the mark")
	}
	if !c.Fenced(h, k, base+30) {
		t.Fatal("the release made after the mark was ended")
	}
	// Taken back with a mark after the last release: lifted.
	mark = c.FenceMark()
	if !c.InstallUnlessFencedAfter(h, rec, mark) {
		t.Fatal("did not adopt over a release made before the mark")
	}
	if _, _, err := c.Fence(h, k, base+40, time.Minute); err != nil {
		t.Fatal(err)
	}
	if !c.UnfenceUnlessFencedAfter(h, k, c.FenceMark()) || c.Fenced(h, k, base+50) {
		t.Fatal("a release made before the mark was not lifted")
	}
}

// Two copies of a fixed-window counter that diverged (the two sides of a
// healed partition each decided the key): installing the other copy never
// lowers the count of the window held, whatever the versions say, so the
// merged counter has seen every hit either side admitted. A newer version
// with the lower count used to win (last writer wins): the owner that had
// admitted the limit then admitted again (test/faults: 21 for a promise of
// 20).
// installPaths are the ways a copy of another node's record is installed.
var installPaths = []struct {
	name    string
	install func(c *Cache, h uint64, rec Record) bool
}{
	{"Install", (*Cache).Install},
	{"Merge", (*Cache).Merge},
	{"InstallUnlessFencedSince", func(c *Cache, h uint64, rec Record) bool {
		return c.InstallUnlessFencedSince(h, rec, base)
	}},
}

func TestInstallKeepsLargerFixedWindowCount(t *testing.T) {
	t.Parallel()
	fw := bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 10, WindowMS: 3_600_000}
	for _, tc := range installPaths {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, _ := newTestCache(t, Config{Shards: 1, Size: 8})
			k := Key{Name: "n", Key: "k"}
			h := hashKey(k)
			for i := range 10 {
				if d := decide(t, c, k, fw, 1, base+int64(i)); d.Status != bucket.UnderLimit {
					t.Fatalf("hit %d refused", i)
				}
			}
			held, _, _ := c.Get(h, k, base+10)
			// The other side's copy: 6 hits in the same window, decided
			// later (a newer, clock-based version).
			other := held
			other.State.Count = 6
			other.Version = held.Version + uint64(time.Second)
			tc.install(c, h, other)
			got, _, _ := c.Get(h, k, base+20)
			if got.State.Count != 10 {
				t.Fatalf("after installing the other side's count 6 (newer version) over 10: count %d", got.State.Count)
			}
			if got.Version < other.Version {
				t.Fatalf("version %d, want at least the installed %d (replicas must take the merge)", got.Version, other.Version)
			}
			if d := decide(t, c, k, fw, 1, base+30); d.Status != bucket.OverLimit {
				t.Fatalf("admitted an 11th hit after the merge: %+v", d)
			}
			// The reverse: the copy held has the lower count and the
			// newer version; the larger count arrives with an older one.
			c2, _ := newTestCache(t, Config{Shards: 1, Size: 8})
			low := other
			low.Version = held.Version + 2*uint64(time.Second)
			tc.install(c2, h, low)
			tc.install(c2, h, held)
			if got, _, _ := c2.Get(h, k, base+20); got.State.Count != 10 || got.Version <= low.Version {
				t.Fatalf("count 10 (older version) over 6 (newer): held %+v", got)
			}
		})
	}
}

// TestResetOutranksCopiesOfTheForgottenCount: a reset key's record, and the
// records that follow it, replace a replica's copy of the count the reset
// forgot, by every install path, though that copy's count is larger (which
// a merge of one epoch would keep); the forgotten count arriving late
// changes nothing; and the reset survives a restart from the store.
func TestResetOutranksCopiesOfTheForgottenCount(t *testing.T) {
	t.Parallel()
	fw := bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 10, WindowMS: 3_600_000}
	for _, tc := range installPaths {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			owner, dir := newTestCache(t, Config{Shards: 1, Size: 8})
			k := Key{Name: "n", Key: "k"}
			h := hashKey(k)
			for i := range 10 {
				decide(t, owner, k, fw, 1, base+int64(i))
			}
			forgotten, _, _ := owner.Get(h, k, base+10)
			if ok, err := owner.Reset(h, k, base+11); !ok || err != nil {
				t.Fatalf("Reset: %v, %v", ok, err)
			}
			reset, _, _ := owner.Get(h, k, base+12)
			if reset.State.Epoch != 1 || reset.Version <= forgotten.Version {
				t.Fatalf("reset record %+v after %+v", reset, forgotten)
			}
			decide(t, owner, k, fw, 2, base+13)
			after, _, _ := owner.Get(h, k, base+14)

			replica, _ := newTestCache(t, Config{Shards: 1, Size: 8})
			tc.install(replica, h, forgotten)
			tc.install(replica, h, reset)
			if got, _, _ := replica.Get(h, k, base+15); got.State != reset.State {
				t.Fatalf("replica holds %+v after the reset, want %+v", got.State, reset.State)
			}
			tc.install(replica, h, after)
			tc.install(replica, h, forgotten) // late
			if got, _, _ := replica.Get(h, k, base+15); got.State.Count != 2 || got.State.Epoch != 1 {
				t.Fatalf("replica holds %+v, want the owner's count 2 after the reset", got.State)
			}
			// A replica that missed the reset record itself.
			missed, _ := newTestCache(t, Config{Shards: 1, Size: 8})
			tc.install(missed, h, forgotten)
			tc.install(missed, h, after)
			if got, _, _ := missed.Get(h, k, base+15); got.State.Count != 2 {
				t.Fatalf("a replica that missed the reset holds count %d, want 2", got.State.Count)
			}
			if d := decide(t, missed, k, fw, 8, base+16); d.Status != bucket.UnderLimit || d.Remaining != 0 {
				t.Fatalf("8 more hits after the reset's 2: %+v", d)
			}

			// The owner restarts from its store.
			if err := owner.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			again := newCacheAt(t, Config{Shards: 1, Size: 8}, dir)
			if got, _, _ := again.Get(h, k, base+20); got.State != after.State || got.Version != after.Version {
				t.Fatalf("after a restart: %+v, want %+v", got, after)
			}
		})
	}
}

// TestResetOfAFreshKeyChangesNothing: nothing counted, nothing reset.
func TestResetOfAFreshKeyChangesNothing(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 8})
	k := Key{Name: "n", Key: "k"}
	if ok, err := c.Reset(hashKey(k), k, base); ok || err != nil {
		t.Fatalf("Reset of a key never seen: %v, %v", ok, err)
	}
	decide(t, c, k, lim10, 1, base)
	if ok, err := c.Reset(hashKey(k), k, base+3*60_000_000_000); ok || err != nil {
		t.Fatalf("Reset of an expired key: %v, %v", ok, err)
	}
}
