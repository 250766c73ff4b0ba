package clustertest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// A key's replica answers for its owner as soon as the owner stops
// answering, before the failure detector has noticed anything: a forward
// to the owner that fails (Refuse) or hangs (Blackhole) goes to the
// replica within the forward timeout (plus the network's hold of the two
// calls), and the replica decides from the copy it holds, so that exactly
// the limit is admitted across the failure. The nodes keep the default
// forward timeout, and the time a check takes is the bubble's, so the
// bound is exact.
func TestFailoverToReplicaBeforeDetection(t *testing.T) {
	for name, fault := range map[string]cluster.Fault{"refuse": cluster.Refuse, "blackhole": cluster.Blackhole} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := NewRunner(Formed(t, Options{}, "n1", "n2", "n3"))
				c := r.C
				// Keys that n1 owns, checked through n2 and n3.
				keys := OwnedBy(c, "n1", "n1", "k", 20)
				// Past the move windows of the formation, so that no check
				// below pulls its key first.
				if err := r.pastMoveWindow(); err != nil {
					t.Fatal(err)
				}
				const limit, before = 10, 6
				for _, k := range keys {
					o, err := c.Check("n2", k, limit, before)
					if err != nil || o.Owner != "n1" || o.Decision.Remaining != limit-before {
						t.Fatalf("%s: %+v, %v", k, o, err)
					}
				}
				if err := c.Member("n1").Node.ReplicateNow(context.Background()); err != nil {
					t.Fatal(err)
				}
				// n1 stops answering; memberlist has not noticed yet.
				for _, from := range []string{"n2", "n3"} {
					c.Peers.Cut(c.Member(from).PeerAddr, c.Member("n1").PeerAddr, fault)
				}
				// A failover waits for the forward to the owner (refused
				// after its delivery's hold, or timed out), then for one
				// call to the replica: the forward timeout and at most two
				// holds of the seeded delivery.
				timeout := cluster.DefaultConfig().ForwardTimeout + 2*DeliverySpread
				t.Logf("bound on a check: forward timeout %v + 2 × delivery spread %v = %v", cluster.DefaultConfig().ForwardTimeout, DeliverySpread, timeout)
				var failovers uint64
				for _, k := range keys {
					admitted := 0
					for i := range limit {
						via := []string{"n2", "n3"}[i%2]
						start := time.Now()
						o, err := c.Check(via, k, limit, 1)
						if err != nil {
							t.Fatal(err)
						}
						if took := time.Since(start); took > timeout {
							t.Fatalf("%s via %s took %v, more than the bound %v", k, via, took, timeout)
						}
						if o.Owner == "n1" {
							t.Fatalf("%s via %s: decided by the owner that does not answer: %+v", k, via, o)
						}
						if o.Allowed() {
							admitted++
						}
					}
					if admitted != limit-before {
						t.Fatalf("%s: %d admitted after the owner failed, want exactly %d (%d replicated of %d)", k, admitted, limit-before, before, limit)
					}
				}
				for _, name := range []string{"n2", "n3"} {
					failovers += c.Member(name).Node.Status().Failovers
				}
				if failovers == 0 {
					t.Fatal("no failover counted")
				}
				if st := c.Member("n1").Node.Status(); st.Pauses > 0 {
					t.Fatalf("n1 noticed %d pauses", st.Pauses)
				}
			})
		})
	}
}

// After a replication round, a key's owner and its replica hold its count,
// and no other node does.
func TestReplicasHoldTheOwnersCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		owner := c.Member("n1").Node
		key := OwnedBy(c, "n1", "n1", "k", 1)[0]
		const hits = 7
		if o, err := c.Check("n2", key, 100, hits); err != nil || o.Owner != "n1" {
			t.Fatalf("%+v, %v", o, err)
		}
		if err := owner.ReplicateNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		h := ring.Hash(LimitName, key)
		reps := owner.Ring().Replicas(h, nil)
		if len(reps) != 2 || reps[0].Name != "n1" {
			t.Fatalf("replicas %v", reps)
		}
		now := time.Now().UnixNano()
		for _, name := range c.Up() {
			rec, ok, err := c.Member(name).Node.Cache().Get(h, writeback.Key{Name: LimitName, Key: key}, now)
			holds := name == reps[0].Name || name == reps[1].Name
			if err != nil || ok != holds || (ok && rec.State.Count != hits) {
				t.Fatalf("%s (owner or replica: %v) holds %+v, ok %v, err %v", name, holds, rec, ok, err)
			}
		}
	})
}

// With no replica to fail over to, a check whose owner does not answer is
// decided by the node asked, as the owner-unavailable policy says: serve
// (admitted from its own count) or deny (refused). It is answered within
// the forward timeout, whether the owner refuses the call or never
// answers it, and the failed forward is counted.
func TestOwnerUnavailable(t *testing.T) {
	for _, policy := range []cluster.OwnerUnavailable{cluster.OwnerUnavailableServe, cluster.OwnerUnavailableDeny} {
		for name, fault := range map[string]cluster.Fault{"refuse": cluster.Refuse, "blackhole": cluster.Blackhole} {
			t.Run(fmt.Sprint(policy, "/", name), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					c := Formed(t, Options{Configure: func(cfg *cluster.Config) {
						cfg.OwnerUnavailable = policy
						cfg.Ring.ReplicationFactor = 1 // no replica to fail over to
					}}, "n1", "n2")
					key := OwnedBy(c, "n1", "n2", "k", 1)[0]
					c.Peers.Cut(c.Member("n1").PeerAddr, c.Member("n2").PeerAddr, fault)
					start := time.Now()
					o, err := c.Check("n1", key, 10, 1)
					if took, timeout := time.Since(start), cluster.DefaultConfig().ForwardTimeout; took > timeout {
						t.Fatalf("the check took %v, more than the forward timeout %v", took, timeout)
					}
					if err != nil || o.Owner != "n1" {
						t.Fatalf("answer %+v, %v; want a decision by n1", o, err)
					}
					switch policy {
					case cluster.OwnerUnavailableDeny:
						if o.Allowed() {
							t.Fatalf("the deny policy admitted: %+v", o)
						}
					case cluster.OwnerUnavailableServe:
						if !o.Allowed() || o.Decision.Remaining != 9 {
							t.Fatalf("the serve policy answered %+v", o)
						}
					}
					if c.Member("n1").Node.Status().ForwardErrors == 0 {
						t.Fatal("the failed forward was not counted")
					}
				})
			})
		}
	}
}

// abandoningPeers answers the first forward as an owner that gave up on
// it at the forward's deadline and got its answer back in time: undecided,
// with the abandoned error.
type abandoningPeers struct {
	cluster.Peers
	done atomic.Bool
}

func (p *abandoningPeers) Forward(ctx context.Context, addr string, reqs []check.Request, out []check.Outcome, movedTo []string) error {
	if p.done.CompareAndSwap(false, true) {
		for i := range out {
			out[i] = check.Outcome{Owner: "owner", Err: "check abandoned: " + context.DeadlineExceeded.Error()}
			movedTo[i] = ""
		}
		return nil
	}
	return p.Peers.Forward(ctx, addr, reqs, out, movedTo)
}

// An owner that abandoned a forwarded check (its settle outlasted the
// forward's deadline) decided nothing; when its answer still reaches the
// sender, the check fails over to the key's replica as after a timed-out
// forward, and the caller gets a decision, not the owner's abandonment
// (seen once on real hosts in a 2+3 partition: a check answered "check
// abandoned: context deadline exceeded").
func TestAbandonedForwardFailsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		abandon := &abandoningPeers{}
		c := Formed(t, Options{Peers: peersOf("n0", func(p cluster.Peers) cluster.Peers { abandon.Peers = p; return abandon })}, "n0", "n1", "n2")
		key := OwnedBy(c, "n0", "n1", "abandoned:", 1)[0]
		o, err := c.Check("n0", key, 10, 1)
		if err != nil || !o.Allowed() {
			t.Fatalf("answer %+v, %v; want a decision from the replica", o, err)
		}
		if !abandon.done.Load() {
			t.Fatal("the check was never forwarded to its owner")
		}
		if st := c.Member("n0").Node.Status(); st.Failovers == 0 {
			t.Errorf("no failover counted: %+v", st)
		}
	})
}
