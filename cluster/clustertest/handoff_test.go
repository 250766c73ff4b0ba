package clustertest

// Tests of handoffs: a node that released a key by a handoff takes it back
// only once the push has landed; a key released to another node is not
// handed off. (A handoff to the key's replica, and a graceful leave with
// several limits per key: membership_test.go.)

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/ring"
)

// holdReplicates holds every replicate call of the node it wraps, handoff
// pushes and replica copies alike, until release is closed or the call's
// context ends; every other call goes through.
type holdReplicates struct {
	cluster.Peers
	once    sync.Once
	pushed  chan struct{} // closed when the first handoff push is sent
	release chan struct{}
}

func (h *holdReplicates) Replicate(ctx context.Context, addr string, handoff bool, cs []bucket.Counter) (int, int, error) {
	if handoff {
		h.once.Do(func() { close(h.pushed) })
	}
	select {
	case <-h.release:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	return h.Peers.Replicate(ctx, addr, handoff, cs)
}

// A join moves a key from n1 to n2; n1 releases it and pushes its record
// to n2. A stand-in check at n1 while that push is still out takes the key
// back only once the push has landed: before, it pulled the key from n2,
// which had nothing yet, and decided from its own count; the push then
// landed with the count from before that decision, n2 adopted it, and the
// stand-in's admitted hit was no longer counted.
func TestReclaimWaitsForThePush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := &holdReplicates{pushed: make(chan struct{}), release: make(chan struct{})}
		c := Formed(t, Options{
			// No leases: every check is decided where the test sends it.
			Configure: func(cfg *cluster.Config) { cfg.HotKeyThreshold = 0 },
			// n2, the key's new owner, must hold no copy of it when the
			// stand-in pulls it there: n1's replica copies are held with
			// its pushes.
			Peers: peersOf("n1", func(p cluster.Peers) cluster.Peers { hold.Peers = p; return hold }),
		}, "n0", "n1")
		const limit, before = 10, 3
		keys := OwnedBy(c, "n1", "n1", "reclaim:", 40)
		for _, k := range keys {
			if got := admitted(t, c, "n1", k, limit, before); got != before {
				t.Fatalf("key %s: admitted %d of %d", k, got, before)
			}
		}
		if err := c.Add("n2"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-hold.pushed: // n1 released the moved keys and pushes them
		case <-time.After(10 * time.Second):
			t.Fatal("n1 pushed nothing to n2 within 10 s of the bubble's time after the join")
		}
		n1, n2 := c.Member("n1").Node, c.Member("n2").Node
		key := ""
		for _, k := range keys {
			if o, _ := n2.Ring().Owner(ring.Hash(LimitName, k)); o.Name == "n2" {
				key = k
				break
			}
		}
		if key == "" {
			t.Fatal("no key moved from n1 to n2")
		}
		r := Request(key, limit, 1)
		out, moved := make([]check.Outcome, 1), make([]string, 1)
		done := make(chan struct{})
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			n1.CheckStandIn(ctx, "sender", []check.Request{r}, nil, out, moved)
			close(done)
		}()
		// The push is held far longer than a pull and a decision take.
		time.Sleep(2 * time.Second)
		select {
		case <-done:
			t.Errorf("the stand-in at n1 decided while n1's push of the key to n2 was still out: %+v", out[0])
		default:
		}
		close(hold.release)
		<-done
		if !out[0].Allowed() || moved[0] != "" {
			t.Fatalf("stand-in at n1: %+v, moved to %q; want allowed", out[0], moved[0])
		}
		for start := time.Now(); n1.Status().HandedOff == 0; time.Sleep(10 * time.Millisecond) {
			if time.Since(start) > 10*time.Second {
				t.Fatal("n1's push did not land within 10 s of the bubble's time")
			}
		}
		// The owner takes the key back from n1 and counts the stand-in's
		// hit: before+1 counted, and this check's hit.
		o, err := c.Check("n2", key, limit, 1)
		if want := int64(limit - before - 2); err != nil || !o.Allowed() || o.Remaining != want {
			t.Fatalf("check at n2, the owner: %+v, %v; want allowed with remaining %d (%d hits before the join, the stand-in's and this one)", o, err, want, before)
		}
	})
}

// A key its owner had released to another node (X pulled it, and decided
// since) is not handed off when a join then moves it to a third node C:
// the owner's record is stale, and C would take it as settled and never
// pull, losing X's decisions (seen under load in TestScaleOutThenInUnderLoad:
// two nodes joining one after the other, the first one's view lagging,
// 21-27 admitted for a limit of 20). C pulls on first touch instead, and
// the owner's answer names X.
func TestReleasedKeyIsNotHandedOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n0", "n1", "n2")
		keys := OwnedBy(c, "n0", "n0", "released:", 40)
		for _, k := range keys {
			if got := admitted(t, c, "n0", k, 10, 3); got != 3 {
				t.Fatalf("key %s: %d of 3 admitted", k, got)
			}
			// n1 pulls the key with release and decides 2 more hits.
			pulled := pullFrom(t, c, "n0", "n1", "n1", k)
			if pulled.State.Count != 3 {
				t.Fatalf("key %s: pulled %+v", k, pulled)
			}
			decideTwoFromPulled(t, c, "n1", pulled)
		}
		n0 := c.Member("n0").Node
		before := n0.Status().HandedOff
		if err := c.Add("n3"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		var moved []string
		for _, k := range keys {
			if o, _ := c.Member("n3").Node.Ring().Owner(ring.Hash(LimitName, k)); o.Name == "n3" {
				moved = append(moved, k)
			}
		}
		if len(moved) == 0 {
			t.Fatalf("the join moved none of n0's %d keys to n3", len(keys))
		}
		if got := n0.Status().HandedOff - before; got != 0 {
			t.Errorf("n0 handed off %d counters of keys it had released to n1", got)
		}
		for _, k := range moved {
			o, err := c.Check("n3", k, 10, 1)
			if err != nil || o.Owner != "n3" || o.Remaining != 10-5-1 {
				t.Fatalf("key %s at n3: %+v, %v; want decided by n3 with n1's 5 hits counted (remaining 4)", k, o, err)
			}
		}
		t.Logf("%d of %d released keys moved to n3, none handed off, each decided with the hits made where it was released", len(moved), len(keys))
	})
}
