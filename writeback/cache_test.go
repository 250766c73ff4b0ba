package writeback

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
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

// TestFlush: decisions, one Flush, then the store (reopened) has the states
// with their versions.
func TestFlush(t *testing.T) {
	t.Parallel()
	c, dir := newTestCache(t, Config{Shards: 4, Size: 100})
	a, b := Key{"api.create_url", "user:1"}, Key{"api.create_url", "user:2"}
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

// TestEvictThenReload: an evicted dirty entry waits in pending, is found
// there by a miss, is written by the next flush and reloads from the store
// with the same count.
func TestEvictThenReload(t *testing.T) {
	t.Parallel()
	hs := &hookStore{Store: openTestStore(t, t.TempDir())}
	c, err := New(Config{Shards: 1, Size: 2, Logger: quietLogger()}, hs)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	k1, k2, k3 := Key{"n", "1"}, Key{"n", "2"}, Key{"n", "3"}
	for range 3 {
		decide(t, c, k1, lim10, 1, base)
	}
	decide(t, c, k2, lim10, 1, base)
	decide(t, c, k3, lim10, 1, base) // evicts k1
	if c.Len() != 2 || pendingLen(c) != 1 || c.Stats().Evictions != 1 {
		t.Fatalf("len %d pending %d stats %+v", c.Len(), pendingLen(c), c.Stats())
	}
	// A miss finds k1 in pending, not in the (empty) store.
	loads := c.Stats().Loads
	if rec, ok, err := c.Get(hashKey(k1), k1, base); err != nil || !ok || rec.State.Count != 3 {
		t.Fatalf("Get from pending: %+v %v %v", rec, ok, err)
	}
	if c.Stats().Loads != loads {
		t.Fatalf("the miss read the store: %+v", c.Stats())
	}
	// k1 is back in the LRU; k2 went to pending. Flush writes all three and
	// empties pending.
	if pendingLen(c) != 1 {
		t.Fatalf("pending %d, want 1", pendingLen(c))
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if pendingLen(c) != 0 {
		t.Fatalf("pending %d after flush", pendingLen(c))
	}
	if got := len(hs.writes[0]); got != 3 {
		t.Fatalf("flush wrote %d records, want 3", got)
	}
	// Evict k1 again (clean now: dropped), reload it from the store.
	decide(t, c, k2, lim10, 0, base)
	decide(t, c, k3, lim10, 0, base)
	if pendingLen(c) != 0 || c.Len() != 2 {
		t.Fatal("a clean entry went to pending")
	}
	loads = c.Stats().Loads
	d := decide(t, c, k1, lim10, 1, base)
	if d.Remaining != 6 || c.Stats().Loads != loads+1 {
		t.Fatalf("reload: %+v stats %+v", d, c.Stats())
	}
}

// TestEvictExpiredDropped: an evicted dirty entry that is already fresh is
// not kept.
func TestEvictExpiredDropped(t *testing.T) {
	t.Parallel()
	c, err := New(Config{Shards: 1, Size: 1, Logger: quietLogger()}, nopStore{})
	if err != nil {
		t.Fatal(err)
	}
	decide(t, c, Key{"n", "1"}, lim10, 1, base)
	later := base + 3*int64(time.Minute) // past Expires
	decide(t, c, Key{"n", "2"}, lim10, 1, later)
	if pendingLen(c) != 0 {
		t.Fatal("expired entry kept in pending")
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.FlushedRecords != 1 {
		t.Fatalf("flushed %d records, want only the live one", st.FlushedRecords)
	}
}

// TestRestartReload: Close, reopen store and cache, and the count goes on.
func TestRestartReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	lim := bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 5, WindowMS: 60_000}
	k := Key{"api.create_url", "user:7"}
	c := newCacheAt(t, Config{}, dir)
	for range 4 {
		decide(t, c, k, lim, 1, base)
	}
	old, _, _ := c.Get(hashKey(k), k, base)
	if err := c.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Decide(hashKey(k), k, lim, 1, base); !errors.Is(err, ErrClosed) {
		t.Fatalf("Decide after Close: %v", err)
	}
	if err := c.Flush(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close: %v", err)
	}

	c = newCacheAt(t, Config{}, dir)
	if d := decide(t, c, k, lim, 1, base+1); !d.Allowed() || d.Remaining != 0 {
		t.Fatalf("5th hit after restart: %+v", d)
	}
	if d := decide(t, c, k, lim, 1, base+2); d.Allowed() {
		t.Fatalf("6th hit after restart allowed: %+v", d)
	}
	rec, ok, err := c.Get(hashKey(k), k, base+2)
	if err != nil || !ok || rec.Version <= old.Version || rec.State.Count != 5 {
		t.Fatalf("after restart: %+v (before %+v) %v %v", rec, old, ok, err)
	}
}

// TestCloseFlushesPending: Close writes dirty and pending entries.
func TestCloseFlushesPending(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := newCacheAt(t, Config{Shards: 1, Size: 1}, dir)
	a, b := Key{"n", "a"}, Key{"n", "b"}
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

// TestFreshRecordIsAbsent: a stored record whose state has expired counts as
// absent, but the version keeps growing.
func TestFreshRecordIsAbsent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	st := openTestStore(t, dir)
	k := Key{"n", "k"}
	old := bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 10, Expires: base + 2*int64(time.Minute)}
	if err := st.Write([]Record{{Key: k, State: old, Version: uint64(base + 99)}}); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Logger: quietLogger()}, st)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	later := base + 5*int64(time.Minute)
	if _, ok, err := c.Get(hashKey(k), k, later); ok || err != nil {
		t.Fatalf("expired record present: %v %v", ok, err)
	}
	if d := decide(t, c, k, lim10, 1, base+int64(time.Second)); d.Allowed() {
		t.Fatal("live record ignored")
	}
	st2 := openTestStore(t, t.TempDir())
	if err := st2.Write([]Record{{Key: k, State: old, Version: uint64(later + 99)}}); err != nil {
		t.Fatal(err)
	}
	c3, err := New(Config{Logger: quietLogger()}, st2)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close(t.Context())
	if d := decide(t, c3, k, lim10, 1, later); !d.Allowed() || d.Remaining != 9 {
		t.Fatalf("expired record not fresh: %+v", d)
	}
	if rec, _, _ := c3.Get(hashKey(k), k, later); rec.Version != uint64(later+100) {
		t.Fatalf("version %d, want %d", rec.Version, later+100)
	}
}

// TestCorruptRecordSkipped: corrupt values written through the engine are
// logged with the path and key, counted and treated as absent.
func TestCorruptRecordSkipped(t *testing.T) {
	t.Parallel()
	good := appendRecordValue(nil, bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 3, Expires: base + 1e12}, 5)
	badFormat := append([]byte(nil), good...)
	badFormat[0] = 9
	badState := append([]byte(nil), good...)
	badState[9] = 77 // bucket.State encoding version
	cases := map[string][]byte{
		"checksum":  append(append([]byte(nil), good[:len(good)-1]...), good[len(good)-1]^1),
		"truncated": good[:20],
		"empty":     {},
		"format":    resealRecord(badFormat), // right checksum, wrong content
		"state":     resealRecord(badState),
	}
	for name, value := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			var logs logBuf
			st, err := OpenStore(dir, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			k := Key{"api.create_url", "user:corrupt"}
			if err := putRaw(st, appendStoreKey(nil, k), value); err != nil {
				t.Fatal(err)
			}
			if rec, ok, err := st.Load(k); ok || err != nil || rec != (Record{}) {
				t.Fatalf("Load of corrupt record: %+v %v %v", rec, ok, err)
			}
			if !strings.Contains(logs.String(), dir) || !strings.Contains(logs.String(), "user:corrupt") {
				t.Fatalf("log does not name path and key: %s", logs.String())
			}
			c, err := New(Config{Logger: quietLogger()}, st)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(t.Context())
			if d := decide(t, c, k, lim10, 1, base); !d.Allowed() || d.Remaining != 9 {
				t.Fatalf("cache did not start fresh: %+v", d)
			}
			if got := c.Stats().CorruptRecords; got != 2 {
				t.Fatalf("corrupt records %d, want 2 (Load and the miss)", got)
			}
			n := 0
			if err := st.ForEach(func(Record) bool { n++; return true }); err != nil || n != 0 {
				t.Fatalf("ForEach returned %d records, err %v", n, err)
			}
		})
	}
}

// resealRecord recomputes the checksum of a stored value.
func resealRecord(v []byte) []byte {
	body := append([]byte(nil), v[:len(v)-4]...)
	return binary.BigEndian.AppendUint32(body, crc32.Checksum(body, castagnoli))
}

// TestOpenStoreBadPath: an unopenable or corrupt store names its path.
func TestOpenStoreBadPath(t *testing.T) {
	t.Parallel()
	t.Run("file", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "notadir")
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := OpenStore(path, quietLogger())
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("error %v does not name %s", err, path)
		}
	})
	t.Run("held by another process", func(t *testing.T) {
		t.Parallel()
		dir, k := t.TempDir(), Key{"n", "k"}
		st := openWithRecord(t, dir, k)
		_, err := OpenStore(dir, quietLogger())
		if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("second open: error %v does not say %s is in use", err, dir)
		}
		// Its files were not moved aside: the first store still reads.
		if aside, _ := filepath.Glob(filepath.Join(dir, asidePrefix+"*")); len(aside) != 0 {
			t.Fatalf("a store in use was moved aside: %v", aside)
		}
		if rec := mustLoad(t, st, k); rec.Version != 1 {
			t.Fatalf("record after the refused open: %+v", rec)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// openWithRecord opens the store in dir and writes k at version 1.
func openWithRecord(t *testing.T, dir string, k Key) Store {
	t.Helper()
	st := openTestStore(t, dir)
	if err := st.Write([]Record{{Key: k, Version: 1}}); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestOpenStoreMovesUnreadableFilesAside: a store whose files cannot be
// read (here a garbled manifest) is reported with its path, its files are
// kept in a directory beside, and the node starts with an empty store that
// works.
func TestOpenStoreMovesUnreadableFilesAside(t *testing.T) {
	t.Parallel()
	dir, k := t.TempDir(), Key{"n", "k"}
	if err := openWithRecord(t, dir, k).Close(); err != nil {
		t.Fatal(err)
	}
	corruptStoreFiles(t, dir)
	var log strings.Builder
	st2, err := OpenStore(dir, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatalf("open of a store with unreadable files: %v", err)
	}
	aside, _ := filepath.Glob(filepath.Join(dir, asidePrefix+"*", "MANIFEST-*"))
	if len(aside) == 0 {
		t.Fatal("the unreadable files were not kept")
	}
	if _, err := os.Stat(filepath.Join(dir, lockName)); err != nil {
		t.Fatalf("the lock file was moved: %v", err)
	}
	if !strings.Contains(log.String(), dir) || !strings.Contains(log.String(), filepath.Dir(aside[0])) {
		t.Fatalf("the log does not name %s and where its files went:\n%s", dir, log.String())
	}
	if _, ok, err := st2.Load(k); ok || err != nil {
		t.Fatalf("the fresh store holds %v (err %v)", k, err)
	}
	if err := st2.Write([]Record{{Key: k, Version: 2}}); err != nil {
		t.Fatal(err)
	}
	if err := st2.Close(); err != nil {
		t.Fatal(err)
	}
	// The new store reopens with the moved-aside directory inside it.
	st3 := openTestStore(t, dir)
	if rec := mustLoad(t, st3, k); rec.Version != 2 {
		t.Fatalf("after reopening: %+v", rec)
	}
	if err := st3.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestExpiryDeletion: expired and corrupt records are deleted in bounded
// passes; live ones stay.
func TestExpiryDeletion(t *testing.T) {
	t.Parallel()
	st := openTestStore(t, t.TempDir())
	c, err := New(Config{ExpiryBatch: 3, Logger: quietLogger()}, st)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	var recs []Record
	for i := range 10 {
		exp := base + 1000 // expired at base+1000
		if i%2 == 0 {
			exp = base + 1e12 // live
		}
		recs = append(recs, Record{Key: Key{"n", fmt.Sprint(i)}, Version: 1,
			State: bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 1, Expires: exp}})
	}
	if err := st.Write(recs); err != nil {
		t.Fatal(err)
	}
	if err := putRaw(st, []byte("n\x00junk"), []byte("junk")); err != nil {
		t.Fatal(err)
	}
	if n, err := st.DeleteExpired(base+1000, 3); err != nil || n > 3 {
		t.Fatalf("one pass of 3 deleted %d (err %v)", n, err)
	}
	for range 4 { // 11 records, 3 per pass: 4 passes cover them all
		c.expire(base + 1000)
	}
	if got := c.Stats().ExpiredDeleted; got < 1 {
		t.Fatalf("expired deleted %d", got)
	}
	var left []string
	if err := st.ForEach(func(r Record) bool { left = append(left, r.Key.Key); return true }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(left, ",") != "0,2,4,6,8" {
		t.Fatalf("left %v, want the live ones", left)
	}
	if _, ok, _ := st.Load(Key{"n", "junk"}); ok {
		t.Fatal("corrupt record not deleted")
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
		k := Key{"api.create_url", "user:9"}
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
		k := Key{"api", "user:1"}
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
			decide(t, c, Key{"api", fmt.Sprint("churn:", i)}, lim10, 1, now)
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
			k := Key{"api", fmt.Sprint("churn:", i)}
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
	a, b := Key{"n", "a"}, Key{"n", "b"}
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

// TestMerge: a newer version is installed and written, an older one is not,
// also when the newer one is only in the store.
func TestMerge(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 1})
	k, other := Key{"n", "k"}, Key{"n", "other"}
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
				k := Key{"api.create_url", fmt.Sprintf("user:%d", ki)}
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
	k := Key{"api.create_url", "user:1234567"}
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
		decide(t, c, Key{name, fmt.Sprint(i)}, lim10, 1, base)
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
	keys := []Key{{"api", "a"}, {"api", "b"}, {"api", "c"}, {"other", "a"}}
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
	keys := []Key{{"x", "a"}, {"x", "b"}, {"x", "c"}}
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

// A key released after a pull began stays released: AdoptUnlessReleasedSince
// neither installs the pulled record nor ends the release. One released
// before keeps Adopt's behaviour.
func TestAdoptUnlessReleasedSince(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 8})
	k := Key{"n", "k"}
	h := hashKey(k)
	decide(t, c, k, lim10, 3, base)
	// Released at base+10; a pull that began at base+5 comes back.
	if _, _, err := c.Release(h, k, base+10, time.Minute); err != nil {
		t.Fatal(err)
	}
	rec := Record{Key: k, State: bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 1, Expires: base + int64(time.Hour)}, Version: uint64(base + 20)}
	if c.AdoptUnlessReleasedSince(h, rec, base+5) {
		t.Fatal("adopted a record over a release made after the pull began")
	}
	if !c.Released(h, k, base+30) {
		t.Fatal("the release made after the pull began was ended")
	}
	// A pull that began after the release: the usual adoption.
	if !c.AdoptUnlessReleasedSince(h, rec, base+15) {
		t.Fatal("did not adopt over a release made before the pull began")
	}
	if c.Released(h, k, base+30) {
		t.Fatal("the adoption did not end the older release")
	}
	if got, ok, _ := c.Get(h, k, base+30); !ok || got.State.Count != 1 || got.Version != rec.Version {
		t.Fatalf("held %+v", got)
	}
}

// Two copies of a fixed-window counter that diverged (the two sides of a
// healed partition each decided the key): installing the other copy never
// lowers the count of the window held, whatever the versions say, so the
// merged counter has seen every hit either side admitted. A newer version
// with the lower count used to win (last writer wins): the owner that had
// admitted the limit then admitted again (test/faults: 21 for a promise of
// 20).
func TestInstallKeepsLargerFixedWindowCount(t *testing.T) {
	t.Parallel()
	fw := bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 10, WindowMS: 3_600_000}
	for _, tc := range []struct {
		name    string
		install func(c *Cache, h uint64, rec Record) bool
	}{
		{"Adopt", (*Cache).Adopt},
		{"Merge", (*Cache).Merge},
		{"AdoptUnlessReleasedSince", func(c *Cache, h uint64, rec Record) bool {
			return c.AdoptUnlessReleasedSince(h, rec, base)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, _ := newTestCache(t, Config{Shards: 1, Size: 8})
			k := Key{"n", "k"}
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
