package writeback

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble"

	"github.com/sluicehq/sluice/bucket"
)

// putRaw writes value under the raw store key, bypassing the encoder.
func putRaw(st Store, key, value []byte) error {
	return st.(*pebbleStore).db.Set(key, value, pebble.Sync)
}

// corruptStoreFiles overwrites the store's manifest with garbage.
func corruptStoreFiles(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifest in %s: %v", dir, err)
	}
	for _, f := range files {
		if err := os.WriteFile(f, []byte("this is not a pebble manifest"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCorruptTableSkipped: a store table whose data pebble finds corrupt
// after the store opened (a bad block on disk) is reported with its path
// and skipped: a key in it loads as missing and its check starts fresh,
// a scan goes on past the table, an expiry pass does not fail, and a
// graceful close succeeds.
// Long on purpose: one story (corrupt a table, then each reader in turn).
func TestCorruptTableSkipped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	st := openTestStore(t, dir)
	live := bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 3, Expires: base + 1e12}
	keys := func(prefix string) []Key {
		ks := make([]Key, 2000)
		for i := range ks {
			ks[i] = Key{Name: "n", Key: fmt.Sprintf("%s%04d", prefix, i)}
		}
		return ks
	}
	as, bs := keys("a"), keys("b")
	// Two tables with disjoint key ranges: the a keys, then the b keys.
	for _, ks := range [][]Key{as, bs} {
		recs := make([]Record, len(ks))
		for i, k := range ks {
			recs[i] = Record{Key: k, State: live, Version: 1}
		}
		if err := st.Write(recs); err != nil {
			t.Fatal(err)
		}
		if err := st.(*pebbleStore).db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	if len(tables) != 2 {
		t.Fatalf("want the two flushed tables, found %v", tables)
	}
	slices.Sort(tables) // the a keys' table was written first: the lower number
	b, err := os.ReadFile(tables[0])
	if err != nil {
		t.Fatal(err)
	}
	for i := 100; i < 140; i++ { // inside the first data block
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(tables[0], b, 0o600); err != nil {
		t.Fatal(err)
	}

	var logs logBuf
	st, err = OpenStore(dir, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	missing := 0
	for _, k := range as {
		_, ok, err := st.Load(k)
		if err != nil {
			t.Fatalf("Load(%v) on a corrupt table: %v", k, err)
		}
		if !ok {
			missing++
		}
	}
	if missing == 0 {
		t.Fatal("no a key was lost: the corruption did not reach the data")
	}
	for _, k := range bs {
		if _, ok, err := st.Load(k); !ok || err != nil {
			t.Fatalf("Load(%v) from the good table: ok %v err %v", k, ok, err)
		}
	}
	if !strings.Contains(logs.String(), tables[0]) {
		t.Fatalf("the log does not name the corrupt table %s:\n%s", tables[0], logs.String())
	}
	seen := map[string]bool{}
	if err := st.ForEach(func(r Record) bool { seen[r.Key.Key] = true; return true }); err != nil {
		t.Fatalf("ForEach over a corrupt table: %v", err)
	}
	for _, k := range bs {
		if !seen[k.Key] {
			t.Fatalf("ForEach stopped at the corrupt table: %v not visited (%d visited)", k, len(seen))
		}
	}
	clear(seen)
	if err := st.(PartitionScanner).ForEachIn([]bool{true}, func(r Record) bool { seen[r.Key.Key] = true; return true }); err != nil {
		t.Fatalf("ForEachIn over a corrupt table: %v", err)
	}
	for _, k := range bs {
		if !seen[k.Key] {
			t.Fatalf("ForEachIn stopped at the corrupt table: %v not visited (%d visited)", k, len(seen))
		}
	}
	if _, err := st.DeleteExpired(base, 10_000); err != nil {
		t.Fatalf("DeleteExpired over a corrupt table: %v", err)
	}

	c, err := New(Config{Logger: quietLogger()}, st)
	if err != nil {
		t.Fatal(err)
	}
	var lost Key
	for _, k := range as {
		if _, ok, _ := st.Load(k); !ok {
			lost = k
			break
		}
	}
	if d := decide(t, c, lost, lim10, 1, base); !d.Allowed() || d.Remaining != 9 {
		t.Fatalf("a check on %v, lost with the corrupt block, did not start fresh: %+v", lost, d)
	}
	if d := decide(t, c, bs[0], lim10, 1, base); d.Remaining != 6 {
		t.Fatalf("a check on %v lost its stored count: %+v", bs[0], d)
	}
	if err := c.Close(t.Context()); err != nil {
		t.Fatalf("graceful close over a corrupt table: %v", err)
	}
	st = openTestStore(t, dir)
	defer st.Close()
	if rec := mustLoad(t, st, lost); rec.State.Count != 1 {
		t.Fatalf("the fresh count of %v was not written over the lost one: %+v", lost, rec)
	}
}

// TestPebbleStartsNoDiskHealthTickers: a store that has written starts
// none of pebble's disk-health goroutines (a ticker each, every 2 s, for
// the file system and for each file written), whose only output was an
// event nobody listened to; they woke an idle node 1.5 times a second.
func TestPebbleStartsNoDiskHealthTickers(t *testing.T) {
	t.Parallel()
	st := openTestStore(t, t.TempDir())
	live := bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 1, Expires: base + 1e12}
	if err := st.Write([]Record{{Key: Key{Name: "n", Key: "k"}, State: live, Version: 1}}); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "diskHealthChecking") {
		t.Fatalf("pebble's disk-health goroutines run:\n%s", b.String())
	}
}
