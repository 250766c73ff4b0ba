package writeback

import (
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// engines are the Store implementations under benchmark. docs/store.md has
// the numbers of the bbolt implementation this list also held when pebble
// was chosen.
var engines = []struct {
	name string
	open func(dir string, logger *slog.Logger) (Store, error)
}{
	{"pebble", func(dir string, l *slog.Logger) (Store, error) { return openPebble(dir, l) }},
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
