package writeback

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

func TestReleaseStopsDecisionsUntilTTLOrAdopt(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{})
	k := Key{Name: "api", Key: "u1"}
	h := hashKey(k)
	for range 3 {
		if _, err := c.Decide(h, k, lim10, 1, base); err != nil {
			t.Fatal(err)
		}
	}
	rec, ok, err := c.Fence(h, k, base, time.Second)
	if err != nil || !ok || rec.State.Count != 3 {
		t.Fatalf("release: %+v %v %v", rec, ok, err)
	}
	if _, err := c.Decide(h, k, lim10, 1, base+1); !errors.Is(err, ErrFenced) {
		t.Fatalf("decide after release: %v, want ErrFenced", err)
	}
	if !c.Fenced(h, k, base+1) {
		t.Fatal("Released is false after Release")
	}
	// After the TTL the key is decided here again, from the state it had.
	d, err := c.Decide(h, k, lim10, 1, base+int64(time.Second))
	if err != nil || d.Remaining != 6 {
		t.Fatalf("decide after ttl: %+v %v", d, err)
	}
	// Adopt ends a release at once and installs a newer record.
	if _, _, err := c.Fence(h, k, base+int64(time.Second), time.Hour); err != nil {
		t.Fatal(err)
	}
	newer := rec
	newer.State.Count = 9
	newer.Version = rec.Version + uint64(time.Hour)
	if !c.Install(h, newer) {
		t.Fatal("adopt of a newer record did not install it")
	}
	d, err = c.Decide(h, k, lim10, 1, base+2*int64(time.Second))
	if err != nil || d.Remaining != 0 {
		t.Fatalf("decide after adopt: %+v %v", d, err)
	}
	// Reclaim ends a release without a record.
	c.Fence(h, k, base+3*int64(time.Second), time.Hour)
	c.Unfence(h, k)
	if _, err := c.Decide(h, k, lim10, 0, base+3*int64(time.Second)); err != nil {
		t.Fatalf("decide after reclaim: %v", err)
	}
}

func TestReleaseIsAtomicWithDecide(t *testing.T) {
	t.Parallel()
	// Every hit admitted before the release is in the released record; none
	// is admitted after it.
	c, _ := newTestCache(t, Config{})
	k := Key{Name: "api", Key: "race"}
	h := hashKey(k)
	lim := lim10
	lim.Limit = 1_000_000
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := int64(0)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				d, err := c.Decide(h, k, lim, 1, base)
				if errors.Is(err, ErrFenced) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed() {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	rec, _, err := c.Fence(h, k, base, time.Hour)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if rec.State.Count != admitted {
		t.Fatalf("released record counts %d, %d were admitted", rec.State.Count, admitted)
	}
}

func TestTakeChangedAndRange(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 2, TrackChanges: true})
	keys := []Key{{Name: "a", Key: "1"}, {Name: "a", Key: "2"}, {Name: "a", Key: "3"}}
	for _, k := range keys {
		c.Decide(hashKey(k), k, lim10, 1, base)
	}
	c.Decide(hashKey(keys[0]), keys[0], lim10, 0, base) // a peek changes nothing
	c.Decide(hashKey(keys[1]), keys[1], lim10, 1, base) // a second change, one report
	if n := c.Changed(); n != 3 {
		t.Fatalf("Changed %d, want 3", n)
	}
	changed := map[Key]int64{}
	c.TakeChanged(base, func(h uint64, r Record) {
		if h != hashKey(r.Key) {
			t.Errorf("%v: hash %x, want the caller's %x", r.Key, h, hashKey(r.Key))
		}
		changed[r.Key] = r.State.Count
	})
	if len(changed) != 3 || changed[keys[0]] != 1 || changed[keys[1]] != 2 || changed[keys[2]] != 1 {
		t.Fatalf("TakeChanged gave %v", changed)
	}
	c.TakeChanged(base, func(h uint64, r Record) { t.Errorf("taken twice: %v", r.Key) })
	c.MarkChanged(hashKey(keys[2]), keys[2])
	n := 0
	c.TakeChanged(base, func(h uint64, r Record) { n++ })
	if n != 1 {
		t.Fatalf("MarkChanged: %d reported", n)
	}
	// Size 2: one key was evicted into pending; Range still sees all three.
	seen := map[Key]bool{}
	c.Range(base, func(r Record) bool { seen[r.Key] = r.State.Count >= 1; return true })
	if len(seen) != 3 || !seen[keys[0]] || !seen[keys[1]] || !seen[keys[2]] {
		t.Fatalf("Range saw %v", seen)
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	n = 0
	if err := c.RangeStored(base, func(Record) bool { n++; return true }); err != nil || n != 3 {
		t.Fatalf("RangeStored saw %d records, err %v", n, err)
	}
	n = 0
	c.RangeStored(base+int64(3*time.Minute), func(Record) bool { n++; return true })
	if n != 0 {
		t.Fatalf("RangeStored saw %d expired records", n)
	}
	// Adopt counts as a change.
	k := Key{Name: "b", Key: "1"}
	c.Install(hashKey(k), Record{Key: k, State: mustState(t, c, keys[0]), Version: uint64(base) + 100})
	var adopted []Key
	c.TakeChanged(base, func(h uint64, r Record) { adopted = append(adopted, r.Key) })
	if len(adopted) != 1 || adopted[0] != k {
		t.Fatalf("after Adopt TakeChanged gave %v", adopted)
	}
}

func mustState(t *testing.T, c *Cache, k Key) bucket.State {
	t.Helper()
	rec, ok, err := c.Get(hashKey(k), k, base)
	if err != nil || !ok {
		t.Fatalf("get %v: %v %v", k, ok, err)
	}
	return rec.State
}

func TestDecideAllIsAtomic(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{})
	k := Key{Name: "login", Key: "u1"}
	h := hashKey(k)
	lims := []bucket.Limit{
		{Limit: 5, WindowMS: 60_000},
		{Limit: 3, WindowMS: 1_000},
	}
	for i := range 3 {
		d, err := c.DecideAll(h, k, lims, 1, base, 1)
		if err != nil || !d.Allowed() {
			t.Fatalf("check %d: %+v %v", i, d, err)
		}
	}
	// The per-second limit refuses: neither limit consumes.
	d, err := c.DecideAll(h, k, lims, 1, base, 1)
	if err != nil || d.Allowed() || d.Limit != 3 || d.Remaining != 0 {
		t.Fatalf("fourth check: %+v %v", d, err)
	}
	rec, ok, _ := c.Get(h, SubKey(k, 0), base)
	if !ok || rec.State.Count != 3 {
		t.Fatalf("the per-minute limit consumed a refused hit: %+v", rec)
	}
	if BaseKey(SubKey(k, 1)) != k {
		t.Fatal("BaseKey does not undo SubKey")
	}
	if err := bucket.ValidateCounterKey(SubKey(k, 1).Name, k.Key); err != nil {
		t.Fatalf("a sub-key does not pass counter validation: %v", err)
	}
}
