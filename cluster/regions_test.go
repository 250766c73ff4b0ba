package cluster_test

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/clustertest"
	"github.com/sluicehq/sluice/ring"
)

// twoRegions forms regions a (a0, a1, a2) and b (b0, b1, b2), one gossip
// pool each, on one peer network whose calls take no time (each region
// names the other's nodes as its RegionPeers), and returns their nodes.
func twoRegions(t *testing.T) (c *clustertest.Cluster, a, b []*cluster.Node) {
	t.Helper()
	names := func(r string) []string { return []string{r + "0", r + "1", r + "2"} }
	c = clustertest.New(t, clustertest.Options{Configure: func(cfg *cluster.Config) {
		r, other := cfg.Name[:1], "b"
		if r == "b" {
			other = "a"
		}
		var peers []string
		for _, name := range names(other) {
			peers = append(peers, clustertest.PeerAddr(name))
		}
		cfg.Region, cfg.RegionPeers = r, map[string][]string{other: peers}
		// The test runs the sync rounds itself, on the bubble's clock;
		// the loop runs one when first woken.
		cfg.RegionSync = time.Hour
	}})
	for _, r := range []string{"a", "b"} {
		ns := names(r)
		if err := c.Add(ns[0]); err != nil {
			t.Fatal(err)
		}
		if err := c.AddMany(ns[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Settle(); err != nil {
		t.Fatal(err)
	}
	c.Peers.SeedDelivery(0, 0)
	return c, nodesOf(c, names("a")...), nodesOf(c, names("b")...)
}

// homedIn returns a key of name "api" whose home region is r, as n sees
// it.
func homedIn(n *cluster.Node, r string) string {
	for i := 0; ; i++ {
		if key := fmt.Sprintf("tenant:%d", i); n.HomeRegion("api", key) == r {
			return key
		}
	}
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
	synctest.Test(t, func(t *testing.T) {
		c, a, b := twoRegions(t)
		const limit = 600
		lim := bucket.Limit{Limit: limit, WindowMS: 1000, Algorithm: bucket.FixedWindow, Global: true}
		key := homedIn(a[0], "a")
		r := check.Request{Name: "api", Key: key, Hits: 1, Limit: lim}
		type win struct{ a, b int64 }
		// run checks through every node once a millisecond for windows
		// whole windows, from the next window's start.
		run := func(phase string, windows int) []win {
			ws := make([]win, windows)
			start := time.Now().Truncate(time.Second).Add(time.Second)
			for ms := range windows * 1000 {
				sleepUntil(t, start.Add(time.Duration(ms)*time.Millisecond))
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
						n.RegionSync() // a sync period of 50 ms
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
				ax, by := c.Member(x.Name()).PeerAddr, c.Member(y.Name()).PeerAddr
				c.Peers.Cut(ax, by, cluster.Refuse)
				c.Peers.Cut(by, ax, cluster.Refuse)
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
		c.Peers.Heal()
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
	})
}

// TestRegionSlicesComeBack: the hits of a slice a region did not spend go
// back to the key's home when the slice ends, and the home takes them back
// into the counter: afterwards the key has exactly what it would have had
// without the slices (a token bucket of 6,000 refilled one token a second:
// the burst less the checks admitted, plus the refill).
func TestRegionSlicesComeBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, a, b := twoRegions(t)
		const burst = 6000
		lim := bucket.Limit{Limit: 60, WindowMS: 60_000, Burst: burst, Algorithm: bucket.TokenBucket, Global: true}
		key := homedIn(a[0], "a")
		r := check.Request{Name: "api", Key: key, Hits: 1, Limit: lim}
		start := time.Now().Truncate(time.Second).Add(time.Second)
		tables := make([]*ring.Table, len(a)) // to see a ring change at home
		for i, n := range a {
			tables[i] = n.Ring().Table()
		}
		var admitted int64
		for ms := range 300 {
			sleepUntil(t, start.Add(time.Duration(ms)*time.Millisecond))
			for _, n := range b {
				if check1(n, r).Allowed() {
					admitted++
				}
			}
			if ms%50 == 49 {
				for _, n := range b {
					n.RegionSync()
				}
			}
		}
		if admitted == 0 {
			t.Fatal("region b admitted nothing")
		}
		// The key cools down: two more rounds (a region asks from its
		// demand of the last two), then, once every slice (at most 1 s)
		// has ended, one that gives back what is left.
		for _, at := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
			sleepUntil(t, start.Add(at))
			for _, n := range b {
				n.RegionSync()
			}
		}
		for _, n := range append(append([]*cluster.Node{}, a...), b...) {
			if p := n.Status().Pauses; p > 0 {
				t.Fatalf("%s noticed %d pauses", n.Name(), p)
			}
		}
		var lent, took uint64
		var owner *cluster.Node
		for _, n := range a {
			st := n.Status()
			lent += st.RegionLent
			took += st.LeaseTookBack
			if st.RegionLent > 0 {
				owner = n
			}
		}
		if owner == nil {
			t.Fatal("region a lent nothing")
		}
		peek := r
		peek.Hits = 0
		left := check1(owner, peek).Remaining
		// The bucket refills a token a second from its first grant, in the
		// test's first 300 ms: 3.7 to 4 s before the peek, 3 or 4 tokens.
		lo, hi := burst-admitted+3, burst-admitted+4
		t.Logf("b admitted %d; a lent %d and took back %d; %d left of %d", admitted, lent, took, left, burst)
		for i, n := range a {
			if n.Ring().Table() != tables[i] {
				// The home would forget its grants, whose hits would not
				// come back.
				t.Fatalf("%s's ring changed during the test", n.Name())
			}
		}
		if took == 0 || uint64(admitted)+took != lent {
			t.Fatalf("lent %d, admitted %d, took back %d: want every unspent hit back", lent, admitted, took)
		}
		if left < lo || left > hi {
			t.Fatalf("%d left after %d admitted and the slices returned, want %d to %d", left, admitted, lo, hi)
		}
	})
}

// TestRegionSettingsValidated: a node's region settings are refused when
// they name no region, a malformed one, its own as another's, a region
// without addresses, or a fallback share above 1.
func TestRegionSettingsValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		region string
		peers  map[string][]string
		share  float64
		want   string
	}{
		{"", map[string][]string{"b": {"x:1"}}, 0, "without a region"},
		{"Bad", nil, 0, `region "Bad"`},
		{"a", map[string][]string{"a": {"x:1"}}, 0, "own region"},
		{"a", map[string][]string{"b": nil}, 0, `"b" has no address`},
		{"a", map[string][]string{"b_c": {"x:1"}}, 0, `region "b_c"`},
		{"a", nil, 1.5, "fallback share"},
	} {
		cfg := cluster.NodeConfig(t, "n", "mem-0")
		cfg.Region, cfg.RegionPeers, cfg.RegionFallbackShare = tc.region, tc.peers, tc.share
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error with %q", tc, err, tc.want)
		}
	}
}
