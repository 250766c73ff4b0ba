package cluster

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// A settle for a check this node decides as the key's owner leaves the
// key unsettled when no node asked told it anything of the key while one
// that did not answer is still a member: an empty answer from a node
// asked without release (a replica of the key that may not hold it yet)
// tells nothing, while the previous owner's (asked with release) tells
// that there is nothing. In a 100-node deploy a new owner settled a key on
// such an empty answer while the previous owner's replica, holding a
// count of 17, answered too late: it decided the key from nothing.
func TestSettleNeedsAnAnswerThatTellsSomething(t *testing.T) {
	t.Parallel()
	nodes, net := memCluster(t, 3, nil)
	x := nodes[0]
	WaitRings(t, nodes)
	net.Cut(memAddr(0), memAddr(1), SlowPulls) // memAddr(1)'s pulls fail as past their deadline
	k := writeback.Key{Name: "api", Key: "settle"}
	h := ring.Hash(k.Name, k.Key)
	for _, tc := range []struct {
		name     string
		asked    []keymove.Holder
		deferred bool
	}{
		{"a member asked with release did not answer; an empty answer without release", []keymove.Holder{{Addr: memAddr(1), Release: true}, {Addr: memAddr(2)}}, true},
		{"a member asked without release did not answer; an empty answer without release", []keymove.Holder{{Addr: memAddr(1)}, {Addr: memAddr(2)}}, true},
		{"a member did not answer; the empty answer of one asked with release", []keymove.Holder{{Addr: memAddr(1)}, {Addr: memAddr(2), Release: true}}, false},
	} {
		s := ownership.NewSettle(x.cfg.GRPCAddr, true)
		s.Add(h, k, tc.asked...)
		deferred := x.settleBatch(context.Background(), s, nil, t0.UnixNano())
		if got := len(deferred) > 0; got != tc.deferred {
			t.Errorf("%s: deferred %v, want %v", tc.name, got, tc.deferred)
		}
		// A stand-in's or a failover's settle never defers.
		s = ownership.NewSettle(x.cfg.GRPCAddr, false)
		s.Add(h, k, tc.asked...)
		if deferred := x.settleBatch(context.Background(), s, nil, t0.UnixNano()); len(deferred) > 0 {
			t.Errorf("%s, not as the owner: deferred", tc.name)
		}
	}
	// Once the member answers, nothing is deferred.
	net.Heal()
	s := ownership.NewSettle(x.cfg.GRPCAddr, true)
	s.Add(h, k, keymove.Holder{Addr: memAddr(1), Release: true}, keymove.Holder{Addr: memAddr(2)})
	if deferred := x.settleBatch(context.Background(), s, nil, t0.UnixNano()); len(deferred) > 0 {
		t.Error("every node answered: deferred")
	}
}
