package cluster_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/clustertest"
	"github.com/sluicehq/sluice/ring"
)

// hotCluster returns a settled cluster of n0, n1 and n2 whose peer calls
// take no time: the checks a test sends at one moment of the bubble's
// clock are all decided at that moment.
func hotCluster(t *testing.T) (*clustertest.Cluster, []*cluster.Node) {
	t.Helper()
	c := clustertest.Formed(t, clustertest.Options{}, "n0", "n1", "n2")
	c.Peers.SeedDelivery(0, 0)
	return c, nodesOf(c, "n0", "n1", "n2")
}

// sleepUntil lets the bubble's time run until at, which must not have
// passed: each step of a test that paces its checks by the clock takes no
// time of it.
func sleepUntil(t *testing.T, at time.Time) {
	t.Helper()
	d := time.Until(at)
	if d < 0 {
		t.Fatalf("the clock is %v past %v: a step took time", -d, at)
	}
	time.Sleep(d)
}

// TestHotKeyLeases drives one key through all three nodes at three times
// its limit, 1 check per node per millisecond, for each leasable
// algorithm, and checks docs/leases.md's promises: the nodes that do not
// own the key decide most of their own checks from leases; no aligned
// window (fixed and sliding windows) admits more than the limit, and a
// token bucket never more than its burst plus its refill; every full
// window admits at least 95 % of the limit; and a rebuild that moves no
// key, while a node holds a lease, revokes none.
func TestHotKeyLeases(t *testing.T) {
	t.Parallel()
	const limit, windowMS = 1000, 1000
	for _, alg := range []bucket.Algorithm{bucket.FixedWindow, bucket.SlidingWindow, bucket.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { hotKeyLeases(t, alg, limit, windowMS) })
		})
	}
}

func hotKeyLeases(t *testing.T, alg bucket.Algorithm, limit, windowMS int64) {
	_, nodes := hotCluster(t)
	key := "tenant:7"
	owner, _ := nodes[0].Ring().Owner(ring.Hash("api", key))
	r := check.Request{Name: "api", Key: key, Hits: 1, Limit: bucket.Limit{Limit: limit, WindowMS: windowMS, Algorithm: alg}}
	const windows = 5
	admitted := make([]int64, windows)
	decidedBy := map[string]int{}                              // "asked→decided"
	start := time.Now().Truncate(time.Second).Add(time.Second) // a window's start
	var total int64
	rebuilt := false // rebuildKeepsLeases was run
	for ms := range windows * windowMS {
		sleepUntil(t, start.Add(time.Duration(ms)*time.Millisecond))
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
			if !rebuilt && o.Owner == n.Name() && n.Name() != owner.Name && n.Status().LeasedKeys > 0 {
				rebuilt = true
				rebuildKeepsLeases(t, nodes)
			}
			if alg == bucket.TokenBucket {
				// burst (the limit) plus the refill since the start.
				if bound := limit + ms*limit/windowMS; total > bound {
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
		if floor := limit * 95 / 100; a < floor {
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

	if !rebuilt {
		t.Error("no node decided from a lease it held")
	}
}

// rebuildKeepsLeases rebuilds every node's ring while a node holds a
// lease: a rebuild that moves no key revokes no lease, and the owner still
// counts its grants.
func rebuildKeepsLeases(t *testing.T, nodes []*cluster.Node) {
	t.Helper()
	for _, n := range nodes {
		before := n.Status()
		n.Rebuild()
		if st := n.Status(); st.LeasedKeys != before.LeasedKeys || st.LeasesRevoked != before.LeasesRevoked {
			t.Errorf("%s after a rebuild that moved nothing: %d keys leased (%d before), %d leases revoked (%d before)",
				n.Name(), st.LeasedKeys, before.LeasedKeys, st.LeasesRevoked, before.LeasesRevoked)
		}
	}
}

// TestUnspentLeasesComeBack: when a hot key cools down, the hits its
// holders did not spend go back to the owner once their leases end, and
// the owner takes them back into the counter: afterwards the key has
// exactly the limit less the checks admitted left — as if no lease had
// been granted — for each leasable algorithm. Without returns it would
// have the unspent hits less.
func TestUnspentLeasesComeBack(t *testing.T) {
	t.Parallel()
	for _, alg := range []bucket.Algorithm{bucket.FixedWindow, bucket.SlidingWindow, bucket.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { unspentLeasesComeBack(t, alg) })
		})
	}
}

func unspentLeasesComeBack(t *testing.T, alg bucket.Algorithm) {
	// A window of a minute: the whole test is in one window; the bucket
	// refills 1 token a second.
	const limit, windowMS = 60_000, 60_000
	_, nodes := hotCluster(t)
	key := "tenant:8"
	owner, _ := nodes[0].Ring().Owner(ring.Hash("api", key))
	var ownerNode *cluster.Node
	for _, n := range nodes {
		if n.Name() == owner.Name {
			ownerNode = n
		}
	}
	lim := bucket.Limit{Limit: limit, WindowMS: windowMS, Algorithm: alg}
	if alg == bucket.TokenBucket {
		lim.Limit, lim.Burst = 60, limit // 1 token a second, a burst of the limit
	}
	r := check.Request{Name: "api", Key: key, Hits: 1, Limit: lim}
	start := time.Now().Truncate(time.Minute).Add(time.Minute) // a window's start
	tables := make([]*ring.Table, len(nodes))                  // to see a ring change
	for i, n := range nodes {
		tables[i] = n.Ring().Table()
	}
	var admitted int64
	for ms := range 400 {
		sleepUntil(t, start.Add(time.Duration(ms)*time.Millisecond))
		for _, n := range nodes {
			if n == ownerNode {
				continue
			}
			if o := check1(n, r); o.Err != "" || !o.Allowed() {
				t.Fatalf("%d ms, through %s: %+v", ms, n.Name(), o)
			}
			admitted++
		}
	}
	var unused uint64
	for _, n := range nodes {
		unused += n.Status().LeaseGrantTokens
	}
	if unused == 0 {
		t.Fatal("no lease was granted")
	}
	// The key cools down: nobody checks it; a second after the start
	// every lease (at most LeaseTTL) has ended and its return is done.
	sleepUntil(t, start.Add(time.Second))
	synctest.Wait()
	for _, n := range nodes {
		if st := n.Status(); st.LeasedKeys > 0 || st.LeaseReturnsDone < st.LeaseReturning {
			t.Fatalf("%s, 600 ms after the last check: %d keys leased, %d of %d hits of ended leases returned", n.Name(), st.LeasedKeys, st.LeaseReturnsDone, st.LeaseReturning)
		}
	}
	peek := r
	peek.Hits = 0
	left := check1(ownerNode, peek).Remaining
	var unspent, gave, revoked uint64
	for _, n := range nodes {
		st := n.Status()
		unspent += st.LeaseUnused
		gave += st.LeaseGaveBack
		revoked += st.LeasesRevoked
	}
	t.Logf("admitted %d; %d leased hits left unspent, %d given back (%d leases revoked); %d left of %d", admitted, unspent, gave, revoked, left, limit)
	// The limit less the checks admitted and the unspent hits that did
	// not come back. The bucket refilled one token in the test's second;
	// the windows did not move.
	want := limit - admitted - int64(unspent-gave)
	if alg == bucket.TokenBucket {
		want = min(limit, want+1)
	}
	if left != want {
		t.Fatalf("%d left of the limit %d after %d admitted, %d unspent and %d given back, want %d", left, limit, admitted, unspent, gave, want)
	}
	// And every unspent hit came back: no ring changed (a change revokes
	// the leases held and makes the owner forget its grants).
	for i, n := range nodes {
		if n.Ring().Table() != tables[i] {
			t.Fatalf("%s's ring changed during the test", n.Name())
		}
	}
	if unspent == 0 || gave != unspent {
		t.Fatalf("%d unspent leased hits, %d given back (%d leases revoked): want some, and all of them back", unspent, gave, revoked)
	}
}
