package writeback

import (
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// BenchmarkDecideAllHit: checks with two limits (a per-second and a
// per-minute one) on 10k keys already in memory; both limits' counters
// live under the key's sub-keys in one shard.
func BenchmarkDecideAllHit(b *testing.B) {
	c, err := New(Config{Logger: quietLogger()}, nopStore{})
	if err != nil {
		b.Fatal(err)
	}
	lims := []bucket.Limit{
		{Algorithm: bucket.SlidingWindow, Limit: bucket.MaxLimit, WindowMS: 1_000},
		{Algorithm: bucket.SlidingWindow, Limit: bucket.MaxLimit, WindowMS: 60_000},
	}
	keys, hashes := benchKeys(10_000)
	for i, k := range keys {
		if _, err := c.DecideAll(hashes[i], k, lims, 1, base, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		j := i % len(keys)
		if _, err := c.DecideAll(hashes[j], keys[j], lims, 1, base+int64(i), 0); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
