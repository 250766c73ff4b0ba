package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestPartitionEachSideEnforcesThenMerges cuts a 4-node cluster into two
// halves (gossip and peer traffic), checks that each side keeps answering
// and enforces the limit on its own (at most sides × limit), heals it and
// checks that the rings merge, the rejoin is counted, and the key's newest
// version wins.
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

func TestPartitionEachSideEnforcesThenMerges(t *testing.T) {
	t.Parallel()
	net := NewMemNetwork()
	nodes, filters := startFiltered(t, net, "n", 4, func(cfg *Config) {
		cfg.Now = FixedClock(t0)
		// Cross-side forwards are refused at once; within a side a forward
		// that timed out would be decided twice, so leave room for -race.
		cfg.ForwardTimeout = 500 * time.Millisecond
	})
	t.Cleanup(net.Heal)
	WaitRings(t, nodes)

	left, right := nodes[:2], nodes[2:]
	cut := func(a, b []*Node) {
		for _, x := range a {
			for _, y := range b {
				filters[indexOf(nodes, x)].Block(y.GossipAddr())
			}
		}
	}
	cut(left, right)
	cut(right, left)
	net.Partition(Refuse, []string{memAddr(0), memAddr(1)}, []string{memAddr(2), memAddr(3)})
	start := time.Now()
	WaitRings(t, left)
	WaitRings(t, right)
	t.Logf("partition: each side saw only itself after %v", time.Since(start).Round(time.Millisecond))

	// Each side admits the limit on its own: sides × limit in all.
	total := 0
	for _, side := range [][]*Node{left, right} {
		for i := range 15 {
			o := check1(side[i%2], req("api", "split", 1, 10))
			if o.Err != "" {
				t.Fatalf("check during the partition: %+v", o)
			}
			if o.Allowed() {
				total++
			}
		}
	}
	if total != 20 {
		t.Fatalf("two sides admitted %d with limit 10, want 10 each", total)
	}

	// Heal: the rings merge, the rejoin is counted and logged.
	for _, f := range filters {
		f.UnblockAll()
	}
	net.Heal()
	start = time.Now()
	WaitRings(t, nodes)
	t.Logf("healed: every node saw all four after %v", time.Since(start).Round(time.Millisecond))
	WaitFor(t, 10*time.Second, "a rejoin counted", func() bool {
		for _, n := range nodes {
			if n.Status().Rejoins > 0 {
				return true
			}
		}
		return false
	})
	// The newest version of the key wins: it is at its limit everywhere.
	for i, n := range nodes {
		if o := check1(n, req("api", "split", 1, 10)); o.Err != "" || o.Allowed() {
			t.Fatalf("after the heal, node %d answered %+v, want over the limit", i, o)
		}
	}
}

func indexOf(nodes []*Node, n *Node) int {
	for i, m := range nodes {
		if m == n {
			return i
		}
	}
	return -1
}
