package cluster

import (
	"context"
	"fmt"
	"io"
	"log"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestDuplicateNameRefused: a node that joins under a name a live member at
// another address already has refuses to join (Start fails and says which
// address has the name), decides nothing, and leaves the cluster as it was.
func TestDuplicateNameRefused(t *testing.T) {
	t.Parallel()
	nodes, net := memCluster(t, 2, nil)
	cfg := NodeConfig(t, "n1", memAddr(2))
	cfg.Now = FixedClock(t0)
	cfg.Join = []string{nodes[0].GossipAddr()}
	dup, err := New(cfg, net.Peers(memAddr(2)))
	if err != nil {
		t.Fatal(err)
	}
	net.Register(memAddr(2), dup)
	t.Cleanup(func() { dup.Shutdown(context.Background()) })
	err = dup.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), `"n1"`) || !strings.Contains(err.Error(), nodes[1].GossipAddr()) {
		t.Fatalf("Start = %v, want the name and %s", err, nodes[1].GossipAddr())
	}
	if dup.Ready() {
		t.Fatal("the refused node says it is ready")
	}
	// Whatever its ring says, the refused node decides and forwards
	// nothing: keys of either member get the refusal.
	for _, owner := range []string{"n0", "n1"} {
		key := keysOwnedBy(nodes[0], owner, 1)[0]
		if o := check1(dup, req("api", key, 1, 10)); !strings.Contains(o.Err, "already used") {
			t.Fatalf("a check of a key of %s on the refused node got %+v", owner, o)
		}
	}
	key := keysOwnedBy(nodes[0], "n1", 1)[0]
	for _, n := range nodes {
		ms := n.Ring().Table().Members()
		if len(ms) != 2 {
			t.Fatalf("%s's ring holds %v", n.Name(), ms)
		}
		for _, m := range ms {
			if m.Name == "n1" && m.Addr != memAddr(1) {
				t.Fatalf("%s routes n1 to %s", n.Name(), m.Addr)
			}
		}
	}
	if o := check1(nodes[0], req("api", key, 1, 10)); o.Err != "" || o.Owner != "n1" || !o.Allowed() {
		t.Fatalf("check through n0 after the refusal: %+v", o)
	}
	if err := dup.Shutdown(context.Background()); err != nil {
		t.Fatalf("shutting the refused node down: %v", err)
	}
	// Its shutdown announced nothing under the name: n1 is still alive.
	if s := memberState(nodes[0], "n1"); s != StateAlive {
		t.Fatalf("n1 is %q on n0 after the duplicate shut down", s)
	}
}

// TestDuplicateNameRefusedOnRetry: the same when the first join attempts
// fail and the join loop gets through later: Fatal delivers the error.
func TestDuplicateNameRefusedOnRetry(t *testing.T) {
	t.Parallel()
	net := NewMemNetwork()
	nodes, _ := startFiltered(t, net, "r", 2, func(*Config) {})
	WaitRings(t, nodes)
	cfg := NodeConfig(t, "r1", memAddr(2))
	nt, ft := filteredTransport(t)
	cfg.Transport, cfg.BindPort = ft, nt.GetAutoBindPort()
	ft.Block(nodes[0].GossipAddr())
	cfg.Join = []string{nodes[0].GossipAddr()}
	dup, err := New(cfg, net.Peers(memAddr(2)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dup.Shutdown(context.Background()) })
	if err := dup.Start(context.Background()); err != nil {
		t.Fatalf("Start with the seed unreachable: %v", err)
	}
	ft.UnblockAll()
	select {
	case err := <-dup.Fatal():
		if !strings.Contains(err.Error(), `"r1"`) {
			t.Fatalf("Fatal: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no fatal error after the seed became reachable")
	}
	if s := memberState(nodes[0], "r1"); s != StateAlive {
		t.Fatalf("r1 is %q on r0", s)
	}
}

// TestRestartAtNewAddressTakesTheName: a member declared dead comes back
// under its name at another gossip address (a container rescheduled with a
// new IP) and is in every ring again without waiting for the others to
// forget it.
func TestRestartAtNewAddressTakesTheName(t *testing.T) {
	t.Parallel()
	net := NewMemNetwork()
	nodes, filters := startFiltered(t, net, "a", 3, func(*Config) {})
	WaitRings(t, nodes)
	gone := nodes[2]
	// It stops answering (as after kill -9) until the others declare it dead.
	for i := range 2 {
		filters[i].Block(gone.GossipAddr())
		filters[2].Block(nodes[i].GossipAddr())
	}
	WaitFor(t, 30*time.Second, "a2 is dead on both others", func() bool {
		return memberState(nodes[0], "a2") == StateDead && memberState(nodes[1], "a2") == StateDead
	})
	cfg := NodeConfig(t, "a2", memAddr(3))
	FastFailureDetection(cfg.Config)
	back := StartNode(t, cfg, net.Peers(memAddr(3)), nodes[0].GossipAddr())
	net.Register(memAddr(3), back)
	if back.GossipAddr() == gone.GossipAddr() {
		t.Fatalf("the new process got the old address %s", back.GossipAddr())
	}
	WaitFor(t, 10*time.Second, "every ring routes a2 to its new address", func() bool {
		for _, n := range []*Node{nodes[0], nodes[1], back} {
			found := false
			for _, m := range n.Ring().Table().Members() {
				found = found || (m.Name == "a2" && m.Addr == memAddr(3))
			}
			if !found {
				return false
			}
		}
		return true
	})
}

// filteredTransport is a memberlist transport on a free loopback port
// whose traffic to chosen addresses can be blocked.
func filteredTransport(t *testing.T) (*memberlist.NetTransport, *FilterTransport) {
	t.Helper()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"}, BindPort: 0, Logger: log.New(io.Discard, "", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	return nt, NewFilterTransport(nt)
}

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
