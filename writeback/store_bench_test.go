package writeback

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble"

	"github.com/sluicehq/sluice/bucket"
)

// engines are the Store implementations under benchmark: the pebble store
// the binary uses, and the bbolt one of the comparison in docs/store.md.
var engines = []struct {
	name string
	open func(dir string, logger *slog.Logger) (Store, error)
}{
	{"pebble", func(dir string, l *slog.Logger) (Store, error) { return openPebble(dir, l) }},
	{"bbolt", func(dir string, l *slog.Logger) (Store, error) { return openBolt(dir, l) }},
}

// benchRecords returns n records with realistic keys and states.
func benchRecords(n int, version uint64) []Record {
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{
			Key:     Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", 1_000_000+i*7919%n)},
			State:   bucket.State{Algorithm: bucket.SlidingWindow, Start: 1_700_000_000_000_000_000, Count: int64(i % 100), Prev: int64(i % 37), Expires: 1_700_000_120_000_000_000},
			Version: version,
		}
	}
	return recs
}

// dirSize returns the total size of the files under dir.
func dirSize(b *testing.B, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkStoreFlush writes n dirty states as one durable batch into a store
// that already holds those n keys (the steady state: every flush updates
// records that exist). Run the 1M case with -benchtime=1x.
func BenchmarkStoreFlush(b *testing.B) {
	for _, eng := range engines {
		for _, n := range []int{100_000, 1_000_000} {
			b.Run(fmt.Sprintf("%s/%dk", eng.name, n/1000), func(b *testing.B) {
				b.ReportAllocs()
				dir := b.TempDir()
				st, err := eng.open(dir, slog.New(slog.DiscardHandler))
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				recs := benchRecords(n, 1)
				if err := st.Write(recs); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					for j := range recs {
						recs[j].Version = uint64(i + 2)
						recs[j].State.Count++
					}
					if err := st.Write(recs); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(n), "records/op")
				b.ReportMetric(float64(dirSize(b, dir)), "diskB")
			})
		}
	}
}

// BenchmarkStoreInsert writes n new records as one batch into an empty store.
func BenchmarkStoreInsert(b *testing.B) {
	for _, eng := range engines {
		for _, n := range []int{100_000, 1_000_000} {
			b.Run(fmt.Sprintf("%s/%dk", eng.name, n/1000), func(b *testing.B) {
				b.ReportAllocs()
				recs := benchRecords(n, 1)
				var dir string
				for b.Loop() {
					b.StopTimer()
					dir = b.TempDir()
					st, err := eng.open(dir, slog.New(slog.DiscardHandler))
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if err := st.Write(recs); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := st.Close(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				b.StopTimer()
				b.ReportMetric(float64(dirSize(b, dir))/float64(n), "diskB/record")
			})
		}
	}
}

// BenchmarkStoreLoad is the point read of a cache miss: a random present key
// in a store of n records, reopened so reads come from disk structures.
func BenchmarkStoreLoad(b *testing.B) {
	for _, eng := range engines {
		for _, n := range []int{100_000, 1_000_000} {
			b.Run(fmt.Sprintf("%s/%dk", eng.name, n/1000), func(b *testing.B) {
				b.ReportAllocs()
				dir := b.TempDir()
				log := slog.New(slog.DiscardHandler)
				st, err := eng.open(dir, log)
				if err != nil {
					b.Fatal(err)
				}
				recs := benchRecords(n, 1)
				if err := st.Write(recs); err != nil {
					b.Fatal(err)
				}
				if err := st.Close(); err != nil {
					b.Fatal(err)
				}
				if st, err = eng.open(dir, log); err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				rng := rand.New(rand.NewPCG(1, 2))
				b.ResetTimer()
				for b.Loop() {
					k := recs[rng.IntN(n)].Key
					if _, ok, err := st.Load(k); !ok || err != nil {
						b.Fatal("missing", k, err)
					}
				}
			})
		}
	}
}

// BenchmarkStoreLoadAbsent is the point read of a key's first check: a key
// the store has never held, in a store of n records written as a node
// writes them, in flushes of 10,000 (so the records sit in several tables
// and levels, as on a live node). Every new key pays this read once.
func BenchmarkStoreLoadAbsent(b *testing.B) {
	for _, eng := range engines {
		for _, n := range []int{100_000, 1_000_000} {
			b.Run(fmt.Sprintf("%s/%dk", eng.name, n/1000), func(b *testing.B) {
				b.ReportAllocs()
				st, err := eng.open(b.TempDir(), slog.New(slog.DiscardHandler))
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				recs := benchRecords(n, 1)
				for i := 0; i < n; i += 10_000 {
					if err := st.Write(recs[i:min(i+10_000, n)]); err != nil {
						b.Fatal(err)
					}
				}
				rng := rand.New(rand.NewPCG(1, 2))
				b.ResetTimer()
				for b.Loop() {
					// Between two present keys in key order, so that no table's
					// key range rules it out.
					k := Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d~", 1_000_000+rng.IntN(n))}
					if _, ok, err := st.Load(k); ok || err != nil {
						b.Fatal("present", k, err)
					}
				}
			})
		}
	}
}

// TestEnginesAgree runs the same operations on every engine under
// benchmark, so that the comparison is between stores that do the same
// work: writes and overwrites, loads, a key-ordered scan, bounded expiry
// passes, and reopening.
func TestEnginesAgree(t *testing.T) {
	t.Parallel()
	const now = int64(1_700_000_060_000_000_000)
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			st, err := eng.open(dir, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			recs := benchRecords(100, 1)
			for i := range recs {
				if i%4 == 0 { // a quarter expired at now
					recs[i].State.Expires = now - 1
				}
			}
			if err := st.Write(recs); err != nil {
				t.Fatal(err)
			}
			recs[1].Version, recs[1].State.Count = 2, 99
			if err := st.Write(recs[1:2]); err != nil {
				t.Fatal(err)
			}
			if rec, ok, err := st.Load(recs[1].Key); err != nil || !ok || rec.Version != 2 || rec.State != recs[1].State {
				t.Fatalf("overwritten record: %+v %v %v", rec, ok, err)
			}
			if _, ok, err := st.Load(Key{Name: "api.create_url", Key: "absent"}); ok || err != nil {
				t.Fatalf("absent key: %v %v", ok, err)
			}
			var prev []byte
			seen := 0
			if err := st.ForEach(func(r Record) bool {
				k := appendPartKey(nil, 0, r.Key)
				if prev != nil && string(k) <= string(prev) {
					t.Fatalf("ForEach out of key order at %v", r.Key)
				}
				prev, seen = k, seen+1
				return true
			}); err != nil || seen != len(recs) {
				t.Fatalf("ForEach saw %d of %d (err %v)", seen, len(recs), err)
			}
			deleted := 0
			for range 10 { // passes of at most 30 records wrap around
				n, err := st.DeleteExpired(now, 30)
				if err != nil {
					t.Fatal(err)
				}
				deleted += n
			}
			if deleted != 25 {
				t.Fatalf("expiry deleted %d, want the 25 expired", deleted)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			st, err = eng.open(dir, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			for i, r := range recs {
				_, ok, err := st.Load(r.Key)
				if err != nil || ok != (i%4 != 0) {
					t.Fatalf("record %d after reopening: present %v (err %v)", i, ok, err)
				}
			}
		})
	}
}

// BenchmarkRangeStoredOnly: what a node pays on a ring change that moves
// partitions away or gives them a new replica when it holds more keys
// than its cache: a pass over its store, skipping the keys in memory
// (Cache.RangeStoredOnly). 100k records in the store, grouped in the
// ring's default 7919 partitions, 10k in memory. "all": every partition
// (the pass before the store was grouped); "moved=1/N": an event that
// moves one partition in N, as a join to N-1 members takes from each.
func BenchmarkRangeStoredOnly(b *testing.B) {
	recs := benchRecords(100_000, 1)
	parts := partsOf(7919)
	st, err := openPebbleParts(b.TempDir(), slog.New(slog.DiscardHandler), parts)
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Write(recs); err != nil {
		b.Fatal(err)
	}
	if err := st.db.Flush(); err != nil { // into tables, as a store that has run a while
		b.Fatal(err)
	}
	c, err := New(Config{Logger: quietLogger(), Shards: 16, Size: 10_000, FlushInterval: time.Hour}, st)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	now := recs[0].State.Start
	for _, r := range recs[:10_000] {
		if _, _, err := c.Get(hashKey(r.Key), r.Key, now); err != nil {
			b.Fatal(err)
		}
	}
	for _, every := range []int{1, 10, 100} {
		name := "all"
		var want []bool
		if every > 1 {
			name = fmt.Sprintf("moved=1/%d", every)
			want = make([]bool, parts.Count)
			for p := range want {
				want[p] = p%every == 0
			}
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				n = 0
				if err := c.RangeStoredOnly(now, hashKey, want, func(Record) bool { n++; return true }); err != nil {
					b.Fatal(err)
				}
				// 90% of the moved partitions' records are not in memory.
				if lo := 80_000 / every; n < lo {
					b.Fatalf("%d records given, want about %d", n, 90_000/every)
				}
			}
			b.ReportMetric(float64(n), "given/op")
		})
	}
}

// BenchmarkRegroupOnOpen: what the first start of a node after an upgrade
// from a store of layout 1 costs: 100k records rewritten under their
// partitions' keys (relayout) while the store opens. Each op is one open
// of a fresh copy of the layout-1 store.
func BenchmarkRegroupOnOpen(b *testing.B) {
	recs := benchRecords(100_000, 1)
	src := b.TempDir()
	db, err := openPebbleDB(src, quietLogger())
	if err != nil {
		b.Fatal(err)
	}
	batch := db.NewBatch()
	for _, r := range recs {
		_ = batch.Set(appendStoreKey(nil, r.Key), appendRecordValue(nil, r.State, r.Version), nil)
	}
	if err := batch.Commit(pebble.Sync); err != nil {
		b.Fatal(err)
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	parts := partsOf(7919)
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		st, err := openPebbleParts(dir, quietLogger(), parts)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if _, ok, err := st.Load(recs[len(recs)/2].Key); !ok || err != nil {
			b.Fatalf("a record not found after the regrouping: %v %v", ok, err)
		}
		st.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(recs)), "ns/record")
}
