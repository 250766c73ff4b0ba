package cluster

import (
	"context"
	"fmt"
	"testing"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// BenchmarkMembershipEvent is a microbenchmark of what one node does when
// one member of a cluster of n joins or leaves (alternately): the
// rebuild (the ring's new table, the moves, the leases and grant records
// of the moved keys) and the handoff job it queues, run here in line
// (the keys whose partitions moved away released; the push to their new
// owners fails at once, as no peer answers). The node decides 10,000
// keys of its own; at 10 members it runs again with 100,000, to show what
// an event's walk of the keys in memory costs. At 1,000 members it runs
// again with 65,521 partitions and load 1.25 (--ring-partitions,
// --ring-load; docs/ring.md), whose events walk 8 times as many
// partitions.
func BenchmarkMembershipEvent(b *testing.B) {
	large := ring.DefaultConfig()
	large.Partitions, large.Load = 65521, 1.25 // docs/ring.md's settings past 500 members
	for _, tc := range []struct {
		n, keys int
		ring    ring.Config
	}{
		{10, 10_000, ring.DefaultConfig()}, {10, 100_000, ring.DefaultConfig()}, {100, 10_000, ring.DefaultConfig()},
		{1000, 10_000, ring.DefaultConfig()}, {1000, 10_000, large},
	} {
		n := tc.n
		name := fmt.Sprintf("members=%d", n)
		if tc.keys != 10_000 {
			name += fmt.Sprintf("/keys=%d", tc.keys)
		}
		if tc.ring.Partitions != ring.DefaultConfig().Partitions {
			name += fmt.Sprintf("/partitions=%d", tc.ring.Partitions)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			cfg := NodeConfig(b, "sluice-0000", "127.0.0.1:1")
			cfg.Ring = tc.ring
			cfg.MoveWindow = 1 // moves end at once: a long run keeps none
			node, err := New(cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = node.cache.Close(context.Background()) })
			node.ml.Store(&memberlist.Memberlist{}) // rebuild reads the roster only
			node.life.alone()
			member := func(i int) memberInfo {
				name := fmt.Sprintf("sluice-%04d", i)
				return memberInfo{name: name, gossip: fmt.Sprintf("10.1.%d.%d:7946", i/250, i%250),
					meta: meta{grpcAddr: fmt.Sprintf("10.1.%d.%d:8081", i/250, i%250), ready: true, place: placementOf(cfg.Ring)}, state: StateAlive}
			}
			node.roster.m = map[string]memberInfo{}
			for i := range n {
				m := member(i)
				node.roster.m[m.name] = m
			}
			node.rebuild()
			lim := bucket.Limit{Limit: 1000, WindowMS: 60_000, Algorithm: bucket.SlidingWindow}
			now := node.now().UnixNano()
			tbl := node.ring.Table()
			for i, kept := 0, 0; kept < tc.keys; i++ {
				k := writeback.Key{Name: "bench", Key: fmt.Sprint("user:", i)}
				h := keyHash(k)
				if o, _ := tbl.Owner(h); o.Name != node.name {
					continue
				}
				if _, err := node.cache.Decide(h, k, lim, 1, now); err != nil {
					b.Fatal(err)
				}
				kept++
			}
			extra := member(n)
			i := 0
			for b.Loop() {
				if i%2 == 0 {
					node.roster.m[extra.name] = extra
				} else {
					delete(node.roster.m, extra.name)
				}
				i++
				node.rebuild()
				select {
				case job := <-node.handoffs:
					node.runHandoff(job)
				default:
				}
			}
		})
	}
}
