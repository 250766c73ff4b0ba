package writeback

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

var benchLim = bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: bucket.MaxLimit, WindowMS: 60_000}

func benchKeys(n int) ([]Key, []uint64) {
	keys := make([]Key, n)
	hashes := make([]uint64, n)
	for i := range keys {
		keys[i] = Key{Name: "api.create_url", Key: fmt.Sprintf("user:%d", 1_000_000+i)}
		hashes[i] = hashKey(keys[i])
	}
	return keys, hashes
}

// BenchmarkDecideHit: checks on 10k keys already in memory.
func BenchmarkDecideHit(b *testing.B) {
	c, err := New(Config{Logger: quietLogger()}, nopStore{})
	if err != nil {
		b.Fatal(err)
	}
	keys, hashes := benchKeys(10_000)
	for i, k := range keys {
		if _, err := c.Decide(hashes[i], k, benchLim, 1, base); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			j := i % len(keys)
			if _, err := c.Decide(hashes[j], keys[j], benchLim, 1, base+int64(i)); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var seed atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(seed.Add(7919))
			for pb.Next() {
				j := i % len(keys)
				if _, err := c.Decide(hashes[j], keys[j], benchLim, 1, base+int64(i)); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
}

// benchPartitions is the ring's default partition count, for the caches
// that list their keys by partition as a node's does.
const benchPartitions = 7919

func withPartitions(cfg Config) Config {
	cfg.Partitions, cfg.PartitionOf = benchPartitions, func(h uint64) int { return int(h % benchPartitions) }
	return cfg
}

// BenchmarkDecideMiss: every check misses memory. "absent": the store does
// not have the key (a new counter), and every miss evicts a key;
// "absent/partitions" is the same with the keys listed by partition
// (Config.Partitions), as a node's cache does; "stored": the key is loaded
// from a pebble store of 100k records through a 1024-entry cache.
func BenchmarkDecideMiss(b *testing.B) {
	absent := func(b *testing.B, cfg Config) {
		b.ReportAllocs()
		c, err := New(cfg, nopStore{})
		if err != nil {
			b.Fatal(err)
		}
		keys, hashes := benchKeys(1 << 20)
		i := 0
		for b.Loop() {
			j := i % len(keys)
			if _, err := c.Decide(hashes[j], keys[j], benchLim, 1, base); err != nil {
				b.Fatal(err)
			}
			i++
			if i%(1<<16) == 0 { // as the flush loop would: evicted entries leave pending
				if err := c.Flush(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	cfg := Config{Shards: 64, Size: 1 << 16, Logger: quietLogger()}
	b.Run("absent", func(b *testing.B) { absent(b, cfg) })
	b.Run("absent/partitions", func(b *testing.B) { absent(b, withPartitions(cfg)) })
	b.Run("stored", func(b *testing.B) {
		b.ReportAllocs()
		dir := b.TempDir()
		st := openTestStore(b, dir)
		recs := benchRecords(100_000, 1)
		if err := st.Write(recs); err != nil {
			b.Fatal(err)
		}
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		c, err := New(Config{Shards: 16, Size: 1024, Logger: quietLogger()}, openTestStore(b, dir))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close(context.Background())
		hashes := make([]uint64, len(recs))
		for i := range recs {
			hashes[i] = hashKey(recs[i].Key)
		}
		i := 0
		for b.Loop() {
			j := (i * 7919) % len(recs)
			if _, err := c.Decide(hashes[j], recs[j].Key, benchLim, 0, base); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.StopTimer()
		if st := c.Stats(); st.Loads < uint64(b.N)/2 {
			b.Fatalf("only %d loads for %d checks", st.Loads, b.N)
		}
	})
}

// BenchmarkHeapPerKey measures the heap held per live key after 1M keys
// went through a cache of Size 1M (run with -benchtime=1x): dirtyHeapB/key
// right after filling (dirty lists and pending entries included),
// heapB/key after a flush emptied them, and rssB/key, the growth of the
// process's resident memory (Linux; after returning free memory to the
// OS). The caller's key strings are allocated before and not counted; the
// cache's own copies are. "partitions" lists the keys by partition, as a
// node's cache does.
func BenchmarkHeapPerKey(b *testing.B) {
	cfg := Config{Shards: 64, Size: 1_000_000, Logger: quietLogger()}
	b.Run("plain", func(b *testing.B) { heapPerKey(b, cfg) })
	b.Run("partitions", func(b *testing.B) { heapPerKey(b, withPartitions(cfg)) })
}

func heapPerKey(b *testing.B, cfg Config) {
	b.ReportAllocs()
	const n = 1_000_000
	keys, hashes := benchKeys(n)
	var c *Cache
	var dirty, flushed, rss float64
	for b.Loop() {
		c = nil
		debug.FreeOSMemory()
		rssBefore := residentBytes()
		var before, mid, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var err error
		c, err = New(cfg, nopStore{})
		if err != nil {
			b.Fatal(err)
		}
		for i, k := range keys {
			if _, err := c.Decide(hashes[i], k, benchLim, 1, base); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&mid)
		if err := c.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		// Shards fill unevenly, so a little under n stay live.
		live := float64(c.Len())
		if live < 0.99*n {
			b.Fatalf("only %v of %d keys live", live, n)
		}
		dirty = float64(mid.HeapAlloc-before.HeapAlloc) / live
		flushed = float64(after.HeapAlloc-before.HeapAlloc) / live
		debug.FreeOSMemory()
		rss = float64(residentBytes()-rssBefore) / live
	}
	runtime.KeepAlive(c)
	runtime.KeepAlive(keys)
	b.ReportMetric(flushed, "heapB/key")
	b.ReportMetric(dirty, "dirtyHeapB/key")
	if rss > 0 {
		b.ReportMetric(rss, "rssB/key")
	}
}

// residentBytes returns the process's resident set size from
// /proc/self/statm, or 0 where that is not available.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// BenchmarkReplicaCopy: what a replica pays per copy of a key it does not
// decide (Merge), against a check of a key in memory (Decide), both on a
// pebble store: 10k keys, each copy newer than the last, and a flush
// after every round of 10k copies, as the flush loop would. Without
// Copies (merge) a copy waits in pending only until the next flush, then
// only the store holds it, so every copy after the first reads the store;
// with them (merge-held) the copies stay in memory. The flush's cost is
// in the figure.
func BenchmarkReplicaCopy(b *testing.B) {
	keys, hashes := benchKeys(10_000)
	st := bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 1, Expires: base + 120e9}
	merge := func(c *Cache, j int, v uint64) error {
		s := st
		s.Count = int64(v)
		c.Merge(hashes[j], Record{Key: keys[j], State: s, Version: v})
		return nil
	}
	for _, bc := range []struct {
		name   string
		copies int // Config.Copies
		op     func(c *Cache, j int, v uint64) error
	}{
		{"merge", 0, merge},                  // each copy after its write reads the store
		{"merge-held", DefaultCopies, merge}, // copies stay in memory after their write
		{"decide", 0, func(c *Cache, j int, v uint64) error {
			_, err := c.Decide(hashes[j], keys[j], benchLim, 1, base)
			return err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			c, err := New(Config{Logger: quietLogger(), FlushInterval: time.Hour, Copies: bc.copies}, openTestStore(b, b.TempDir()))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(context.Background())
			i := 0
			for b.Loop() {
				j := i % len(keys)
				if err := bc.op(c, j, uint64(i+1)); err != nil {
					b.Fatal(err)
				}
				i++
				if j == len(keys)-1 {
					if err := c.Flush(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
