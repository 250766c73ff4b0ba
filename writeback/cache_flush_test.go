package writeback

// Tests of the cache's flushes: what a flush writes, Close, the flush loop,
// early flushes on evictions, and a failed flush keeping its entries dirty.

import (
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// TestFlush: decisions, one Flush, then the store (reopened) has the states
// with their versions.
func TestFlush(t *testing.T) {
	t.Parallel()
	c, dir := newTestCache(t, Config{Shards: 4, Size: 100})
	a, b := Key{Name: "api.create_url", Key: "user:1"}, Key{Name: "api.create_url", Key: "user:2"}
	for i := range int64(3) {
		decide(t, c, a, lim10, 1, base+i)
	}
	decide(t, c, b, lim10, 2, base)
	decide(t, c, b, lim10, 0, base+5) // a peek changes nothing
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Flushes != 1 || st.FlushedRecords != 2 {
		t.Fatalf("stats after flush: %+v", st)
	}
	if err := c.Flush(t.Context()); err != nil { // nothing dirty: writes nothing
		t.Fatal(err)
	}
	if err := c.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Flushes != 1 {
		t.Fatalf("Close wrote although nothing was dirty: %+v", st)
	}
	st := openTestStore(t, dir)
	defer st.Close()
	ra, rb := mustLoad(t, st, a), mustLoad(t, st, b)
	if ra.State.Count != 3 || ra.Version != uint64(base+2) {
		t.Errorf("a: %+v, want count 3 version %d", ra, base+2)
	}
	if rb.State.Count != 2 || rb.Version != uint64(base) {
		t.Errorf("b: %+v, want count 2 version %d", rb, base)
	}
	var n int
	if err := st.ForEach(func(Record) bool { n++; return true }); err != nil || n != 2 {
		t.Errorf("ForEach saw %d records (err %v), want 2", n, err)
	}
}

// TestCloseFlushesPending: Close writes dirty and pending entries.
func TestCloseFlushesPending(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := newCacheAt(t, Config{Shards: 1, Size: 1}, dir)
	a, b := Key{Name: "n", Key: "a"}, Key{Name: "n", Key: "b"}
	decide(t, c, a, lim10, 2, base)
	decide(t, c, b, lim10, 3, base) // a → pending
	if pendingLen(c) != 1 {
		t.Fatal("a not pending")
	}
	if err := c.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := openTestStore(t, dir)
	defer st.Close()
	if mustLoad(t, st, a).State.Count != 2 || mustLoad(t, st, b).State.Count != 3 {
		t.Fatal("Close lost a record")
	}
}

// TestFlushLoop: in a synctest bubble, the flush loop writes a change once
// fake time passes FlushInterval, and the expiry loop runs its pass.
func TestFlushLoop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// An in-memory store: pebble's own goroutines would live outside
		// the bubble and blur when it is idle.
		hs := newMemStore()
		c, err := New(Config{Logger: quietLogger(), ExpiryInterval: 10 * time.Second}, hs)
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		c.Start(ctx)
		k := Key{Name: "api.create_url", Key: "user:9"}
		decide(t, c, k, lim10, 4, time.Now().UnixNano())
		time.Sleep(DefaultFlushInterval / 2)
		synctest.Wait()
		if _, ok, _ := hs.Load(k); ok {
			t.Fatal("written before FlushInterval")
		}
		time.Sleep(DefaultFlushInterval / 2)
		synctest.Wait()
		if rec, ok, err := hs.Load(k); err != nil || !ok || rec.State.Count != 4 {
			t.Fatalf("after FlushInterval: %+v %v %v", rec, ok, err)
		}
		if st := c.Stats(); st.Flushes != 1 {
			t.Fatalf("stats %+v", st)
		}
		// The record expires two minutes later; the expiry loop deletes it.
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		if _, ok, _ := hs.Load(k); ok || c.Stats().ExpiredDeleted != 1 {
			t.Fatalf("expired record not deleted: %+v", c.Stats())
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestEvictionsStartAFlushEarly: entries evicted with unwritten changes
// wait in memory for the next flush; when many pile up (heavy key churn
// within one flush interval) they start a flush at once, so memory stays
// near Size instead of growing with the churn until the interval ends.
func TestEvictionsStartAFlushEarly(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		hs := newMemStore()
		const size = 256
		c, err := New(Config{Logger: quietLogger(), Shards: 1, Size: size, FlushInterval: time.Hour, ExpiryInterval: time.Hour}, hs)
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		c.Start(ctx)
		now := time.Now().UnixNano()
		for i := range 4 * size {
			decide(t, c, Key{Name: "api", Key: fmt.Sprint("churn:", i)}, lim10, 1, now)
			synctest.Wait() // let a flush that was started finish
		}
		if p := pendingLen(c); p > size/4 {
			t.Fatalf("%d evicted entries wait for a flush an hour away (size %d)", p, size)
		}
		if st := c.Stats(); st.Flushes == 0 {
			t.Fatalf("no flush: %+v", st)
		}
		// Nothing was lost on the way: every key is in memory or stored.
		for i := range 4 * size {
			k := Key{Name: "api", Key: fmt.Sprint("churn:", i)}
			if d := decide(t, c, k, lim10, 0, now); d.Remaining != lim10.Limit-1 {
				t.Fatalf("%v: remaining %d, want %d", k, d.Remaining, lim10.Limit-1)
			}
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFailedFlushKeepsDirty: a failed write keeps entries dirty (and
// counted); a change made during a write stays dirty; the write never holds
// a shard lock (the hook's Decide would deadlock).
func TestFailedFlushKeepsDirty(t *testing.T) {
	t.Parallel()
	hs := &hookStore{Store: openTestStore(t, t.TempDir()), failWrites: 1}
	c, err := New(Config{Shards: 1, Size: 1, Logger: quietLogger()}, hs)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	a, b := Key{Name: "n", Key: "a"}, Key{Name: "n", Key: "b"}
	decide(t, c, a, lim10, 1, base)
	decide(t, c, b, lim10, 1, base) // a → pending
	if err := c.Flush(t.Context()); !errors.Is(err, errInjected) {
		t.Fatalf("flush: %v", err)
	}
	if st := c.Stats(); st.FlushErrors != 1 || st.Flushes != 0 || pendingLen(c) != 1 {
		t.Fatalf("after failure: %+v pending %d", st, pendingLen(c))
	}
	hs.onWrite = func([]Record) {
		hs.onWrite = nil
		decide(t, c, b, lim10, 1, base+1) // during the write
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if pendingLen(c) != 0 || mustLoad(t, hs, a).State.Count != 1 || mustLoad(t, hs, b).State.Count != 1 {
		t.Fatal("second flush did not write the first batch")
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, hs, b).State.Count; got != 2 {
		t.Fatalf("change made during a write was lost: count %d", got)
	}
}

// TestFlushLoopSleepsWhileClean: with nothing dirty the flush loop does
// not run a flush (an idle node's once-a-second wake-up); a change is
// written one FlushInterval after it, then the loop sleeps again; a failed
// flush is retried every interval without new changes until it succeeds.
func TestFlushLoopSleepsWhileClean(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		hs := &hookStore{Store: newMemStore()}
		c, err := New(Config{Logger: quietLogger(), ExpiryInterval: 24 * time.Hour}, hs)
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		c.Start(ctx)
		defer c.Close(ctx)
		flushes := func() uint64 { // flushes run, written or not
			s := c.shards[0]
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.flushStarts
		}
		writes := func() int {
			hs.mu.Lock()
			defer hs.mu.Unlock()
			return len(hs.writes)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := flushes(); n != 0 {
			t.Fatalf("%d flushes in an idle hour, want 0", n)
		}
		k := Key{Name: "api", Key: "user:1"}
		decide(t, c, k, lim10, 1, time.Now().UnixNano())
		time.Sleep(DefaultFlushInterval - time.Millisecond)
		synctest.Wait()
		if n := flushes(); n != 0 {
			t.Fatalf("%d flushes before FlushInterval, want 0", n)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if n, w := flushes(), writes(); n != 1 || w != 1 {
			t.Fatalf("one interval after the change: %d flushes, %d writes, want 1 and 1", n, w)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := flushes(); n != 1 {
			t.Fatalf("%d flushes in the idle hour after it, want 1 in all", n)
		}
		first, _, _ := hs.Load(k)
		// Three failing writes: retried every interval with no new change.
		hs.mu.Lock()
		hs.failWrites = 3
		hs.mu.Unlock()
		decide(t, c, k, lim10, 1, time.Now().UnixNano())
		time.Sleep(4 * DefaultFlushInterval)
		synctest.Wait()
		if w := writes(); w != 5 {
			t.Fatalf("%d writes after 3 failures, want 5 (1 + 3 failed + 1)", w)
		}
		if rec, ok, err := hs.Load(k); err != nil || !ok || rec.Version <= first.Version {
			t.Fatalf("after the retries: %+v %v %v, want newer than %+v", rec, ok, err, first)
		}
		// The failed flushes put their entries back on the dirty lists,
		// which wakes the loop once more: one flush of nothing, then none.
		n := flushes()
		time.Sleep(time.Hour)
		synctest.Wait()
		if got := flushes(); got > n+1 {
			t.Fatalf("%d flushes in the idle hour after the retries, want at most 1", got-n)
		}
	})
}
