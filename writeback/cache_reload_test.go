package writeback

// Tests of reading the store back: reloads after eviction and restart,
// expired, fresh and corrupt records, opening a bad or unreadable store, and
// the deletion of expired records.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

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
	k1, k2, k3 := Key{Name: "n", Key: "1"}, Key{Name: "n", Key: "2"}, Key{Name: "n", Key: "3"}
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
	decide(t, c, Key{Name: "n", Key: "1"}, lim10, 1, base)
	later := base + 3*int64(time.Minute) // past Expires
	decide(t, c, Key{Name: "n", Key: "2"}, lim10, 1, later)
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
	k := Key{Name: "api.create_url", Key: "user:7"}
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

// TestFreshRecordIsAbsent: a stored record whose state has expired counts as
// absent, but the version keeps growing.
func TestFreshRecordIsAbsent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	st := openTestStore(t, dir)
	k := Key{Name: "n", Key: "k"}
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
			k := Key{Name: "api.create_url", Key: "user:corrupt"}
			if err := putRaw(st, appendPartKey(nil, 0, k), value); err != nil {
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
		dir, k := t.TempDir(), Key{Name: "n", Key: "k"}
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
	dir, k := t.TempDir(), Key{Name: "n", Key: "k"}
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
		recs = append(recs, Record{Key: Key{Name: "n", Key: fmt.Sprint(i)}, Version: 1,
			State: bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 1, Expires: exp}})
	}
	if err := st.Write(recs); err != nil {
		t.Fatal(err)
	}
	if err := putRaw(st, appendPartKey(nil, 0, Key{Name: "n", Key: "junk"}), []byte("junk")); err != nil {
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
	if _, ok, _ := st.Load(Key{Name: "n", Key: "junk"}); ok {
		t.Fatal("corrupt record not deleted")
	}
}
