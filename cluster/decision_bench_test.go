package cluster_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// BenchmarkOwnerDecision is the decision on the owner as the issue names
// it: hash the key, route it through the owner table of a 3-member ring,
// then the cache (shard lock, LRU, algorithm) for a key this member owns,
// a sliding window, every key already in memory. With 10k keys the cache
// fits the CPU's caches; with 1M (the default --cache-size) most lookups
// miss them, as on a busy node. The clock is an input here, as in a batch;
// BenchmarkNodeCheckOwner measures the whole Node.Check around it.
func BenchmarkOwnerDecision(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprint("keys=", n), func(b *testing.B) { benchOwnerDecision(b, n) })
	}
}

func benchOwnerDecision(b *testing.B, n int) {
	tbl, err := ring.BuildTable(ring.DefaultConfig(), []ring.Member{{Name: "a", Addr: "a:1"}, {Name: "b", Addr: "b:1"}, {Name: "c", Addr: "c:1"}})
	if err != nil {
		b.Fatal(err)
	}
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := writeback.OpenStore(b.TempDir(), lg)
	if err != nil {
		b.Fatal(err)
	}
	// Room for every key in every shard: this measures hits, not evictions.
	c, err := writeback.New(writeback.Config{Logger: lg, Size: n * 5 / 4}, store)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	var keys []writeback.Key
	for i := 0; len(keys) < n; i++ {
		k := writeback.Key{Name: "api", Key: fmt.Sprint("user:", i)}
		if o, _ := tbl.Owner(ring.Hash(k.Name, k.Key)); o.Name == "a" {
			keys = append(keys, k)
		}
	}
	// Visit the keys in a shuffled order, not their order of insertion:
	// real traffic does not walk memory in the order it was allocated.
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	lim := bucket.Limit{Limit: 1 << 40, WindowMS: 60_000}
	now := int64(1_800_000_000_000_000_000)
	var d bucket.Decision
	for _, k := range keys {
		if err := c.DecideTo(&d, ring.Hash(k.Name, k.Key), k, &lim, 1, now, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i == len(keys) {
			i = 0
		}
		k := keys[i]
		h := ring.Hash(k.Name, k.Key)
		if o, ok := tbl.Owner(h); !ok || o.Name != "a" {
			b.Fatal("not the owner")
		}
		now += 1000
		if err := c.DecideTo(&d, h, k, &lim, 1, now, 1); err != nil || !d.Allowed() {
			b.Fatal(d, err)
		}
	}
}
