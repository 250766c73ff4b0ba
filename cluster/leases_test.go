package cluster

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
)

// TestHotKeyLeases drives one key through all three nodes at three times
// its limit, 1 check per node per millisecond of a clock the test moves,
// for each leasable algorithm, and checks docs/leases.md's promises: the
// nodes that do not own the key decide most of their own checks from
// leases; no aligned window (fixed and sliding windows) admits more than
// the limit, and a token bucket never more than its burst plus its refill;
// every full window admits at least 95 % of the limit; and a membership
// change revokes every lease.
func TestHotKeyLeases(t *testing.T) {
	t.Parallel()
	const limit, windowMS = 1000, 1000
	for _, alg := range []bucket.Algorithm{bucket.FixedWindow, bucket.SlidingWindow, bucket.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			var clock atomic.Int64
			clock.Store(t0.Truncate(time.Second).UnixNano())
			nodes, _ := memCluster(t, 3, func(c *Config) {
				c.Now = func() time.Time { return time.Unix(0, clock.Load()) }
			})
			key := "tenant:7"
			owner, _ := nodes[0].Ring().Owner(ring.Hash("api", key))
			r := bucket.Request{Name: "api", Key: key, Hits: 1, Limit: bucket.Limit{Limit: limit, WindowMS: windowMS, Algorithm: alg}}
			const windows = 5
			admitted := make([]int64, windows)
			decidedBy := map[string]int{} // "asked→decided"
			start := clock.Load()
			var total int64
			for ms := range windows * windowMS {
				now := start + int64(ms)*int64(time.Millisecond)
				clock.Store(now)
				for _, n := range nodes {
					o := check1(n, r)
					if o.Err != "" {
						t.Fatalf("%d ms, through %s: %s", ms, n.Name(), o.Err)
					}
					if !o.Allowed() {
						continue
					}
					admitted[ms/windowMS]++
					total++
					decidedBy[n.Name()+"→"+o.Owner]++
					if alg == bucket.TokenBucket {
						// burst (the limit) plus the refill since the start.
						if bound := limit + int64(ms)*limit/windowMS; total > bound {
							t.Fatalf("%d ms: token bucket admitted %d, bound %d", ms, total, bound)
						}
					}
				}
			}
			t.Logf("owner %s; admitted per window %v; decided (asked→decider) %v", owner.Name, admitted, decidedBy)
			for i, a := range admitted {
				if alg != bucket.TokenBucket && a > limit {
					t.Errorf("window %d admitted %d, more than the limit %d", i, a, limit)
				}
				// The token bucket's first window also spends its burst.
				if floor := int64(limit * 95 / 100); a < floor {
					t.Errorf("window %d admitted %d, under 95 %% of the limit (%d)", i, a, floor)
				}
			}
			leased := 0
			for _, n := range nodes {
				if n.Name() == owner.Name {
					continue
				}
				own, byOwner := decidedBy[n.Name()+"→"+n.Name()], decidedBy[n.Name()+"→"+owner.Name]
				if own <= byOwner {
					t.Errorf("%s decided %d of its admitted checks from leases and its owner %d: leases are not doing the work", n.Name(), own, byOwner)
				}
				leased += own
			}
			var grants uint64
			for _, n := range nodes {
				st := n.Status()
				grants += st.LeaseGrants
				if n.Name() != owner.Name && st.LeaseDecisions == 0 {
					t.Errorf("%s: no lease decision counted: %+v", n.Name(), st)
				}
			}
			t.Logf("%d leases granted; %d admitted checks decided from them", grants, leased)

			// A membership change revokes every lease.
			for _, n := range nodes {
				if n.Status().LeasedKeys > 0 {
					n.rebuild()
					if st := n.Status(); st.LeasedKeys != 0 || st.LeasesRevoked == 0 {
						t.Errorf("%s after a rebuild: %d keys leased, %d leases revoked", n.Name(), st.LeasedKeys, st.LeasesRevoked)
					}
				}
			}
		})
	}
}
