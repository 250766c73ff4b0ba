package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// holdPull lets the first releasing pull to one address reach it (the key
// is released there) and holds its answer until release is closed.
type holdPull struct {
	Peers
	to       string
	once     sync.Once
	answered chan struct{} // closed when the held pull has its answer
	release  chan struct{}
}

func (h *holdPull) Pull(ctx context.Context, addr string, keys []bucket.Counter, release bool, ttl time.Duration, ans []keymove.PullAnswer) error {
	err := h.Peers.Pull(ctx, addr, keys, release, ttl, ans)
	if addr != h.to || !release {
		return err
	}
	held := false
	h.once.Do(func() { held = true; close(h.answered) })
	if held {
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

// Two nodes that each took the other for the node a key was released to
// pull it back from each other at the same moment: n0 (a stand-in for the
// key, which it had released to n1) pulls it from n1, releasing it there,
// and n1 (its owner, now refused by its cache) pulls it from n0 before
// n0's pull is back. Only one of them may then decide the key: n1 took
// n0's state and decides it; n0 must not lift the release n1's pull set
// while its own was out. Before, n0 lifted it, and both decided from the
// same count (seen under load in TestScaleOutThenInUnderLoad: a leaving
// node and the key's new owner, 21 admitted for a limit of 20).
func TestCrossedPullsLeaveOneDecider(t *testing.T) {
	t.Parallel()
	net := NewMemNetwork()
	hold := &holdPull{Peers: net.Peers(memAddr(0)), to: memAddr(1), answered: make(chan struct{}), release: make(chan struct{})}
	cfgs := []Config{NodeConfig(t, "n0", memAddr(0)), NodeConfig(t, "n1", memAddr(1))}
	for i := range cfgs {
		cfgs[i].Now = FixedClock(t0)
		cfgs[i].HotKeyThreshold = 0 // no leases: each check is decided where the test sends it
	}
	nodes := StartNodes(t, cfgs, func(i int) Peers {
		if i == 0 {
			return hold
		}
		return net.Peers(memAddr(i))
	})
	for i, n := range nodes {
		net.Register(memAddr(i), n)
	}
	WaitRings(t, nodes)
	n0, n1 := nodes[0], nodes[1]
	const limit = 5
	key := keysOwnedBy(n1, "n1", 1)[0]
	if got := admit(t, n1, key, limit-1, limit); got != limit-1 {
		t.Fatalf("admitted %d of %d", got, limit-1)
	}
	// n0 had released the key to n1 (n1 pulled it from there).
	ans := make([]keymove.PullAnswer, 1)
	n0.Pull(context.Background(), n1.Name(), memAddr(1), []bucket.Counter{{Name: "api", Key: key}}, true, time.Hour, ans)
	if !n0.Cache().Fenced(ring.Hash("api", key), writeback.Key{Name: "api", Key: key}, t0.UnixNano()) {
		t.Fatal("n0 did not release the key")
	}

	// n0 stands in for the key: it pulls it back from n1, and that pull's
	// answer is held.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	standIn := make([]check.Outcome, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n0.CheckStandIn(ctx, n1.Name(), []check.Request{req("api", key, 1, limit)}, nil, standIn, make([]string, 1))
	}()
	select {
	case <-hold.answered:
	case <-done:
		t.Fatalf("the stand-in check ended without pulling the key from n1: %+v", standIn[0])
	case <-ctx.Done():
		t.Fatal("n0 never pulled the key from n1")
	}
	// n1 checks the key: its cache refuses (released to n0), so it pulls
	// it back from n0 and decides.
	owner := check1(n1, req("api", key, 1, limit))
	if owner.Err != "" {
		t.Fatalf("n1's check: %s", owner.Err)
	}
	close(hold.release)
	<-done
	admitted := 0
	for _, o := range []check.Outcome{owner, standIn[0]} {
		if o.Err == "" && o.Allowed() {
			admitted++
		}
	}
	t.Logf("n1 (owner): allowed %v; n0 (stand-in): allowed %v, err %q", owner.Allowed(), standIn[0].Allowed(), standIn[0].Err)
	if admitted != 1 {
		t.Fatalf("%d of the two crossing checks admitted with %d of %d left; want 1 (both decided from the same count)", admitted, 1, limit)
	}
}
