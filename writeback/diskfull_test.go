package writeback

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/test/testsupport"
)

// mountTmpfs is testsupport.MountTmpfs.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	return testsupport.MountTmpfs(t, size)
}

// resizeTmpfs changes the size of the tmpfs mounted on dir.
func resizeTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,size="+size, dir).CombinedOutput(); err != nil {
		t.Fatalf("resize tmpfs: %v: %s", err, out)
	}
}

// fillRecords returns n records for new keys from first on.
func fillRecords(first, n int, count int64) []Record {
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{
			Key:     Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", first+i)},
			State:   bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: count, Expires: base + int64(time.Hour)},
			Version: uint64(base),
		}
	}
	return recs
}

// TestPebbleStoreRefusesWritesBeforeTheDiskFills: the store on a small disk
// refuses batches with ErrStoreFull while there is still room, instead of
// letting pebble meet ENOSPC (before the fix pebble panicked in
// rotateWAL/commit: "no space left on device"); what it wrote stays
// readable, and it writes again once the disk has room.
// Long on purpose: one story per disk size (fill, refuse, recover, reopen).
func TestPebbleStoreRefusesWritesBeforeTheDiskFills(t *testing.T) {
	t.Parallel()
	for _, size := range []string{"3m", "24m"} {
		t.Run(size, func(t *testing.T) {
			t.Parallel()
			dir := mountTmpfs(t, size)
			st, err := openPebble(dir, quietLogger())
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			t.Cleanup(func() {
				if !closed {
					st.Close()
				}
			})
			const batch = 5000
			written, refused := 0, false
			for range 100 { // 500k keys, far more than fit
				err := st.Write(fillRecords(written, batch, 1))
				if err != nil {
					if !errors.Is(err, ErrStoreFull) {
						t.Fatalf("after %d records: %v, want ErrStoreFull", written, err)
					}
					refused = true
					t.Logf("refused after %d records: %v", written, err)
					break
				}
				written += batch
			}
			if !refused {
				t.Fatalf("%d records written to a %s disk, never refused", written, size)
			}
			if free, err := freeBytes(dir); err != nil || free < 1<<20 {
				t.Errorf("free space after the refusal: %d bytes (%v), want the disk never full", free, err)
			}
			// CheckSpace refuses once less than the reserve is free. (Right
			// after the refusal it may not: pebble's background work can
			// free a WAL file meanwhile, so the disk is filled on purpose.)
			free, err := freeBytes(dir)
			if err != nil {
				t.Fatal(err)
			}
			filler := filepath.Join(dir, "filler")
			if fill := free - st.reserve/2; fill > 0 {
				if err := os.WriteFile(filler, make([]byte, fill), 0o600); err != nil {
					t.Fatalf("filling the disk: %v", err)
				}
			}
			if err := st.CheckSpace(); !errors.Is(err, ErrStoreFull) {
				t.Errorf("CheckSpace with less than the reserve free: %v, want ErrStoreFull", err)
			}
			if err := os.Remove(filler); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			for _, i := range []int{0, written / 2, written - 1} {
				if written == 0 {
					break
				}
				if rec, ok, err := st.Load(Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", i)}); err != nil || !ok || rec.State.Count != 1 {
					t.Fatalf("user:%d after the refusal: %+v %v %v", i, rec, ok, err)
				}
			}
			// Space returns: the refused batch goes in, and everything is
			// there after a reopen.
			resizeTmpfs(t, dir, "96m")
			if err := st.CheckSpace(); err != nil {
				t.Fatalf("CheckSpace with room: %v", err)
			}
			if err := st.Write(fillRecords(written, batch, 2)); err != nil {
				t.Fatalf("write with room: %v", err)
			}
			closed = true
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			st2 := openTestStore(t, dir)
			defer st2.Close()
			if rec, ok, err := st2.Load(Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", written+batch-1)}); err != nil || !ok || rec.State.Count != 2 {
				t.Fatalf("after reopen: %+v %v %v", rec, ok, err)
			}
		})
	}
}

// fullStore is a memStore whose disk can be made full: Write and
// CheckSpace then refuse with ErrStoreFull. It counts both calls.
type fullStore struct {
	*memStore
	full           atomic.Bool
	writes, checks atomic.Int64
}

func (f *fullStore) Write(recs []Record) error {
	f.writes.Add(1)
	if f.full.Load() {
		return fmt.Errorf("fullStore: %w", ErrStoreFull)
	}
	return f.memStore.Write(recs)
}

func (f *fullStore) CheckSpace() error {
	f.checks.Add(1)
	if f.full.Load() {
		return fmt.Errorf("fullStore: %w", ErrStoreFull)
	}
	return nil
}

// countLines counts the log lines containing s.
func countLines(log, s string) int {
	n := 0
	for l := range strings.Lines(log) {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// TestCacheKeepsCountingWhileTheStoreIsFull: while the store refuses
// writes, the cache keeps deciding exactly from memory, keeps every changed
// counter (also those the LRU evicts), reports the store unwritable, logs
// the failure once (and once a minute after), tries the store once per
// flush interval rather than at every eviction, and writes everything once
// the store takes writes again.
// Long on purpose: one story (full, recovered, flapping store), read top to bottom.
func TestCacheKeepsCountingWhileTheStoreIsFull(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		fs := &fullStore{memStore: newMemStore()}
		var logs logBuf
		c, err := New(Config{Shards: 4, Size: 256, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, fs)
		if err != nil {
			t.Fatal(err)
		}
		c.Start(t.Context())
		defer c.Close(t.Context())
		keys := make([]Key, 5000)
		for i := range keys {
			keys[i] = Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", i)}
		}
		fs.full.Store(true)
		now := time.Now().UnixNano()
		// 5000 keys through a cache of 256: evicted changed counters wait
		// in memory, and ask for early flushes all along.
		for round := range 3 {
			for _, k := range keys {
				if d := decide(t, c, k, lim10, 1, now); !d.Allowed() || d.Remaining != int64(10-round-1) {
					t.Fatalf("round %d %v: %+v", round, k, d)
				}
			}
			time.Sleep(DefaultFlushInterval)
			synctest.Wait()
		}
		if st := c.StoreState(); st.Writable || !errors.Is(st.Err, ErrStoreFull) || st.FailedFlushes == 0 {
			t.Fatalf("store state while full: %+v", st)
		}
		if n := c.Dirty(); n != len(keys) {
			t.Fatalf("unflushed %d, want %d", n, len(keys))
		}
		// One copy of the dirty entries was offered to the store; after
		// that a free-space check per interval, not one flush per eviction.
		writes, checks := fs.writes.Load(), fs.checks.Load()
		if writes != 1 || checks > 3 {
			t.Fatalf("%d writes and %d space checks in 3 flush intervals, want 1 write and at most 3 checks", writes, checks)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		log := logs.String()
		if n := countLines(log, "store is not writable"); n != 1 {
			t.Fatalf("%d lines about the failure, want 1:\n%s", n, log)
		}
		if n := countLines(log, "store still not writable"); n < 1 || n > 2 {
			t.Fatalf("%d reminders in 2 minutes, want 1 or 2:\n%s", n, log)
		}
		if st := c.Stats(); st.FlushErrors < 100 {
			t.Fatalf("flush errors %d after 2 minutes of 1 s intervals", st.FlushErrors)
		}
		// Counts from memory are exact, for keys in the LRU and evicted ones.
		for _, k := range keys {
			if rec, ok, err := c.Get(hashKey(k), k, now); err != nil || !ok || rec.State.Count != 3 {
				t.Fatalf("%v while full: %+v %v %v", k, rec, ok, err)
			}
		}

		// Space returns: the next interval writes every counter.
		fs.full.Store(false)
		time.Sleep(DefaultFlushInterval)
		synctest.Wait()
		if st := c.StoreState(); !st.Writable || st.Err != nil {
			t.Fatalf("store state after recovery: %+v", st)
		}
		if n := c.Dirty(); n != 0 {
			t.Fatalf("unflushed after recovery: %d", n)
		}
		for _, k := range keys {
			if rec := mustLoad(t, fs, k); rec.State.Count != 3 {
				t.Fatalf("%v stored %+v", k, rec)
			}
		}
		errs := c.Stats().FlushErrors
		time.Sleep(5 * DefaultFlushInterval)
		synctest.Wait()
		if got := c.Stats().FlushErrors; got != errs {
			t.Fatalf("flush errors grew after recovery: %d → %d", errs, got)
		}
		if n := countLines(logs.String(), "store writable again"); n != 1 {
			t.Fatalf("%d recovery lines, want 1:\n%s", n, logs.String())
		}

		// A store flapping at the edge of its reserve (full every other
		// interval for 20 s) is logged once, not at every change.
		for i := range 20 {
			fs.full.Store(i%2 == 0)
			decide(t, c, keys[i], lim10, 1, now)
			time.Sleep(DefaultFlushInterval)
			synctest.Wait()
		}
		log = logs.String()
		if down, up := countLines(log, "store is not writable"), countLines(log, "store writable again"); down != 2 || up != 2 {
			t.Fatalf("flapping: %d failure and %d recovery lines in all, want 2 and 2:\n%s", down, up, log)
		}
	})
}

// TestCacheOverFullPebbleStore: the cache over the real store on a small
// disk: checks keep being decided while flushes are refused, and after the
// disk grows a flush writes every counter and a reopened store has them.
func TestCacheOverFullPebbleStore(t *testing.T) {
	t.Parallel()
	dir := mountTmpfs(t, "24m")
	st, err := openPebble(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuf
	c, err := New(Config{Size: 10_000, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, st)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	var once sync.Once
	closeCache := func() error {
		err := ErrClosed
		once.Do(func() { err = c.Close(t.Context()) })
		return err
	}
	t.Cleanup(func() { closeCache() })
	now := time.Now().UnixNano()
	n := 0
	for ; n < 500_000; n += 10_000 {
		for i := n; i < n+10_000; i++ {
			k := Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", i)}
			decide(t, c, k, lim10, 2, now)
		}
		if err := c.Flush(t.Context()); err != nil {
			if !errors.Is(err, ErrStoreFull) {
				t.Fatalf("flush: %v", err)
			}
			break
		}
	}
	if c.StoreState().Writable || n == 0 {
		t.Fatalf("%d keys flushed to a 24 MB disk before the first refusal (state %+v)", n, c.StoreState())
	}
	refusedAt := n
	for i := n + 10_000; i < n+20_000; i++ { // more keys while full
		decide(t, c, Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", i)}, lim10, 2, now)
	}
	n += 20_000
	if err := c.Flush(t.Context()); !errors.Is(err, ErrStoreFull) {
		t.Fatalf("flush while full: %v", err)
	}
	if d := c.Dirty(); d < 20_000 {
		t.Fatalf("unflushed %d while full, want at least 20000", d)
	}
	t.Logf("refused after %d keys; %d unflushed", refusedAt, c.Dirty())
	resizeTmpfs(t, dir, "128m")
	if err := c.Flush(t.Context()); err != nil {
		t.Fatalf("flush after the disk grew: %v", err)
	}
	if d := c.Dirty(); d != 0 || !c.StoreState().Writable {
		t.Fatalf("after the disk grew: unflushed %d, state %+v", d, c.StoreState())
	}
	if err := closeCache(); err != nil {
		t.Fatal(err)
	}
	st2 := openTestStore(t, dir)
	defer st2.Close()
	for _, i := range []int{0, refusedAt - 1, refusedAt, n - 1} {
		k := Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", i)}
		if rec := mustLoad(t, st2, k); rec.State.Count != 2 {
			t.Fatalf("%v after reopen: %+v", k, rec)
		}
	}
	if got := countLines(logs.String(), "store is not writable"); got != 1 {
		t.Fatalf("%d failure lines, want 1:\n%s", got, logs.String())
	}
}
