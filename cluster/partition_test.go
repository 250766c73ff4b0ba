package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/ring"
)

// startFiltered starts k nodes named prefix0… with fast failure detection,
// gossiping over real loopback sockets through a FilterTransport each (to
// cut gossip) and calling each other through net (to cut peer calls).
func startFiltered(t *testing.T, net *MemNetwork, prefix string, k int, tweak func(*Config)) ([]*Node, []*FilterTransport) {
	t.Helper()
	filters := make([]*FilterTransport, k)
	var nodes []*Node
	for i := range k {
		cfg := NodeConfig(t, fmt.Sprint(prefix, i), memAddr(i))
		FastFailureDetection(cfg.Config)
		tweak(&cfg)
		var nt *memberlist.NetTransport
		nt, filters[i] = filteredTransport(t)
		cfg.Transport = filters[i]
		cfg.BindPort = nt.GetAutoBindPort()
		seed := ""
		if i > 0 {
			seed = nodes[0].GossipAddr()
		}
		n := StartNode(t, cfg, net.Peers(memAddr(i)), seed)
		net.Register(memAddr(i), n)
		nodes = append(nodes, n)
	}
	return nodes, filters
}

func indexOf(nodes []*Node, n *Node) int {
	for i, m := range nodes {
		if m == n {
			return i
		}
	}
	return -1
}

// TestServeDecisionsBeforeDetectionCountOnTheirSide: under the serve
// policy, a check whose owner and replicas cannot be reached is decided on
// the caller's side of the partition — before the partition is detected
// too. Checks of one key entering through both nodes of a side then reach
// one stand-in (sideStandIn), and when the partition is detected and a
// node of that side becomes the key's owner, it pulls that count before
// deciding (settleBatch asks every member when the key's holders are
// gone). So the side admits at most the limit in all. Before, each entry
// node decided from its own cache and the new owner started from nothing
// (16 admitted for a limit of 10), or, once it pulled, from the larger of
// the two counts (13).
// Long on purpose: one story (partition, checks on each side, detection).
func TestServeDecisionsBeforeDetectionCountOnTheirSide(t *testing.T) {
	t.Parallel()
	net := NewMemNetwork()
	nodes, filters := startFiltered(t, net, "s", 4, func(cfg *Config) {
		cfg.Now = FixedClock(t0)
		cfg.ForwardTimeout = 500 * time.Millisecond
		// No replication within the test: the decisions must reach the
		// new owner through its settle, not through a replication that
		// may come after it has decided (and the fixed window's merge
		// keeps the larger count, not the sum).
		cfg.ReplicationInterval = time.Hour
	})
	t.Cleanup(net.Heal)
	WaitRings(t, nodes)
	left, right := nodes[:2], nodes[2:]
	onRight := func(name string) bool { return name == right[0].Name() || name == right[1].Name() }

	// Keys whose owner and replicas are all on the right.
	const limit, early = 10, 3 // early hits through each left node
	tbl := nodes[0].Ring().Table()
	var keys []string
	var reps []ring.Member
	for i := 0; len(keys) < 40 && i < 10_000; i++ {
		k := fmt.Sprint("k", i)
		reps = tbl.Replicas(ring.Hash("api", k), reps[:0])
		all := len(reps) > 0
		for _, r := range reps {
			all = all && onRight(r.Name)
		}
		if all {
			keys = append(keys, k)
		}
	}
	if len(keys) < 40 {
		t.Fatalf("found %d keys held only on the right, want 40", len(keys))
	}

	// Peer calls cut, gossip not yet: the left still sees the owners
	// alive; each key gets early hits through each left node.
	net.Partition(Refuse, []string{memAddr(0), memAddr(1)}, []string{memAddr(2), memAddr(3)})
	decidedBy := map[string]string{}
	for _, k := range keys {
		for _, entry := range left {
			o := check1(entry, fixedReq(k, early, limit))
			if o.Err != "" || !o.Allowed() || onRight(o.Owner) {
				t.Fatalf("key %s through %s before detection: %+v, want decided on the left", k, entry.Name(), o)
			}
			if d, ok := decidedBy[k]; ok && d != o.Owner {
				t.Errorf("key %s decided by %s and by %s before detection: one stand-in per side", k, d, o.Owner)
			}
			decidedBy[k] = o.Owner
		}
	}

	// Gossip cut too: each side sees only itself, and each key has an
	// owner on the left.
	for _, x := range left {
		for _, y := range right {
			filters[indexOf(nodes, x)].Block(y.GossipAddr())
			filters[indexOf(nodes, y)].Block(x.GossipAddr())
		}
	}
	WaitRings(t, left)
	WaitRings(t, right)

	// Through left[0], single hits until refused: the left side admits at
	// most limit in all, whichever of its nodes owns the key now.
	moved := 0
	for _, k := range keys {
		owner, _ := left[0].Ring().Table().Owner(ring.Hash("api", k))
		if owner.Name != decidedBy[k] {
			moved++
		}
		admitted := 2 * early
		for range limit {
			o := check1(left[0], fixedReq(k, 1, limit))
			if o.Err != "" {
				t.Fatalf("key %s after detection: %+v", k, o)
			}
			if o.Allowed() {
				admitted++
			}
		}
		if admitted > limit {
			t.Errorf("key %s (decided by %s before detection, owned by %s after): the left side admitted %d, limit %d",
				k, decidedBy[k], owner.Name, admitted, limit)
		}
	}
	t.Logf("%d keys, %d of them owned after detection by the node that had not decided them", len(keys), moved)
	if moved == 0 {
		t.Fatal("no key moved to the other node of the side: the test checks nothing")
	}
}

// fixedReq is req for the fixed window, an exact algorithm.
func fixedReq(key string, hits, limit int64) check.Request {
	r := req("api", key, hits, limit)
	r.Limit.Algorithm = bucket.FixedWindow
	return r
}
