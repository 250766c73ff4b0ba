package cluster

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
)

// twoRegions starts regions a and b of k nodes each, on one MemNetwork
// (one gossip pool per region), on the test's clock.
func twoRegions(t *testing.T, k int, clock *atomic.Int64) (a, b []*Node, net *MemNetwork) {
	t.Helper()
	net = NewMemNetwork()
	addr := func(r string, i int) string { return fmt.Sprintf("mem-%s%d", r, i) }
	start := func(r, other string) []*Node {
		cfgs := make([]Config, k)
		var peers []string
		for i := range k {
			peers = append(peers, addr(other, i))
		}
		for i := range cfgs {
			cfgs[i] = NodeConfig(t, fmt.Sprintf("%s%d", r, i), addr(r, i))
			cfgs[i].Now = func() time.Time { return time.Unix(0, clock.Load()) }
			cfgs[i].Region = r
			cfgs[i].RegionPeers = map[string][]string{other: peers}
			// The test runs the sync rounds itself, on its clock
			// (syncAll); the loop runs one when first woken.
			cfgs[i].RegionSync = time.Hour
		}
		nodes := StartNodes(t, cfgs, func(i int) Peers { return net.Peers(addr(r, i)) })
		for i, n := range nodes {
			net.Register(addr(r, i), n)
		}
		return nodes
	}
	a, b = start("a", "b"), start("b", "a")
	t.Cleanup(net.Heal)
	return a, b, net
}

// TestGlobalLimitAcrossRegions: a global limit checked in two regions of
// three nodes at six times the limit: region b decides its checks from
// slices region a (the key's home) lends it, and every window admits at
// most the limit across both regions. Cut off from a, b decides from what
// it holds, then from its fallback share (half the limit): each window
// admits at most the limit plus the share. Healed, b asks a again and the
// windows are back at most at the limit.
func TestGlobalLimitAcrossRegions(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(t0.Truncate(time.Second).UnixNano())
	a, b, net := twoRegions(t, 3, &clock)
	const limit = 600
	lim := bucket.Limit{Limit: limit, WindowMS: 1000, Algorithm: bucket.FixedWindow, Global: true}
	var key string
	for i := 0; ; i++ {
		key = fmt.Sprintf("tenant:%d", i)
		if a[0].regions.home(ring.Hash("api", key)) == "a" {
			break
		}
	}
	r := bucket.Request{Name: "api", Key: key, Hits: 1, Limit: lim}
	type win struct{ a, b int64 }
	run := func(phase string, windows int) []win {
		ws := make([]win, windows)
		start := clock.Load()
		for ms := range windows * 1000 {
			clock.Store(start + int64(ms)*int64(time.Millisecond))
			for i := range 3 {
				if o := check1(a[i], r); o.Err != "" {
					t.Fatalf("%s, %d ms, region a: %s", phase, ms, o.Err)
				} else if o.Allowed() {
					ws[ms/1000].a++
				}
				if o := check1(b[i], r); o.Err != "" {
					t.Fatalf("%s, %d ms, region b: %s", phase, ms, o.Err)
				} else if o.Allowed() {
					ws[ms/1000].b++
				}
			}
			if ms%50 == 49 {
				for _, n := range b {
					n.regionSync() // a sync period of 50 ms of the test's clock
				}
			}
		}
		t.Logf("%s: admitted per window (a, b): %v", phase, ws)
		return ws
	}
	ws := run("joined", 4)
	var fromB int64
	for i, w := range ws {
		if w.a+w.b > limit {
			t.Errorf("joined, window %d: admitted %d+%d, more than the limit %d", i, w.a, w.b, limit)
		}
		fromB += w.b
	}
	if fromB == 0 {
		t.Fatalf("region b admitted nothing: no slice came from a")
	}

	// Cut b off from a.
	for _, x := range a {
		for _, y := range b {
			net.Cut(x.cfg.GRPCAddr, y.cfg.GRPCAddr, Refuse)
			net.Cut(y.cfg.GRPCAddr, x.cfg.GRPCAddr, Refuse)
		}
	}
	share := int64(limit / 2)
	ws = run("cut", 4)
	var fb uint64
	for _, n := range b {
		fb += n.Status().RegionFallback
	}
	for i, w := range ws {
		if bound := int64(limit) + share; w.a+w.b > bound {
			t.Errorf("cut, window %d: admitted %d+%d, more than the limit plus b's share, %d", i, w.a, w.b, bound)
		}
	}
	if last := ws[len(ws)-1]; last.b == 0 || last.b > share || fb == 0 {
		t.Errorf("cut: b admitted %d in the last window (%d fallback checks), want some and at most its share %d", last.b, fb, share)
	}
	net.Heal()
	ws = run("healed", 4)
	if w := ws[0]; w.a+w.b > int64(limit)+share {
		t.Errorf("healed, window 0 (b's fallback counted in it too): admitted %d+%d, more than the limit plus b's share", w.a, w.b)
	}
	for i, w := range ws[1:] {
		if w.a+w.b > limit {
			t.Errorf("healed, window %d: admitted %d+%d, more than the limit %d", i+1, w.a, w.b, limit)
		}
	}
	if ws[len(ws)-1].b == 0 {
		t.Errorf("healed: b admitted nothing in the last window")
	}
}
