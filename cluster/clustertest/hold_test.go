package clustertest

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
)

func holdReq(key string, op check.LeaseOp, limit int64, ttl time.Duration, id int64) check.Request {
	return check.Request{Name: LimitName, Key: key, Op: op, LeaseID: id, Limit: bucket.Limit{Limit: limit, WindowMS: ttl.Milliseconds()}}
}

func hold(t *testing.T, c *Cluster, via string, r check.Request) check.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CheckTimeout)
	defer cancel()
	o := c.Member(via).Node.Hold(ctx, r)
	if o.Err != "" {
		t.Fatalf("%v via %s: %s", r.Op, via, o.Err)
	}
	return o
}

// At most the limit of holders at once, cluster-wide, whichever nodes
// they ask; a release frees a slot at once, a lease whose TTL passes
// without a renew frees it then, a renew keeps it; the leases outlive
// their owner's crash (the replica holds them) and renew there; and a
// client's check cannot ask a lease operation.
func TestConcurrencyLimitAcrossTheCluster(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(Formed(t, Options{}, "n1", "n2", "n3"))
		c := r.C
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		key := OwnedBy(c, "n1", "n1", "jobs", 1)[0]
		const limit, ttl = 3, 10 * time.Second
		var leases []int64
		for i, via := range []string{"n1", "n2", "n3", "n2", "n3"} {
			o := hold(t, c, via, holdReq(key, check.OpAcquire, limit, ttl, 0))
			if got := o.LeaseID != 0; got != (i < limit) {
				t.Fatalf("acquire %d via %s: %+v", i+1, via, o)
			}
			if o.LeaseID != 0 {
				leases = append(leases, o.LeaseID)
			} else if o.RetryAfterMS <= 0 || o.Owner != "n1" {
				t.Fatalf("a refused acquire: %+v", o)
			}
		}
		if o := hold(t, c, "n3", holdReq(key, check.OpRelease, limit, ttl, leases[0])); o.LeaseID != leases[0] || o.Remaining != 1 {
			t.Fatalf("release: %+v", o)
		}
		if o := hold(t, c, "n3", holdReq(key, check.OpRelease, limit, ttl, leases[0])); o.LeaseID != 0 {
			t.Fatalf("a second release of one lease: %+v", o)
		}
		o := hold(t, c, "n2", holdReq(key, check.OpAcquire, limit, ttl, 0))
		if o.LeaseID == 0 {
			t.Fatalf("acquire after a release: %+v", o)
		}
		leases = append(leases[1:], o.LeaseID)
		// A client's check cannot.
		rq := holdReq(key, check.OpAcquire, limit, ttl, 0)
		if got := checkVia(t, c, "n2", rq); got.Err == "" {
			t.Fatalf("a client's check with a lease operation: %+v", got)
		}

		// Six seconds on, the first two leases are renewed, the third is
		// not: four seconds later it has expired and its slot is free.
		time.Sleep(6 * time.Second)
		for _, id := range leases[:2] {
			if o := hold(t, c, "n3", holdReq(key, check.OpRenew, limit, ttl, id)); o.LeaseID != id {
				t.Fatalf("renew %d: %+v", id, o)
			}
		}
		time.Sleep(4*time.Second + time.Millisecond)
		if o := hold(t, c, "n2", holdReq(key, check.OpRenew, limit, ttl, leases[2])); o.LeaseID != 0 {
			t.Fatalf("renew of an expired lease: %+v", o)
		}
		o = hold(t, c, "n1", holdReq(key, check.OpAcquire, limit, ttl, 0))
		if o.LeaseID == 0 || o.Remaining != 0 {
			t.Fatalf("acquire into the expired lease's slot: %+v", o)
		}
		leases[2] = o.LeaseID

		// The owner crashes once its holders are replicated.
		crashReplicated(t, c, "n1")
		if o := hold(t, c, "n2", holdReq(key, check.OpAcquire, limit, ttl, 0)); o.LeaseID != 0 {
			t.Fatalf("after the owner's crash, a fourth holder: %+v", o)
		}
		if o := hold(t, c, "n3", holdReq(key, check.OpRenew, limit, ttl, leases[0])); o.LeaseID != leases[0] {
			t.Fatalf("renew at the new owner: %+v", o)
		}
	})
}

// Twenty acquirers at once through three nodes on a limit of five: exactly
// five hold a lease.
func TestConcurrentAcquiresHoldExactlyTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(Formed(t, Options{}, "n1", "n2", "n3"))
		c := r.C
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		const limit, callers = 5, 20
		got := make(chan int64, callers)
		for i := range callers {
			via := []string{"n1", "n2", "n3"}[i%3]
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), CheckTimeout)
				defer cancel()
				o := c.Member(via).Node.Hold(ctx, holdReq("crowd", check.OpAcquire, limit, time.Minute, 0))
				if o.Err != "" {
					t.Errorf("via %s: %s", via, o.Err)
				}
				got <- o.LeaseID
			}()
		}
		held := map[int64]bool{}
		for range callers {
			if id := <-got; id != 0 {
				held[id] = true
			}
		}
		if len(held) != limit {
			t.Fatalf("%d distinct leases held of a limit of %d", len(held), limit)
		}
	})
}

// With the owner unreachable and no replica, the serve policy decides a
// lease operation on this node's own holders record, as it decides a
// check from its own counter: an acquire gets a lease, its release ends
// it, and the key's counter is not touched. (The policy used to decide
// every item as a check of its hits: an acquire was refused, a release
// found nothing held.)
func TestServePolicyDecidesLeaseOperations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{Configure: func(cfg *cluster.Config) {
			cfg.OwnerUnavailable = cluster.OwnerUnavailableServe
			cfg.Ring.ReplicationFactor = 1 // no replica to fail over to
		}}, "n1", "n2")
		key := OwnedBy(c, "n1", "n2", "served", 1)[0]
		c.Peers.Cut(c.Member("n1").PeerAddr, c.Member("n2").PeerAddr, cluster.Refuse)
		o := hold(t, c, "n1", holdReq(key, check.OpAcquire, 2, time.Minute, 0))
		if o.LeaseID == 0 || o.Owner != "n1" || o.Remaining != 1 {
			t.Fatalf("acquire under the serve policy: %+v", o)
		}
		if r := hold(t, c, "n1", holdReq(key, check.OpRelease, 2, time.Minute, o.LeaseID)); r.LeaseID != o.LeaseID {
			t.Fatalf("release under the serve policy: %+v", r)
		}
		if got, err := c.Check("n1", key, 10, 0); err != nil || got.Remaining != 10 {
			t.Fatalf("the key's counter after the lease operations: %+v, %v", got, err)
		}
	})
}
