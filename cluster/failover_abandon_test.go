package cluster

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/cluster/check"
)

// abandoningPeers answers the first forward as an owner that gave up on
// it at the forward's deadline and got its answer back in time: undecided,
// with the abandoned error.
type abandoningPeers struct {
	Peers
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
	t.Parallel()
	net := NewMemNetwork()
	wrapped := &abandoningPeers{}
	cfgs := make([]Config, 3)
	for i := range cfgs {
		cfgs[i] = NodeConfig(t, fmt.Sprintf("n%d", i), memAddr(i))
		cfgs[i].Now = FixedClock(t0)
	}
	nodes := StartNodes(t, cfgs, func(i int) Peers {
		if i == 0 {
			wrapped.Peers = net.Peers(memAddr(0))
			return wrapped
		}
		return net.Peers(memAddr(i))
	})
	for i, n := range nodes {
		net.Register(memAddr(i), n)
	}
	t.Cleanup(net.Heal)
	key := keysOwnedBy(nodes[0], "n1", 1)[0]
	o := check1(nodes[0], req("api", key, 1, 10))
	if o.Err != "" || !o.Allowed() {
		t.Fatalf("answer %+v, want a decision from the replica", o)
	}
	if st := nodes[0].Status(); st.Failovers == 0 {
		t.Errorf("no failover counted: %+v", st)
	}
}
